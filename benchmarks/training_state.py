"""The training state's costs: checkpoints and start-up memory, GPT-2-style decoder on 4 local
CPU processes (gloo).

    python benchmarks/training_state.py [--size small] [--rounds 3]

Per round, in alternating order (the machine is shared and noisy):
- save: torch.distributed.checkpoint of the model and AdamW state (get_state_dict) under the
  solver's dp=2,tp=2 plan: time, and the bytes each rank wrote;
- load: the same checkpoint into a fresh model and optimizer on the same plan, and resharded
  into another plan (data parallel on dp=4): time.

Start-up memory per rank, under torch's MemTracker: materializing the model built on the meta
device (each rank allocates its blocks, rank 0 one module whole at a time) against building the
whole model on every rank and distributing it (what every rank held before), under the solver's
plan and under a ZeRO-3 layout (every parameter split over the 4 ranks). The last line reads
``startup peak per rank / full model: X.XX`` (the largest rank's, sharded materialization, ZeRO-3).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar.runtime.local_cluster import get_cluster  # noqa: E402
from examples import gpt2  # noqa: E402


def _model(size: str, device: str):
    torch.manual_seed(0)
    with torch.device(device):
        return gpt2.GPT2(gpt2.SIZES[size])


def _sharded(model, plan_json: str):
    """A ParallelModule running ``model`` by the plan (its parameters now DTensors)."""
    from autopar.check import rank_mesh_for
    from autopar.runtime.module import ParallelModule

    plan = autopar.Plan.from_json(plan_json)
    return ParallelModule(model, plan, rank_mesh_for(plan.mesh), plan.emit("torch"))


def checkpoint_round(rank, world_size, size, batch, plan_json, other_plan_json, directory):
    """Save under one plan, load under it and under the other: seconds, and this rank's bytes written."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def trained(plan_json):
        """A model and AdamW after one step, so that the optimizer has state."""
        parallel = _sharded(_model(size, "cpu"), plan_json)
        opt = torch.optim.AdamW(parallel.model.parameters(), lr=1e-3)
        parallel(*batch).backward()
        opt.step()
        return parallel, parallel.model, opt

    out = {}
    model, inner, opt = trained(plan_json)
    dist.barrier()
    start = time.perf_counter()
    model_state, optim_state = get_state_dict(inner, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    dist.barrier()
    out["save"] = time.perf_counter() - start
    out["bytes"] = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                       if f.startswith(f"__{rank}_"))
    for name, target in (("load", plan_json), ("resharded load", other_plan_json)):
        model, inner, opt = trained(target)
        dist.barrier()
        start = time.perf_counter()
        model_state, optim_state = get_state_dict(inner, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=directory)
        set_state_dict(inner, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        dist.barrier()
        out[name] = time.perf_counter() - start
    return out


def startup_memory(rank, world_size, size, plan_json):
    """Peak bytes under MemTracker (real devices: the meta device holds no memory): materializing
    a meta model, and building the whole model then distributing it; and this rank's blocks."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from autopar.check import rank_mesh_for
    from autopar.parallelize import initializer
    from autopar.runtime.module import ParallelModule

    plan = autopar.Plan.from_json(plan_json)
    out = {}
    for name, device in (("sharded materialization", "meta"), ("whole model on every rank", "cpu")):
        tracker = MemTracker()
        with tracker:
            model = _model(size, device)
            ParallelModule(model, plan, rank_mesh_for(plan.mesh), plan.emit("torch"),
                           init=initializer("reset_parameters"))
        out[name] = sum(snapshot["Total"] for device, snapshot in tracker.get_tracker_snapshot("peak").items()
                        if torch.device(device).type != "meta")
    out["blocks"] = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(gpt2.SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model, batch = gpt2.make(args.size)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    plan = autopar.plan(model, batch, mesh="dp=2,tp=2", hardware="h100-sxm")
    names = [n for n, _ in model.named_parameters()]
    data_parallel = autopar.plan(model, batch, mesh="dp=4", hardware="h100-sxm", pin={n: "R" for n in names})
    cluster = get_cluster(4)
    rounds: dict = {}
    root = tempfile.mkdtemp(prefix="autopar-checkpoint-")
    try:
        for r in range(args.rounds):
            directory = os.path.join(root, f"round{r}")
            results = cluster.run(checkpoint_round, args.size, batch, plan.to_json(), data_parallel.to_json(),
                                  directory)
            for key in ("save", "load", "resharded load"):
                rounds.setdefault(key, []).append(max(x[key] for x in results))
            rounds.setdefault("bytes", []).append([x["bytes"] for x in results])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    zero3 = autopar.plan(model, batch, mesh="dp=4", hardware="h100-sxm", pin={n: "S(0)" for n in names})
    memory = {"the solver's plan": cluster.run(startup_memory, args.size, plan.to_json()),
              "ZeRO-3 (every parameter S(0) on dp=4)": cluster.run(startup_memory, args.size, zero3.to_json())}
    print(f"GPT-2-style {args.size}: {full_bytes / 2**20:.1f} MiB of parameters; 4 gloo processes; plan on "
          f"{plan.mesh}, resharded into data parallel on dp=4; {args.rounds} rounds (slowest rank, median)")
    for key in ("save", "load", "resharded load"):
        print(f"  checkpoint {key:<15} {statistics.median(rounds[key]) * 1e3:8.1f} ms")
    per_rank = rounds["bytes"][-1]
    print(f"  checkpoint bytes per rank: {', '.join(f'{b / 2**20:.2f} MiB' for b in per_rank)} "
          f"(model + AdamW state: {3 * full_bytes / 2**20:.1f} MiB in all)")
    for layout, ranks in memory.items():
        blocks = ", ".join(f"{m['blocks'] / 2**20:.2f}" for m in ranks)
        print(f"  start-up, {layout}: parameter blocks per rank {blocks} MiB")
        for name in ("whole model on every rank", "sharded materialization"):
            peaks = [m[name] for m in ranks]
            print(f"    peak, {name:<26} {', '.join(f'{p / 2**20:.2f}' for p in peaks)} MiB "
                  f"(largest / full model {max(peaks) / full_bytes:.2f})")
    sharded = max(m["sharded materialization"] for m in memory["ZeRO-3 (every parameter S(0) on dp=4)"])
    print(f"startup peak per rank / full model: {sharded / full_bytes:.2f}")


if __name__ == "__main__":
    main()
