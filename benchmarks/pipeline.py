"""Pipelines: autopar's 3-D plans (pp x dp x tp searched with the stage partition, micro-batch
count and schedule) against Megatron-LM's 3-D layouts, in one cost model.

(a) What each schedule is predicted to take for the GPT-2-style decoder on a (pp=2, dp=2)
    mesh of this machine's calibrated CPU spec (``autopar calibrate``; h100-sxm without one):
    predicted step time and bubble fraction per schedule. The measured column needs autopar's
    per-stage programs, which are not emitted yet: the script says so instead of timing.
(b) Llama-70B- and GPT-3-175B-shaped models (width, heads, MLP, vocabulary and sequence; depth
    cut to --layers) on 64 H100s (8 nodes) at two global batch sizes: ``autopar.plan(mesh=64)``
    (every 1-D, 2-D and pp x (1-D, 2-D) mesh whose stages hold whole nodes) against the best of
    ``autopar.baselines``' Megatron 3-D layouts (``megatron-pp{p}-tp8-1f1b`` / ``-interleaved``:
    equal runs of layers, one sample per dp rank in a micro-batch), with each row's search time.

Last line: ``worst auto/best-3d-baseline ratio: X.XX``.

    python benchmarks/pipeline.py [--models llama-70b,gpt3-175b] [--batches 16,64] [--layers 8] [--time-limit 20]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import autopar  # noqa: E402
from autopar.baseline_plans import best  # noqa: E402
from autopar.capture.export import capture  # noqa: E402
from autopar.cost_models.hardware import calibrated_cpu_path  # noqa: E402
from autopar.planning.pipeline import plan_captured  # noqa: E402
from benchmarks.plan_quality import build  # noqa: E402
from examples import gpt2  # noqa: E402


def schedules_on_cpu() -> None:
    hardware = "cpu" if os.path.exists(calibrated_cpu_path()) else "h100-sxm"
    model, inputs = gpt2.make("demo")
    plan = autopar.plan(model, inputs, mesh="pp=2,dp=2", hardware=hardware, cache=False)
    print(f"(a) GPT-2-style decoder 'demo', mesh (pp=2, dp=2) on {hardware}: predicted per schedule")
    print(f"  {'schedule':<24} {'m':>3} {'v':>2} {'predicted':>11} {'bubble':>7}   measured")
    for c in plan.pipeline.candidates:
        if math.isfinite(c.step_time_s):
            print(f"  {c.schedule:<24} {c.microbatches:>3} {c.virtual:>2} {c.step_time_s * 1e3:>9.3f}ms "
                  f"{c.bubble_fraction:>7.1%}   not run: per-stage programs are not emitted yet")


def three_d_rows(models, batches, layers: int, time_limit: float) -> float:
    print(f"\n(b) 64 x h100-sxm (8 nodes), {layers} layers per model, Adam, budget 90% of 80 GB; predicted step times")
    print(f"  {'model':<10} {'batch':>5} {'auto mesh':<22} {'schedule':<26} {'auto':>10} {'best 3-D baseline':<30} "
          f"{'baseline':>10} {'ratio':>6} {'search':>7}")
    worst = 0.0
    for name in models:
        for batch in batches:
            model, inputs, heads = build(name, layers, batch)
            program = capture(model, inputs)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                start = time.perf_counter()
                auto = plan_captured(program, model, inputs, mesh=64, hardware="h100-sxm",
                                     solver_time_limit_s=time_limit)
                searched = time.perf_counter() - start
                plans = autopar.baselines(model, inputs, devices=64, hardware="h100-sxm", heads=heads,
                                          program=program, solver_time_limit_s=time_limit)
            three_d = {k: p for k, p in plans.items() if p.pipeline is not None}
            pl = auto.pipeline
            schedule = f"{pl.schedule} m={pl.microbatches}" + (f" v={pl.virtual}" if pl.virtual > 1 else "") \
                if pl else "-"
            row = f"  {name:<10} {batch:>5} {str(auto.device_mesh):<22} {schedule:<26} " \
                  f"{auto.predicted.step_time_s * 1e3:>8.1f}ms "
            if not three_d:
                print(row + "no 3-D baseline fits: " + "; ".join(f"{k}: {v[:60]}" for k, v in plans.skipped.items()
                                                                if "-pp" in k))
                continue
            base_name, base = best(three_d)
            ratio = auto.predicted.step_time_s / base.predicted.step_time_s
            worst = max(worst, ratio)
            print(row + f"{base_name:<30} {base.predicted.step_time_s * 1e3:>8.1f}ms {ratio:>6.3f} {searched:>6.0f}s",
                  flush=True)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama-70b,gpt3-175b")
    parser.add_argument("--batches", default="16,64", help="global batch sizes, in sequences")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver time limit per integer program")
    args = parser.parse_args()
    schedules_on_cpu()
    worst = three_d_rows(args.models.split(","), [int(b) for b in args.batches.split(",")], args.layers,
                         args.time_limit)
    print(f"worst auto/best-3d-baseline ratio: {worst:.2f}")


if __name__ == "__main__":
    main()
