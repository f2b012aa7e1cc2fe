"""What running the step as two programs costs: the GPT-2-style decoder on 4 local CPU
processes (gloo), one plan.

    python benchmarks/train_semantics.py [--size small] [--rounds 5] [--steps 5]

Per round, in alternating order (the machine is shared and noisy):
- split: ``loss = model(...)`` runs the forward program through autograd, ``loss.backward()``
  the backward program;
- joint: the same two programs called back to back in one function, with no autograd
  (the statements of the joint program the runtime ran before the split);
- accumulation of 4 micro-batches (each of the step's batch, data parallel on dp=4) with and
  without ``no_sync()``: time and bytes moved;
- a call under ``torch.no_grad()`` in training mode and in evaluation mode: each runs a forward
  program planned for its mode, with the step's parameter layouts.

Peak memory (torch's MemTracker, one step) for split and joint. The last line reads
``split/joint step time: X.XX``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.runtime.local_cluster import get_cluster  # noqa: E402
from examples import gpt2  # noqa: E402


def measure(rank, world_size, model_bytes, inputs, plans_json, steps):
    """On each worker: per mode, the median time of ``steps`` steps, bytes moved, peak memory."""
    from autopar.check import _measure_peak_memory, rank_mesh_for
    from autopar.runtime.module import ParallelModule

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan, *forwards = (autopar.Plan.from_json(text) for text in plans_json)
    by_mode = {f.graph.training: (f, f.emit("torch")) for f in forwards}
    rt = rank_mesh_for(plan.mesh)
    parallel = ParallelModule(model, plan, rt, plan.emit("torch"), planner=lambda kind, m, *_: by_mode[m.training])
    modes = {
        "split": lambda: parallel(*inputs).backward(),
        "joint": lambda: _joint(parallel, inputs),
        "forward under no_grad": lambda: _forward(parallel, inputs, training=True),
        "evaluation forward": lambda: _forward(parallel, inputs, training=False),
    }
    out = {}
    for name, step in modes.items():
        out[name] = _timed(rt, step, steps)
        out[name]["peak_bytes"] = _measure_peak_memory(model, step)
    return out


def _forward(parallel, inputs, training: bool) -> None:
    """A call under no_grad: the forward program of the mode."""
    parallel.train(training)
    with torch.no_grad():
        parallel(*inputs)
    parallel.train()


def accumulate(rank, world_size, model_bytes, micro, plan_json, steps):
    """4 micro-batches a step, each synced or all but the last under no_sync()."""
    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    rt = rank_mesh_for(plan.mesh)
    parallel = ParallelModule(model, plan, rt, plan.emit("torch"))

    def step(defer: bool):
        for k in range(4):
            with parallel.no_sync() if defer and k < 3 else contextlib.nullcontext():
                loss = parallel(*micro) / 4
            loss.backward()

    return {"synced every micro-batch": _timed(rt, lambda: step(False), steps),
            "no_sync": _timed(rt, lambda: step(True), steps)}


def _joint(parallel, inputs) -> None:
    """The forward and backward programs back to back, no autograd: the joint step's statements."""
    from autopar.ir.call import flatten_call

    program = parallel.first
    args = program.arguments(parallel.model, dict(parallel.model.named_parameters()), flatten_call(inputs))
    with torch.no_grad():
        loss, saved, _, _ = program.module.forward(parallel.rt, *args)
        program.module.backward(parallel.rt, *args, saved, torch.ones_like(loss), True, {})


def _timed(rt, step, steps: int) -> dict:
    times = []
    for _i in range(steps + 1):  # the first warms up
        torch.distributed.barrier()
        rt.bytes_moved.clear()
        start = time.perf_counter()
        step()
        torch.distributed.barrier()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times[1:]), "bytes": sum(rt.bytes_moved.values())}


def _forward_plan(model, inputs, plan, training: bool):
    """The forward program in one mode, its parameters where ``plan`` put them (as
    autoparallelize plans it on the first call under no_grad in that mode)."""
    from autopar.api import plan_program
    from autopar.capture import capture
    from autopar.planning.request import resolve

    model.train(training)
    program = capture(model, inputs, training_step=False)
    model.train()
    layouts = {fqn: plan.out_spec(ph).to_json() for ph, fqn in plan.graph.params.items()}
    return plan_program(program, resolve(plan.mesh, "h100-sxm", pin=layouts), model, inputs, cache=False)


def _data_parallel(model, inputs):
    """The micro-batches' plan: data parallel on dp=4 (parameters replicated, the batch split), so
    every gradient is all-reduced and no_sync() has syncs to defer."""
    from autopar.capture import capture

    pins = {name: "R" for name, _ in model.named_parameters()}
    pins.update({ph: "S(0)" for ph in capture(model, inputs).user_inputs})
    return autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm", pin=pins, cache=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(gpt2.SIZES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    model, inputs = gpt2.make(args.size)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware="h100-sxm", cache=False)
    forwards = [_forward_plan(model, inputs, plan, training) for training in (True, False)]
    micro_plan = _data_parallel(model, inputs)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    cluster = get_cluster(4)
    rounds: dict = {}
    for r in range(args.rounds):
        jobs = [(measure, inputs, [p.to_json() for p in [plan, *forwards]]), (accumulate, inputs, micro_plan.to_json())]
        for job, job_inputs, job_plans in (jobs if r % 2 == 0 else jobs[::-1]):
            result = cluster.run(job, buffer.getvalue(), job_inputs, job_plans, args.steps)[0]
            for mode, figures in result.items():
                rounds.setdefault(mode, []).append(figures)
    print(f"GPT-2-style {args.size}, 4 gloo processes, {args.rounds} rounds of {args.steps} steps; the step on "
          f"(dp=2, tp=2), the micro-batches data parallel on dp=4")
    for mode, figures in rounds.items():
        seconds = statistics.median(f["seconds"] for f in figures)
        peak = f", peak {figures[0]['peak_bytes'] / 2**20:.1f} MiB" if "peak_bytes" in figures[0] else ""
        print(f"  {mode:<26} {seconds * 1e3:8.1f} ms  {figures[0]['bytes'] / 1e3:10.1f} KB moved{peak}")
    evaluation_by_round = [e["seconds"] / f["seconds"]
                           for e, f in zip(rounds["evaluation forward"], rounds["forward under no_grad"])]
    print(f"  evaluation/training forward per round: {', '.join(f'{x:.2f}' for x in evaluation_by_round)}")
    by_round = [s["seconds"] / j["seconds"] for s, j in zip(rounds["split"], rounds["joint"])]
    print(f"  split/joint per round: {', '.join(f'{x:.2f}' for x in by_round)}")
    print(f"split/joint step time: {statistics.median(by_round):.2f}")


if __name__ == "__main__":
    main()
