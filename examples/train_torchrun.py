"""Training with the one-line API under torchrun:

    torchrun --nproc-per-node=4 examples/train_torchrun.py --mesh dp=2,tp=2 --steps 5
    torchrun --nproc-per-node=4 examples/train_torchrun.py --mesh pp=2,dp=2 --steps 5   # a pipeline

Rank 0 plans (example_inputs: before the optimizer is built, so it steps the sharded
parameters) and the other ranks receive the plan; every rank then shards its parameters and
runs the emitted program. Each rank passes the same global batch. An evaluation pass at the
end runs a forward program planned for evaluation mode (a pipelined plan runs the modes it
was planned in, so it evaluates under no_grad alone).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import autopar  # noqa: E402
from examples import gpt2  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mesh", default="dp=2,tp=2")
    parser.add_argument("--size", default="small", choices=sorted(gpt2.SIZES))
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    model, (idx, targets) = gpt2.make(args.size)
    model = autopar.autoparallelize(model, mesh=args.mesh, hardware="h100-sxm", example_inputs=(idx, targets))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    pipelined = autopar.plan_of(model).pipeline is not None
    model.train(pipelined)  # the first evaluation call plans a forward program in eval mode, around the same layouts
    with torch.no_grad():
        held_out = model(idx.roll(1, dims=0), targets.roll(1, dims=0))
    model.train()
    if dist.get_rank() == 0:
        print(f"evaluation loss {held_out.item():.4f}", flush=True)
        plan = autopar.plan_of(model)
        print(f"plan {plan.hash}: {len(plan.collectives())} collectives, "
              f"predicted {plan.predicted.step_time_s * 1e3:.3f} ms/step on {plan.hardware}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
