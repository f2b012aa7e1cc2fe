"""How well the cost model predicts real step times: distinct plans of the GPT-2-style
decoder, each run on 4 local CPU processes (gloo), priced with a calibrated spec.

    autopar calibrate --out cpu.json          # once, about 2 minutes
    python benchmarks/cost_accuracy.py --hardware cpu.json [--size small] [--steps 5]

Plans differ by mesh and by pinned parameter layouts (to force layouts the solver
would not pick). Per plan it prints predicted vs measured step time, and the
bytes the plan's collectives move as predicted vs as counted by the runtime.
With ``--profile DIR`` it then runs the solver's own plan of each mesh under torch.profiler
(autopar.profile) and prints predicted against measured time per op class, the traces of both
in DIR (open them in ui.perfetto.dev).

The last line reads ``MAPE: X.X% spearman: Y.YY`` (step times).
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.cost_models.hardware import get_hardware  # noqa: E402
from autopar.errors import AutoparError  # noqa: E402
from autopar.runtime.local_cluster import get_cluster  # noqa: E402
from examples import gpt2  # noqa: E402


def variants(layers: int, world: int) -> list[tuple[str, dict]]:
    """(mesh, pins): the solver's own plans on each mesh, then layouts forced by pinning."""
    def pin_all(names, spec):
        return {n: spec for n in names}

    fc = [f"blocks.{i}.fc.weight" for i in range(layers)]
    out = [f"blocks.{i}.out.weight" for i in range(layers)]
    qkv = [f"blocks.{i}.attn.{p}.weight" for i in range(layers) for p in "qkv"]
    one_d = [
        (f"dp={world}", {}),
        (f"dp={world}", {"head.weight": "S(0)"}),
        (f"dp={world}", pin_all(fc, "S(0)")),
        (f"dp={world}", pin_all(fc + out, "S(1)")),
        (f"dp={world}", pin_all(fc, "S(0)") | pin_all(out, "S(1)")),
        (f"dp={world}", pin_all(fc + out, "R")),
        (f"dp={world}", pin_all(qkv, "S(0)") | {"head.weight": "S(0)"}),
        (f"dp={world}", pin_all(fc + out + qkv, "R") | {"head.weight": "R"}),
    ]
    if world != 4:
        return one_d
    return one_d + [
        ("dp=2,tp=2", {}),
        ("dp=2,tp=2", pin_all(fc, "R,S(0)") | pin_all(out, "R,S(1)")),
        ("dp=2,tp=2", pin_all(fc, "S(0),R")),
        ("dp=2,tp=2", {"head.weight": "R,S(0)"} | pin_all(qkv, "R,S(0)")),
        ("dp=2,tp=2", pin_all(fc + out + qkv, "R,R")),
    ]


def measure(rank, world_size, model_bytes, inputs, plan_json, steps, compile=False):
    """On each worker: median step time (forward+backward+SGD) and one step's counted bytes
    (none where ``compile``: a compiled program's collectives run no Python to count them)."""
    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    rt = rank_mesh_for(plan.mesh)
    parallel = ParallelModule(model, plan, rt, plan.emit("torch"), compile=compile)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for _i in range(steps + 1):  # the first step warms up (and compiles)
        torch.distributed.barrier()
        rt.bytes_moved.clear()
        start = time.perf_counter()
        opt.zero_grad()
        parallel(*inputs).backward()
        opt.step()
        torch.distributed.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), dict(rt.bytes_moved)


def predicted_bytes(plan) -> dict:
    out: dict = {}
    for r, i in plan.collectives():
        out[r.steps[i].kind] = out.get(r.steps[i].kind, 0.0) + r.step_bytes[i]
    return out


def spearman(xs, ys) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", required=True, help="a calibrated spec (autopar calibrate --out FILE)")
    parser.add_argument("--size", default="small", help=f"one of {', '.join(gpt2.SIZES)}")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world", type=int, default=4, help="local processes (the issue's figure uses 4)")
    parser.add_argument("--profile", metavar="DIR", help="also profile the solver's plan of each mesh, traces in DIR")
    args = parser.parse_args()
    try:
        hw = get_hardware(args.hardware)
    except AutoparError as exc:
        sys.exit(f"cost_accuracy: {exc}")

    model, inputs = gpt2.make(args.size)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    cluster = get_cluster(args.world)
    seen, rows = set(), []
    print(f"GPT-2-style '{args.size}' on {args.world} local processes, priced with {hw.name} ({args.hardware})")
    print(f"{'#':>2} {'mesh':<10} {'pins':<34} {'predicted (ms)':>34} {'measured':>10} {'error':>7}   "
          f"bytes predicted/counted")
    for mesh, pins in variants(gpt2.SIZES[args.size].layers, args.world):
        plan = autopar.plan(model, inputs, mesh=mesh, hardware=hw, pin=pins, cache=False)
        if plan.hash in seen:
            continue
        seen.add(plan.hash)
        results = cluster.run(measure, buffer.getvalue(), inputs, plan.to_json(), args.steps)
        measured = max(t for t, _ in results)  # a step ends when the slowest rank ends
        counted = results[0][1]
        want = predicted_bytes(plan)
        bytes_text = ", ".join(f"{k} {want.get(k, 0) / 1e6:.2f}/{counted.get(k, 0) / 1e6:.2f} MB"
                               for k in sorted(set(want) | set(counted))) or "none"
        error = (plan.predicted.step_time_s - measured) / measured
        pin_text = ", ".join(f"{k.replace('blocks.', 'b')}={v}" for k, v in list(pins.items())[:2])
        pin_text += " ..." if len(pins) > 2 else ""
        pred = plan.predicted
        print(f"{len(rows) + 1:>2} {mesh:<10} {pin_text or '(solver)':<34} {pred.step_time_s * 1e3:>8.1f}ms "
              f"(compute {pred.compute_s * 1e3:.0f} + comm {pred.communication_s * 1e3:.0f}) "
              f"{measured * 1e3:>8.1f}ms {error:>+7.1%}   {bytes_text}", flush=True)
        rows.append((plan.predicted.step_time_s, measured, want, counted))
    mape = statistics.fmean(abs(p - m) / m for p, m, _, _ in rows)
    rho = spearman([p for p, *_ in rows], [m for _, m, *_ in rows])
    bytes_match = sum(1 for _, _, w, c in rows
                      if {k: round(v) for k, v in w.items()} == {k: round(v) for k, v in c.items()})
    print(f"{len(rows)} distinct plans; collective bytes agree exactly in {bytes_match} of {len(rows)}")
    if args.profile:
        for mesh in dict.fromkeys(m for m, pins in variants(gpt2.SIZES[args.size].layers, args.world) if not pins):
            plan = autopar.plan(model, inputs, mesh=mesh, hardware=hw, cache=False)
            print(autopar.profile(plan, model, inputs, out_dir=os.path.join(args.profile, mesh.replace(",", "_")),
                                  steps=args.steps, hardware=hw), flush=True)
    print(f"MAPE: {mape:.1%} spearman: {rho:.2f}")


if __name__ == "__main__":
    main()
