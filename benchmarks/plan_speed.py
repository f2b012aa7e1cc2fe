"""Planning time and proven gap: the LP-first solver (the default) against the integer program
alone ("mip": SCIP, axis-by-axis descent first on a 2-D mesh), on the same problems.

Rows: the README demo's decoder on (dp=2, tp=2), GPT-2-124M on (dp=2, tp=4), a Llama-8B-shaped
model on 64 GPUs (dp=16, tp=4), a Llama-70B-shaped one on (dp=8, tp=8); h100-sxm, built on the
meta device where large. Each prints the end-to-end plan time (capture to plan, no cache), the
sharding solve's time, status and proven gap, and its objective beside the old path's (its own
plan time and gap). Targets: demo <= 3 s, every gap <= 1%, 70B <= 60 s. Last line:
`demo plan time: X.X s, worst gap: Y.Y%`.

    python benchmarks/plan_speed.py [--only demo,gpt2] [--work-limit 100000] [--skip-old]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import autopar  # noqa: E402
from autopar.ir.request import DEFAULT_WORK_LIMIT  # noqa: E402
from examples import gpt2  # noqa: E402
from examples.hf_zoo import llama3_shaped  # noqa: E402

CASES = {  # name: (label, build, mesh, planning options)
    "demo": ("demo decoder 29.5M", lambda: gpt2.make("demo"), "dp=2,tp=2", {}),
    "gpt2": ("GPT-2-124M", lambda: gpt2.make("gpt2-124m", device="meta"), "dp=2,tp=4", {}),
    "llama8b": ("Llama-8B-shaped", lambda: llama3_shaped("8b", batch=32, seq=4096), "dp=16,tp=4",
                {"optimizer": "adam-mixed"}),
    "llama70b": ("Llama-70B-shaped", lambda: llama3_shaped("70b", batch=8, seq=4096), "dp=8,tp=8",
                 {"optimizer": "adam-mixed"}),
}


def timed_plan(name: str, solver: str, work_limit: int):
    """(plan, seconds from capture to plan) with the cache off."""
    _, build, mesh, options = CASES[name]
    model, inputs = build()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # an unproven gap is printed below
        plan = autopar.plan(model, inputs, mesh=mesh, hardware="h100-sxm", solver=solver,
                            solver_work_limit=work_limit, cache=False, **options)
    return plan, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--work-limit", type=int, default=DEFAULT_WORK_LIMIT,
                        help="the solver's deterministic work limit per solve (autopar's default)")
    parser.add_argument("--skip-old", action="store_true", help="do not run the old path (mip) for comparison")
    args = parser.parse_args()
    names = args.only.split(",")
    print(f"{'model':<20} {'mesh':<11} {'plan':>7} {'solve':>7} {'status':<9} {'gap':>7} {'objective':>11} | "
          f"{'old plan':>8} {'old gap':>8} {'old objective':>13}  new/old")
    gaps, demo_time = [], None
    for name in names:
        label, _, mesh, _ = CASES[name]
        plan, seconds = timed_plan(name, "lp-first", args.work_limit)
        s = plan.solver
        gaps.append(s.gap)
        demo_time = seconds if name == "demo" else demo_time
        line = (f"{label:<20} {mesh:<11} {seconds:>6.1f}s {s.seconds:>6.1f}s {s.status:<9} {s.gap:>7.2%} "
                f"{s.objective_s * 1e3:>9.4f}ms |")
        if not args.skip_old:
            old, old_seconds = timed_plan(name, "mip", args.work_limit)
            o = old.solver
            line += (f" {old_seconds:>7.1f}s {o.gap:>8.2%} {o.objective_s * 1e3:>11.4f}ms  "
                     f"{s.objective_s / o.objective_s:.4f}")
        print(line, flush=True)
    demo = "n/a" if demo_time is None else f"{demo_time:.1f} s"
    print(f"demo plan time: {demo}, worst gap: {max(gaps):.1%}")


if __name__ == "__main__":
    main()
