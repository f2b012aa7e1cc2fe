"""A training run in the style of torchtitan, with autopar doing the parallelization:

    torchrun --nproc-per-node=4 examples/train_llama.py --mesh dp=2,tp=2 --steps 8 --checkpoint-every 4
    torchrun --nproc-per-node=4 examples/train_llama.py --mesh dp=2,tp=2 --steps 8 --resume
    torchrun --nproc-per-node=4 examples/train_llama.py --mesh pp=2,dp=2 --steps 8 --checkpoint-every 4

The same script runs on a pipeline (``--mesh pp=2,dp=2``): every feature below goes through
torch.distributed.pipelining's schedule there, each rank holding its stage's blocks alone.

- a Llama-architecture model (Hugging Face's LlamaForCausalLM) from a config, built on the meta
  device: no rank ever holds all of it; rank 0 initializes one module at a time with the
  model's own ``_init_weights`` and each rank receives only its blocks;
- each data-parallel block of ranks reads its own samples (``inputs="local"``, a
  DistributedSampler from ``autopar.data_parallel_info``);
- bf16 mixed precision (``precision="bf16-mixed"``): float32 master weights and AdamW state,
  compute in bf16, gradients reduced in float32;
- AdamW on the sharded (DTensor) parameters, gradient accumulation over micro-batches with
  ``no_sync()``, global gradient clipping with ``clip_grad_norm_``;
- a torch.distributed.checkpoint of the model and optimizer every N steps, and ``--resume``
  from the latest one.

The data are random token sequences from a fixed seed (the point is the loop, not the text).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import autopar  # noqa: E402


def build_model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=args.width, intermediate_size=2 * args.width, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.heads // 2, vocab_size=args.vocab,
                         max_position_embeddings=args.seq, use_cache=False)
    torch.manual_seed(0)
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def batches(args, rank: int, size: int) -> DataLoader:
    """This data-parallel block's micro-batches of random token sequences, every step's in order."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.steps * args.accumulate * args.batch, args.seq), generator=g)
    sampler = DistributedSampler(TensorDataset(tokens), num_replicas=size, rank=rank, shuffle=False)
    return DataLoader(TensorDataset(tokens), batch_size=args.batch // size, sampler=sampler)


def checkpoint_dirs(root: str) -> list[str]:
    steps = sorted(int(name.removeprefix("step")) for name in os.listdir(root) if name.startswith("step")) \
        if os.path.isdir(root) else []
    return [os.path.join(root, f"step{s}") for s in steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="dp=2,tp=2")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--batch", type=int, default=8, help="sequences per micro-batch, all ranks together")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default="checkpoints/train_llama")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--precision", default="bf16-mixed", help="bf16-mixed, fp16-mixed, or fp32 (none)")
    args = parser.parse_args()

    model = build_model(args)
    precision = None if args.precision == "fp32" else args.precision
    model = autopar.autoparallelize(model, mesh=args.mesh, hardware=args.hardware, inputs="local",
                                    init=model._init_weights, precision=precision)
    rank, size = autopar.data_parallel_info(model)
    loader = iter(batches(args, rank, size))
    first = next(loader)[0]
    autopar.prepare(model, input_ids=first, labels=first)  # plan and shard, so AdamW gets the DTensors
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    start = 0
    if args.resume and checkpoint_dirs(args.checkpoint_dir):
        latest = checkpoint_dirs(args.checkpoint_dir)[-1]
        model_state, optim_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=latest)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(os.path.basename(latest).removeprefix("step"))
    loader = iter(batches(args, rank, size))
    for _ in range(start * args.accumulate):  # the batches the checkpointed steps consumed
        next(loader)
    for step in range(start, args.steps):
        total = 0.0
        for k in range(args.accumulate):
            (tokens,) = next(loader)
            with model.no_sync() if k < args.accumulate - 1 else torch.enable_grad():
                loss = model(input_ids=tokens, labels=tokens).loss / args.accumulate
                loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step + 1}: loss {total:.6f} grad norm {norm.full_tensor().item():.4f}", flush=True)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            model_state, optim_state = get_state_dict(model, opt)
            dcp.save({"model": model_state, "optim": optim_state},
                     checkpoint_id=os.path.join(args.checkpoint_dir, f"step{step + 1}"))
    if dist.get_rank() == 0:
        plan = autopar.plan_of(model)
        print(f"plan {plan.hash} on {plan.device_mesh}: predicted {plan.predicted.step_time_s * 1e3:.3f} ms per "
              f"micro-batch on {plan.hardware}, computing in {plan.graph.autocast or 'the model dtypes'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
