"""End-to-end figures for the GPT-2-style decoder.

For three sizes planned on the meta device for a (dp=2, tp=2) mesh of H100s:
capture time, graph nodes, solver variables and strategies, solver time and
objective, predicted step time and number of collectives. Then, for the
(dp=2, tp=2) plan of the smallest size on 4 local CPU processes (gloo), the
emitted program's step time next to single-process eager's, in the same run.

    python benchmarks/e2e.py [--sizes tiny,demo,gpt2-124m] [--run-size small] [--steps 5]
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.capture.export import capture  # noqa: E402
from benchmarks.cost_accuracy import measure  # noqa: E402
from examples import gpt2  # noqa: E402


def plan_row(size: str, mesh: str, hardware: str) -> dict:
    model, inputs = gpt2.make(size, device="meta")
    start = time.perf_counter()
    program = capture(model, inputs)
    capture_s = time.perf_counter() - start
    start = time.perf_counter()
    plan = autopar.plan(model, inputs, mesh=mesh, hardware=hardware, cache=False)
    total_s = time.perf_counter() - start
    n_strategies = next(r.note for r in plan.history if r.name == "strategies")
    return {
        "size": size, "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
        "nodes": len(program.gm.graph.nodes), "capture_s": capture_s, "plan_s": total_s,
        "strategies": n_strategies.split(", ")[2].split()[0], "variables": plan.solver.n_variables,
        "solve_s": plan.solver.seconds, "status": plan.solver.status, "gap": plan.solver.gap,
        "objective_ms": plan.solver.objective_s * 1e3, "step_ms": plan.predicted.step_time_s * 1e3,
        "collectives": len(plan.collectives()),
    }


def eager_step_time(model, inputs, steps: int) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        opt.zero_grad()
        model(*inputs).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,demo,gpt2-124m")
    parser.add_argument("--mesh", default="dp=2,tp=2")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--run-size", default="small", help="size to run on local CPU processes")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    print(f"planning for mesh ({args.mesh}) on {args.hardware}, models on the meta device")
    cols = ["size", "params_M", "nodes", "capture_s", "strategies", "variables", "solve_s", "status", "gap",
            "objective_ms", "step_ms", "collectives", "plan_s"]
    print(" ".join(f"{c:>12}" for c in cols))
    for size in args.sizes.split(","):
        row = plan_row(size, args.mesh, args.hardware)
        print(" ".join(f"{row[c]:>12.3f}" if isinstance(row[c], float) else f"{row[c]:>12}" for c in cols),
              flush=True)

    from autopar.runtime.local_cluster import get_cluster

    model, inputs = gpt2.make(args.run_size)
    plan = autopar.plan(model, inputs, mesh=args.mesh, hardware=args.hardware, cache=False)
    mesh = autopar.Mesh.parse(args.mesh)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    cluster = get_cluster(mesh.size)
    parallel_s = max(t for t, _ in cluster.run(measure, buffer.getvalue(), inputs, plan.to_json(), args.steps))
    eager_s = eager_step_time(model, inputs, args.steps)
    print(f"\nCPU run of '{args.run_size}' on {mesh.size} local processes (gloo), median of {args.steps} steps "
          f"(forward + backward + SGD), {os.cpu_count()} cores:")
    print(f"  emitted program ({args.mesh}): {parallel_s * 1e3:9.2f} ms/step")
    print(f"  single-process eager:          {eager_s * 1e3:9.2f} ms/step  (torch threads {torch.get_num_threads()})")
    print(f"  ratio program/eager:           {parallel_s / eager_s:9.2f}")


if __name__ == "__main__":
    main()
