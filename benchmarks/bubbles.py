"""K-FAC's work in a pipeline's bubbles (PipeFisher): step time of first-order training, of
K-FAC with its work after the step (unfilled) and with it placed in the bubbles (filled).

(a) Simulated: a BERT-Large-shaped model (24 layers, width 1024, sequence 128) on 8 pipeline
    stages of A100s, under 1F1B and the zero-bubble schedules; a GPT-shaped model (24 layers,
    width 2048, sequence 1024) on 64 H100s (pp=8 x dp=8). Plans made with optimizer="kfac"; the
    refresh period is the planner's (the shortest cycle, up to 10 steps, within 1% of the best step time).
(b) Measured on 4 CPU processes (pp=4): a GPT-2-style decoder's step (model call, backward,
    optimizer step) first-order (SGD on the same pipeline), K-FAC unfilled and K-FAC filled, medians
    of interleaved rounds, beside the planner's predictions (on this machine's calibrated CPU spec,
    ``autopar calibrate``; h100-sxm without one).
(c) Loss after N full-batch steps on an ill-conditioned regression (examples/ill_conditioned.py):
    K-FAC run pipelined (pp=2, gloo) against SGD and AdamW at the best learning rate of a grid.
(d) The greedy placement against the exact one (exhaustive search) on plans small enough for it:
    the greedy's gap in amortized step time.

Last line: ``kfac filled / first-order step time: X.XX`` (the worst row of (a)).

    python benchmarks/bubbles.py [--rounds 5] [--steps 30] [--skip-simulated] [--skip-measured]
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.cost_models.hardware import calibrated_cpu_path  # noqa: E402
from autopar.planning.bubbles import fill_bubbles  # noqa: E402
from autopar.planning.request import resolve  # noqa: E402
from autopar.runtime.local_cluster import get_cluster  # noqa: E402
from autopar.units import human_seconds  # noqa: E402
from examples import gpt2, ill_conditioned  # noqa: E402

SIMULATED = [  # (name, config, mesh, hardware, schedule, micro-batches)
    ("bert-large", gpt2.GPT2Config(vocab=30522, seq=128, layers=24, heads=16, width=1024, batch=128), "pp=8",
     "a100-sxm-80g", "1F1B", 16),
    ("bert-large", gpt2.GPT2Config(vocab=30522, seq=128, layers=24, heads=16, width=1024, batch=128), "pp=8",
     "a100-sxm-80g", "InterleavedZeroBubble", 16),
    ("bert-large", gpt2.GPT2Config(vocab=30522, seq=128, layers=24, heads=16, width=1024, batch=128), "pp=8",
     "a100-sxm-80g", "ZBVZeroBubble", 16),
    ("gpt-2.7b", gpt2.GPT2Config(vocab=50304, seq=1024, layers=24, heads=32, width=2048, batch=128), "pp=8,dp=8",
     "h100-sxm", "1F1B", 16),
    ("gpt-2.7b", gpt2.GPT2Config(vocab=50304, seq=1024, layers=24, heads=32, width=2048, batch=128), "pp=8,dp=8",
     "h100-sxm", "ZBVZeroBubble", 16),
]
CPU_MODEL = gpt2.GPT2Config(vocab=512, seq=64, layers=4, heads=4, width=256, batch=16)
CPU_MESH, CPU_MICROBATCHES = "pp=4", 8
CPU_SCHEDULES = ("1F1B", "InterleavedZeroBubble")


def simulated() -> float:
    print("(a) simulated, optimizer='kfac' (refresh period chosen by the planner)")
    print(f"{'model':<11} {'mesh':<10} {'schedule':<22} {'m':>3} {'refresh':>7} {'first-order':>12} {'unfilled':>10} "
          f"{'filled':>10} {'bubble before':>13} {'after':>7} {'filled/1st':>10} {'plan':>6}")
    worst = 0.0
    for name, config, mesh, hardware, schedule, m in SIMULATED:
        with torch.device("meta"):
            model = gpt2.GPT2(config)
            ids = torch.empty(config.batch, config.seq, dtype=torch.long)
        start = time.perf_counter()
        plan = autopar.plan(model, (ids, ids), mesh=mesh, hardware=hardware, schedule=schedule, microbatches=m,
                            optimizer="kfac", cache=False, solver_time_limit_s=30)
        took = time.perf_counter() - start
        f = plan.pipeline.fill
        ratio = f.step_filled_s / f.step_first_order_s
        worst = max(worst, ratio)
        print(f"{name:<11} {mesh:<10} {schedule:<22} {m:>3} {f.refresh:>7} {human_seconds(f.step_first_order_s):>12} "
              f"{human_seconds(f.step_unfilled_s):>10} {human_seconds(f.step_filled_s):>10} {f.bubble_before:>13.1%} "
              f"{f.bubble_after:>7.1%} {ratio:>10.3f} {took:>5.0f}s", flush=True)
    return worst


def measured(rounds: int) -> None:
    hardware = "cpu" if os.path.exists(calibrated_cpu_path()) else "h100-sxm"
    model, inputs = gpt2.make(CPU_MODEL)
    variants, predicted = {}, {}
    for schedule in CPU_SCHEDULES:
        plan = autopar.plan(model, inputs, mesh=CPU_MESH, hardware=hardware, schedule=schedule,
                            microbatches=CPU_MICROBATCHES, optimizer="kfac", cache=False)
        fill = plan.pipeline.fill
        request = resolve(CPU_MESH, hardware, optimizer="kfac", schedule=schedule, microbatches=CPU_MICROBATCHES,
                          inv_every=fill.refresh)
        unfilled = fill_bubbles(plan, request, into_bubbles=False)
        variants[schedule, "first-order"] = _with_fill(plan, None)
        variants[schedule, "kfac unfilled"] = _with_fill(plan, unfilled)
        variants[schedule, "kfac filled"] = plan
        predicted[schedule] = (fill.step_first_order_s, fill.step_unfilled_s, fill.step_filled_s, fill.refresh)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    timed = get_cluster(4).run(_time_variants, buffer.getvalue(), inputs,
                               {k: p.to_json() for k, p in variants.items()}, rounds)
    print(f"\n(b) GPT-2-style decoder ({CPU_MODEL.layers} layers, width {CPU_MODEL.width}, batch {CPU_MODEL.batch}) "
          f"on {CPU_MESH}, {CPU_MICROBATCHES} micro-batches, 4 CPU processes; medians of {rounds} interleaved rounds; "
          f"predicted on {hardware}")
    print(f"{'schedule':<22} {'refresh':>7} {'variant':<14} {'measured':>10} {'predicted':>10} {'vs first-order':>14}")
    for schedule in CPU_SCHEDULES:
        first = max(statistics.median(r[schedule, "first-order"]) for r in timed)
        for i, variant in enumerate(("first-order", "kfac unfilled", "kfac filled")):
            step = max(statistics.median(r[schedule, variant]) for r in timed)  # the slowest rank's step
            print(f"{schedule:<22} {predicted[schedule][3]:>7} {variant:<14} {human_seconds(step):>10} "
                  f"{human_seconds(predicted[schedule][i]):>10} {step / first:>13.2f}x")


def _with_fill(plan, fill):
    return dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, fill=fill))


def _time_variants(rank, world_size, model_bytes, inputs, plan_jsons: dict, rounds: int) -> dict:
    from autopar.check import rank_mesh_for
    from autopar.runtime.pipeline import PipelinedModule

    runs = {}
    for key, plan_json in plan_jsons.items():
        model = torch.load(io.BytesIO(model_bytes), weights_only=False)
        plan = autopar.Plan.from_json(plan_json)
        module = PipelinedModule(model, plan, rank_mesh_for(plan.mesh, plan.pipeline.pp), plan.emit("torch"))
        opt = (autopar.KFAC(module, lr=1e-3) if plan.pipeline.fill is not None else
               torch.optim.SGD([p for p in model.parameters() if not p.is_meta] or [torch.zeros(0)], lr=1e-3))
        runs[key] = (module, opt)
    times = {key: [] for key in runs}
    for i in range(rounds + 1):  # the first round warms up
        for key, (module, opt) in runs.items():
            torch.distributed.barrier()
            start = time.perf_counter()
            module(*inputs).backward()
            opt.step()
            opt.zero_grad()
            if i:
                times[key].append(time.perf_counter() - start)
    return times


def convergence(steps: int) -> None:
    model, inputs = ill_conditioned.make()
    sgd = min((ill_conditioned.loss_after(model, inputs,
                                          lambda p, lr=lr: torch.optim.SGD(p, lr=lr, momentum=0.9), steps), lr)
              for lr in ill_conditioned.SGD_LRS)
    adamw = min((ill_conditioned.loss_after(model, inputs, lambda p, lr=lr: torch.optim.AdamW(p, lr=lr), steps), lr)
                for lr in ill_conditioned.ADAMW_LRS)
    plan = autopar.plan(model, inputs, mesh="pp=2", schedule="1F1B", microbatches=4, optimizer="kfac", inv_every=1,
                        cache=False)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    from tests import pipeline_workers

    ranks = get_cluster(2).run(pipeline_workers.train_kfac, buffer.getvalue(), inputs, plan.to_json(), steps + 1,
                               ill_conditioned.KFAC_SETTINGS)
    print(f"\n(c) ill-conditioned regression (examples/ill_conditioned.py: 2 linear layers of width 16, condition "
          f"1e4, 128 rows), loss after {steps} full-batch steps (initial {ranks[0]['losses'][0]:.4f})")
    print(f"  K-FAC (pipelined, pp=2; {ill_conditioned.KFAC_SETTINGS}): {ranks[0]['losses'][-1]:.4f}")
    print(f"  AdamW (best lr of {ill_conditioned.ADAMW_LRS}: {adamw[1]}): {adamw[0]:.4f}")
    print(f"  SGD, momentum 0.9 (best lr of {ill_conditioned.SGD_LRS}: {sgd[1]}): {sgd[0]:.4f}")


def greedy_gap() -> None:
    from autopar.planning.bubbles import placement_problem
    from autopar.solvers.bubble_fill import exact

    print("\n(d) greedy vs exact placement, 2-layer linear chains (width 256, 4 micro-batches of 2 x 64 rows) on "
          "pp=2 of A100s, curvature every step")
    print(f"{'schedule':<22} {'items':>5} {'greedy':>10} {'exact':>10} {'gap':>7}")
    torch.manual_seed(0)
    chain = ill_conditioned.LinearChain(256, 2)
    inputs = (torch.randn(8, 64, 256), torch.randn(8, 64, 256))
    for schedule in ("GPipe", "1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"):
        plan = autopar.plan(chain, inputs, mesh="pp=2", hardware="a100-sxm-80g", schedule=schedule, microbatches=4,
                            optimizer="kfac", inv_every=1, cache=False)
        request = resolve("pp=2", "a100-sxm-80g", optimizer="kfac", schedule=schedule, microbatches=4, inv_every=1)
        problem, _ = placement_problem(plan, request, 1)
        greedy, best = problem.solve(), exact(problem.items, problem.gaps, problem.step_end_s, 1, problem.margin_s,
                                              problem.headroom_bytes)
        print(f"{schedule:<22} {len(problem.items):>5} {human_seconds(greedy.mean_step_s):>10} "
              f"{human_seconds(best.mean_step_s):>10} {greedy.mean_step_s / best.mean_step_s - 1:>7.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip-simulated", action="store_true")
    parser.add_argument("--skip-measured", action="store_true")
    args = parser.parse_args()
    worst = None if args.skip_simulated else simulated()
    if not args.skip_measured:
        measured(args.rounds)
    convergence(args.steps)
    greedy_gap()
    if worst is not None:
        print(f"kfac filled / first-order step time: {worst:.2f}")


if __name__ == "__main__":
    main()
