"""One row per Hugging Face zoo model planned on the meta device for 8 H100s.

Columns: graph nodes, distinct ops, the ops without a sharding rule before capture decomposes
them (``unruled``: what would be replicated without the decomposition) and the plan's fallback
ops after it (``fallback``), capture time, solve time (and status/gap), predicted step time,
and the share of FLOPs that run sharded. Last line: how many Core ATen overloads have a rule.

    python benchmarks/zoo.py [--mesh dp=2,tp=4] [--width 1024] [--seq 512] [--batch 8] [--time-limit 120]
"""
from __future__ import annotations

import argparse
import operator
import os
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.capture import export  # noqa: E402
from autopar.capture.export import capture  # noqa: E402
from autopar.ops.coverage import coverage  # noqa: E402
from autopar.ops.table import rule_for  # noqa: E402
from examples import hf_zoo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mesh", default="dp=2,tp=4")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--models", default=",".join([*hf_zoo.ZOO, *hf_zoo.MORE]))
    args = parser.parse_args()

    print(f"mesh ({args.mesh}) of {args.hardware}; 2 layers, width {args.width}, seq {args.seq}, batch {args.batch}")
    header = (f"{'model':<8} {'params':>8} {'nodes':>6} {'ops':>4} {'unruled':>7} {'fallback':>8} {'capture':>8} "
              f"{'solve':>8} {'status':>9} {'gap':>6} {'step':>10} {'sharded':>8}")
    print(header)
    fallbacks = {}
    for name in args.models.split(","):
        with torch.device("meta"):
            model, inputs = hf_zoo.make(name, **hf_zoo.sizes(name, args.width, args.seq, args.batch))
        start = time.perf_counter()
        program = capture(model, inputs)
        capture_s = time.perf_counter() - start
        ops = {str(n.target) for n in program.gm.graph.nodes if n.op == "call_function"}
        plan = autopar.plan(model, inputs, mesh=args.mesh, hardware=args.hardware,
                            solver_time_limit_s=args.time_limit, cache=False)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        unruled = unruled_ops(model, inputs)
        print(f"{name:<8} {params:>7.0f}M {len(program.gm.graph.nodes):>6} {len(ops):>4} {len(unruled):>7} "
              f"{len(plan.fallback_ops):>8} {capture_s:>7.1f}s {plan.solver.seconds:>7.1f}s "
              f"{plan.solver.status:>9} {plan.solver.gap:>6.1%} {plan.predicted.step_time_s * 1e3:>8.3f}ms "
              f"{plan.sharded_flops_fraction:>8.1%}", flush=True)
        if plan.fallback_ops:
            fallbacks[name] = plan.fallback_sites
    for name, sites in fallbacks.items():
        for op, modules in sites.items():
            print(f"fallback in {name}: {op} x{len(modules)} in {', '.join(sorted(set(modules)))}")
    print(str(coverage()).splitlines()[0])


def unruled_ops(model, inputs) -> set[str]:
    """The ops without a rule in the model's graph as capture would leave it without decomposing them."""
    with mock.patch.object(export, "capture_decompositions", lambda: {}):
        program = capture(model, inputs)
    return {str(n.target) for n in program.gm.graph.nodes if n.op == "call_function"
            and n.target is not operator.getitem and rule_for(n.target) is None}


if __name__ == "__main__":
    main()
