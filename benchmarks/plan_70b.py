"""Planning time of a Llama-70B-shaped model on 8 nodes x 8 H100s, mesh (dp=8, tp=8).

80 layers, hidden 8192, 64 heads with 8 KV heads (GQA), MLP 28672, vocab 128256,
batch 8 x 4096 tokens, bf16 parameters with mixed-precision Adam (16 bytes per
parameter), built on the meta device (no memory). Prints the wall time
from capture to emitted source with each stage's share, then the solve time at 8
and at 80 layers (target ratio <= 3: clustered layers share variables), and last
`70B plan time: X.X s` (target <= 60 s on a 2-core machine).

    python benchmarks/plan_70b.py [--layers 80] [--short-layers 8] [--time-limit 60] [--mesh dp=8,tp=8]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import autopar  # noqa: E402
from examples.hf_zoo import llama3_shaped  # noqa: E402


def timed_plan(layers: int, mesh: str, time_limit: float):
    """(plan, [(stage, seconds)], total seconds, what capture copied): capture, each pass, emit."""
    model, inputs = llama3_shaped("70b", batch=8, seq=4096, layers=layers)
    marks, notes = [], []
    start = time.perf_counter()

    def progress(message: str) -> None:
        if message.startswith(("pass ", "naming")) and message.endswith(" ..."):
            marks.append(time.perf_counter())
        elif message.startswith("captured: "):
            notes.append(message)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the gap is printed below
        plan = autopar.plan(model, inputs, mesh=mesh, hardware="h100-sxm", solver_time_limit_s=time_limit,
                            optimizer="adam-mixed", progress=progress, cache=False)
    emit_start = time.perf_counter()
    plan.emit("torch")
    end = time.perf_counter()
    stages = [("capture", marks[0] - start), ("module paths", marks[1] - marks[0])] + \
        [(r.name, r.seconds) for r in plan.history]
    stages.append(("emit", end - emit_start))
    return plan, stages, end - start, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--short-layers", type=int, default=8)
    parser.add_argument("--mesh", default="dp=8,tp=8")
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver time limit per integer program")
    args = parser.parse_args()

    solve_s = {}
    for layers in (args.short_layers, args.layers):
        start = time.perf_counter()
        try:
            plan, stages, total, notes = timed_plan(layers, args.mesh, args.time_limit)
        except autopar.AutoparError as exc:
            total = time.perf_counter() - start
            print(f"\nLlama-70B-shaped, {layers} layers: no plan after {total:.1f} s: {exc}")
            solve_s[layers] = float("nan")
            continue
        solve_s[layers] = dict(stages)["solve_sharding"]
        print(f"\nLlama-70B-shaped, {layers} layers, mesh {plan.mesh} of h100-sxm: {total:.1f} s capture to source")
        for note in notes:
            print(f"  {note}")
        other = total - sum(s for _, s in stages)
        for name, seconds in stages + [("other (packaging the plan)", other)]:
            print(f"  {name:<28} {seconds:7.1f} s  {seconds / total:6.1%}")
        print(f"  solver: {plan.solver.backend} {plan.solver.status}, gap {plan.solver.gap:.2%}, "
              f"{plan.solver.n_variables} variables; predicted step {plan.predicted.step_time_s * 1e3:.1f} ms, "
              f"peak {plan.predicted.peak_memory_bytes / 1e9:.1f} GB per device")
        cluster = next((r.note for r in plan.history if r.name == "cluster_layers"), "")
        print(f"  clustering: {cluster}")
    ratio = solve_s[args.layers] / solve_s[args.short_layers]
    print(f"\nsolve time: {solve_s[args.short_layers]:.1f} s at {args.short_layers} layers, "
          f"{solve_s[args.layers]:.1f} s at {args.layers} layers (ratio {ratio:.2f}, target <= 3)")
    print(f"70B plan time: {total:.1f} s")


if __name__ == "__main__":
    main()
