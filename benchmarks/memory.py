"""Per-device memory: the model's prediction against measurement, and the memory-time
curve of large models under shrinking budgets.

    python benchmarks/memory.py [--gpu-layers 2] [--skip-gpu]

1. GPU-shaped (planned on the meta device, 8 x h100-sxm, Adam): GPT-3 1.3B- and
   6.7B-shaped decoders (width, heads, sequence and vocabulary of the paper; the
   number of layers is --gpu-layers, since solve time grows with depth until
   layer clustering lands). For several budgets (a memory-time curve): the peak
   by category, the predicted step time and what recomputation adds to it.
2. Megatron check: the activations one layer keeps for backward (bf16, dropout,
   softmax attention written out, batch 1, one device) beside Korthikanti et al.
   2022's s*b*h*(34 + 5*a*s/h) bytes; and the recompute solver's time on a
   12-layer model (--solve-layers).
3. CPU (4 gloo processes, SGD): the GPT-2-style decoder planned under several
   budgets, with full recomputation, and as the ZeRO-3 baseline; predicted peak
   against the peak torch's MemTracker measures in each worker, and the error.

The last line reads ``worst peak-memory error: X.X%`` (CPU part).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.capture.export import capture  # noqa: E402
from autopar.capture.module_paths import module_paths  # noqa: E402
from autopar.errors import AutoparError  # noqa: E402
from autopar.lowering.memory import simulate  # noqa: E402
from autopar.lowering.schedule import schedule  # noqa: E402
from autopar.passes.recompute import build_problem  # noqa: E402
from autopar.solvers.recompute import memory_of, solve  # noqa: E402
from autopar.units import human_bytes, human_seconds  # noqa: E402
from examples import gpt2  # noqa: E402
from tests.workers import FAST  # noqa: E402

GPT3 = {  # Brown et al. 2020, Table 2.1: width, heads (sequence 2048, vocabulary padded to 51200)
    "gpt3-1.3b": (2048, 16),
    "gpt3-6.7b": (4096, 32),
}
SHORT = {"parameters": "param", "optimizer_state": "optim", "inputs": "input", "gradients": "grad",
         "activations": "act", "temporaries": "temp", "communication": "comm"}


def row(label: str, plan) -> str:
    p = plan.predicted
    parts = " ".join(f"{SHORT[k]} {human_bytes(v):>9}" for k, v in p.memory_bytes.items())
    return (f"  {label:<14} peak {human_bytes(p.peak_memory_bytes):>9}  step {p.step_time_s * 1e3:8.2f} ms  "
            f"recompute {p.recompute_s * 1e3:6.2f} ms  {parts}")


def gpu_curves(layers: int) -> None:
    for name, (width, heads) in GPT3.items():
        cfg = gpt2.GPT2Config(vocab=51200, seq=2048, layers=layers, heads=heads, width=width, batch=8)
        model, inputs = gpt2.make(cfg, device="meta")
        print(f"\n{name}-shaped, {layers} layers, batch 8 x 2048, 8 x h100-sxm (dp=8), Adam:")
        loose = autopar.plan(model, inputs, mesh="dp=8", hardware="h100-sxm", solver_time_limit_s=120, cache=False)
        print(row("no budget", loose))
        for share in (0.9, 0.75, 0.6, 0.45):
            budget = share * loose.predicted.peak_memory_bytes
            try:
                plan = autopar.plan(model, inputs, mesh="dp=8", hardware="h100-sxm", memory_budget=budget,
                                    solver_time_limit_s=120, cache=False)
                print(row(f"{share:.0%} budget", plan))
            except AutoparError as exc:
                print(f"  {share:.0%} budget    {exc}")
        full = autopar.plan(model, inputs, mesh="dp=8", hardware="h100-sxm", recompute="full", solver_time_limit_s=120,
                            cache=False)
        print(row("full recompute", full))


def recompute_solve_time(layers: int) -> None:
    """How long the recompute solver takes on a deep model (GPT-2-124M-shaped, dp=8)."""
    cfg = gpt2.GPT2Config(vocab=50304, seq=1024, layers=layers, heads=12, width=768, batch=8)
    model, inputs = gpt2.make(cfg, device="meta")
    plan = autopar.plan(model, inputs, mesh="dp=8", hardware="h100-sxm", recompute="none", cache=False)
    statements = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh)
    memory = simulate(statements, plan.graph, plan.strategies, plan.mesh, "adam")
    problem, _ = build_problem(statements, memory.during, plan.strategies)
    everything_kept = max(memory_of(problem, set()))
    start = time.perf_counter()
    least = solve(problem, None)
    print(f"\nRecompute solver, GPT-2-124M-shaped, {layers} layers, dp=8 ({problem.n} values, "
          f"{len(problem.fixed)} points): least memory ({least.memory / everything_kept:.0%} of all kept) "
          f"in {time.perf_counter() - start:.1f} s, {least.status}")
    for share in (0.5, 0.8):
        limit = least.memory + share * (everything_kept - least.memory)
        start = time.perf_counter()
        found = solve(problem, limit)
        print(f"  limit {share:.0%} of the way up: {time.perf_counter() - start:.1f} s, {found.status}, "
              f"+{human_seconds(found.seconds)}")


def megatron_check() -> None:
    """One layer's saved activations, from the memory model, beside Megatron's formula."""
    print("\nActivations one layer keeps for backward (bf16, dropout 0.1, batch 1, one device):")
    for name, (width, heads) in GPT3.items():
        s, b, h, a = 2048, 1, width, heads
        cfg = gpt2.GPT2Config(vocab=51200, seq=s, layers=2, heads=a, width=h, batch=b, megatron=True)
        model, inputs = gpt2.make(cfg, device="meta")
        model.to(torch.bfloat16)
        plan = autopar.plan(model, inputs, mesh="dp=1", hardware="h100-sxm", cache=False)
        paths = module_paths(capture(model, inputs))
        statements = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh)
        memory = simulate(statements, plan.graph, plan.strategies, plan.mesh, "adam")
        problem, names = build_problem(statements, memory.during, plan.strategies)
        kept = {problem.storage[v]: problem.storage_bytes[problem.storage[v]] for v, n in enumerate(names)
                if problem.first_use[v] is not None and paths.get(n, "").startswith("blocks.1.")}
        ours, formula = sum(kept.values()), s * b * h * (34 + 5 * a * s / h)
        print(f"  {name}-shaped layer: autopar {human_bytes(ours):>9}  Megatron formula {human_bytes(formula):>9}  "
              f"ratio {ours / formula:.3f}")


def cpu_accuracy() -> float:
    model, inputs = gpt2.make("tiny")
    print("\nGPT-2-style 'tiny' on 4 local processes (gloo), SGD: predicted vs measured peak per device")
    loose = autopar.plan(model, inputs, mesh="dp=4", hardware=FAST, optimizer="sgd", cache=False)
    worst = 0.0
    for share in (None, 0.9, 0.8, 0.75, 0.7, "full", "zero3"):
        budget = None if share in (None, "full", "zero3") else share * loose.predicted.peak_memory_bytes
        label = {None: "no budget", "full": "full recompute", "zero3": "ZeRO-3"}.get(share) or f"{share:.0%} budget"
        try:
            if share == "zero3":
                plan = autopar.baselines(model, inputs, devices=4, hardware=FAST, tp_degrees=[],
                                         optimizer="sgd")["zero3"]
            else:
                plan = loose if share is None else autopar.plan(
                    model, inputs, mesh="dp=4", hardware=FAST, optimizer="sgd", memory_budget=budget,
                    recompute="full" if share == "full" else "auto", cache=False)
        except AutoparError as exc:
            print(f"  {label}: {exc}")
            continue
        report = autopar.check(model, inputs, plan=plan, measure_memory=True)
        measured = max(report.peak_memory_bytes)
        predicted = plan.predicted.peak_memory_bytes
        error = abs(measured / predicted - 1)
        worst = max(worst, error)
        print(f"  {label:<14} predicted {human_bytes(predicted):>9}  measured {human_bytes(measured):>9}  "
              f"error {error:6.1%}  recompute {human_seconds(plan.predicted.recompute_s):>9} "
              f"({len(plan.recompute)} values)"
              f"  check {'OK' if report.ok else 'MISMATCH'}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-layers", type=int, default=2)
    parser.add_argument("--solve-layers", type=int, default=12, help="depth for the recompute solver timing")
    parser.add_argument("--skip-gpu", action="store_true", help="only the CPU measurement")
    args = parser.parse_args()
    if not args.skip_gpu:
        gpu_curves(args.gpu_layers)
        megatron_check()
        recompute_solve_time(args.solve_layers)
    worst = cpu_accuracy()
    print(f"worst peak-memory error: {100 * worst:.1f}%")


if __name__ == "__main__":
    main()
