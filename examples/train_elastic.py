"""A run that survives losing a rank: torchrun's elastic agents, checkpoints, and a new plan.

Start one agent per node (c10d rendezvous; here two on one machine, 2 processes each):

    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1   # each restart's workers get a fresh store
    torchrun --nnodes=1:2 --nproc-per-node=2 --max-restarts=3 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 --rdzv-id=job1 --rdzv-conf=is_host=1 \\
        examples/train_elastic.py --steps 20 --checkpoint-dir ckpt --log-file steps.jsonl
    torchrun --nnodes=1:2 --nproc-per-node=2 --max-restarts=3 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 --rdzv-id=job1 --rdzv-conf=is_host=0 \\
        examples/train_elastic.py --steps 20 --checkpoint-dir ckpt --log-file steps.jsonl

Lose an agent (a node goes down: kill it and its workers) and the survivors' collectives fail;
their agent restarts them, and they re-rendezvous without the lost node (``--nnodes=1:2``: one
node is enough). Every (re)started process loads the newest complete checkpoint, plans the
model again for the world size it now has (``mesh="auto"``), and DCP reshards the saved model
and optimizer state onto the new plan's layout; training continues from the checkpointed step
with the same global batches. A checkpoint is saved into ``step_<n>.partial`` and renamed
``step_<n>`` once every rank has written its part, so an interrupted save is never loaded.
The agent hosting the c10d rendezvous store (``is_host=1``) must survive. Without
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` the restarted workers of torch 2.13 read the previous
workers' addresses from the agent's shared store and fail to connect (pytorch/pytorch#135712).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

import autopar  # noqa: E402
from examples import mlp  # noqa: E402

# links so fast that the planner shards even this small model (the run is on CPUs anyway)
HARDWARE = dataclasses.replace(autopar.PRESETS["h100-sxm"], name="fast", intra_node=autopar.Link(450e12, 1e-9),
                               inter_node=autopar.Link(450e12, 1e-9), kernel_floor_s=0.0,
                               half_efficiency_flops=0.0, collectives_library="gloo")
COMPLETE = re.compile(r"step_(\d+)")  # a complete checkpoint's directory; "step_<n>.partial" is not one


def latest_checkpoint(root: str) -> tuple[int, str | None]:
    """(n, path) of the newest complete checkpoint ``<root>/step_<n>``, or (0, None) where there is none."""
    found = [(int(m[1]), os.path.join(root, m[0])) for m in map(COMPLETE.fullmatch, os.listdir(root))
             if m and os.path.isdir(os.path.join(root, m[0]))] if os.path.isdir(root) else []
    return max(found, default=(0, None))


def save_checkpoint(state: dict, root: str, step: int) -> str:
    """DCP-save ``state`` into ``step_<n>.partial``; once every rank has written, rank 0 renames it ``step_<n>``."""
    final = os.path.join(root, f"step_{step}")
    partial = final + ".partial"
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)  # what an interrupted save of this step left
    dist.barrier()
    dcp.save(state, checkpoint_id=partial)
    dist.barrier()
    if dist.get_rank() == 0:
        os.replace(partial, final)  # atomic: the directory step_<n> is whole or absent
    return final


def batch(step: int, args) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: a pure function of the step, whatever the world size."""
    g = torch.Generator().manual_seed(step)
    return torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, args.width, generator=g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint-dir", default="checkpoints/train_elastic")
    # --log-file under torchrun: its own parser takes "--log" for an ambiguous prefix of its --log-dir
    parser.add_argument("--log-file", "--log", dest="log", default="train_elastic.jsonl",
                        help="one JSON line per finished step (rank 0)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, _ = mlp.make(batch=args.batch, width=args.width, hidden=args.hidden, seed=0)  # alike on every rank
    inputs = batch(0, args)
    # rank 0 plans for the world size this run has, and finds the checkpoint; every rank takes both
    message = [None]
    if rank == 0:
        plan = autopar.plan(model, inputs, mesh="auto", hardware=HARDWARE, cache=False)
        message = [(plan.to_json(), latest_checkpoint(args.checkpoint_dir))]
    dist.broadcast_object_list(message, src=0)
    plan_json, (start, path) = message[0]
    plan = autopar.Plan.from_json(plan_json)
    model = autopar.autoparallelize(model, mesh=plan.device_mesh, plan=plan, hardware=HARDWARE,
                                    example_inputs=inputs)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)  # after the sharding: on the DTensors
    if path is not None:  # DCP reshards what another world size saved onto this plan's layout
        model_state, optim_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for step in range(start + 1, args.steps + 1):
        loss = model(*batch(step, args))
        loss.backward()
        opt.step()
        opt.zero_grad()
        model_state, optim_state = get_state_dict(model, opt)
        save_checkpoint({"model": model_state, "optim": optim_state}, args.checkpoint_dir, step)
        if rank == 0:
            record = {"step": step, "loss": loss.item(), "world_size": world, "mesh": str(plan.device_mesh),
                      "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))}
            with open(args.log, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
            print(f"step {step}: loss {record['loss']:.6f} on {world} ranks, mesh {record['mesh']}", flush=True)
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
