"""Per-device memory: the model's prediction against measurement, and the memory-time
curve of large models under shrinking budgets.

    python benchmarks/memory.py [--gpu-layers 2] [--skip-gpu]

1. GPU-shaped (planned on the meta device, 8 x h100-sxm, Adam): GPT-3 1.3B- and
   6.7B-shaped decoders (width, heads, sequence and vocabulary of the paper; the
   number of layers is --gpu-layers, since solve time grows with depth until
   layer clustering lands). For several budgets: the peak by category and the
   predicted step time.
2. CPU (4 gloo processes, SGD): the GPT-2-style decoder planned under several
   budgets; predicted peak against the peak torch's MemTracker measures in each
   worker, and the error.

The last line reads ``worst peak-memory error: X.X%`` (CPU part).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.errors import AutoparError  # noqa: E402
from autopar.units import human_bytes  # noqa: E402
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
    return f"  {label:<14} peak {human_bytes(p.peak_memory_bytes):>9}  step {p.step_time_s * 1e3:8.2f} ms  {parts}"


def gpu_curves(layers: int) -> None:
    for name, (width, heads) in GPT3.items():
        cfg = gpt2.GPT2Config(vocab=51200, seq=2048, layers=layers, heads=heads, width=width, batch=8)
        model, inputs = gpt2.make(cfg, device="meta")
        print(f"\n{name}-shaped, {layers} layers, batch 8 x 2048, 8 x h100-sxm (dp=8), Adam:")
        loose = autopar.plan(model, inputs, mesh="dp=8", hardware="h100-sxm", solver_time_limit_s=120)
        print(row("no budget", loose))
        for share in (0.9, 0.75, 0.6):
            budget = share * loose.predicted.peak_memory_bytes
            try:
                plan = autopar.plan(model, inputs, mesh="dp=8", hardware="h100-sxm", memory_budget=budget,
                                    solver_time_limit_s=120)
                print(row(f"{share:.0%} budget", plan))
            except AutoparError as exc:
                print(f"  {share:.0%} budget    {exc}")
        print("  recompute overhead: 0 (recomputation is not planned yet)")


def cpu_accuracy() -> float:
    model, inputs = gpt2.make("tiny")
    print("\nGPT-2-style 'tiny' on 4 local processes (gloo), SGD: predicted vs measured peak per device")
    loose = autopar.plan(model, inputs, mesh="dp=4", hardware=FAST, optimizer="sgd")
    worst = 0.0
    for share in (None, 0.9, 0.8, 0.7):
        budget = None if share is None else share * loose.predicted.peak_memory_bytes
        try:
            plan = loose if budget is None else autopar.plan(model, inputs, mesh="dp=4", hardware=FAST,
                                                             optimizer="sgd", memory_budget=budget)
        except AutoparError as exc:
            print(f"  {'no' if share is None else f'{share:.0%}'} budget: {exc}")
            continue
        report = autopar.check(model, inputs, plan=plan, measure_memory=True)
        measured = max(report.peak_memory_bytes)
        predicted = plan.predicted.peak_memory_bytes
        error = abs(measured / predicted - 1)
        worst = max(worst, error)
        label = "no budget" if share is None else f"{share:.0%} budget"
        print(f"  {label:<11} predicted {human_bytes(predicted):>9}  measured {human_bytes(measured):>9}  "
              f"error {error:6.1%}  check {'OK' if report.ok else 'MISMATCH'}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-layers", type=int, default=2)
    parser.add_argument("--skip-gpu", action="store_true", help="only the CPU measurement")
    args = parser.parse_args()
    if not args.skip_gpu:
        gpu_curves(args.gpu_layers)
    worst = cpu_accuracy()
    print(f"worst peak-memory error: {100 * worst:.1f}%")


if __name__ == "__main__":
    main()
