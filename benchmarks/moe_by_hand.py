"""A hand-written expert-parallel training step, the baseline of benchmarks/moe.py (b).

What a torchtitan-style script writes by hand for a Hugging Face MoE model on ``n`` ranks:
each rank holds the dense part whole (its gradients all-reduced in one bucket, as DDP does)
and ``E / n`` experts of each MoE layer, runs its quarter of the batch, and sends every
(token, expert) pair to its expert's rank with ``all_to_all_single`` (torch's differentiable
one, ``all_to_all_single_autograd`` of its functional collectives), split sizes exchanged first. Written apart from
autopar's kernel (autopar.runtime.moe), which it is measured against.
"""
from __future__ import annotations

import io
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn


class ExpertsByHand(nn.Module):
    """This rank's experts of one layer, called as Hugging Face's experts module is."""

    def __init__(self, experts: nn.Module, rank: int, world: int):
        super().__init__()
        local = experts.gate_up_proj.shape[0] // world
        mine = slice(rank * local, (rank + 1) * local)
        self.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[mine].clone())
        self.down_proj = nn.Parameter(experts.down_proj.detach()[mine].clone())
        self.local, self.world = local, world

    def forward(self, x, top_k_index, top_k_weights):
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens, experts = order // top_k_index.shape[1], flat[order]
        send = torch.bincount(experts // self.local, minlength=self.world)
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)
        send, received = send.tolist(), received.tolist()
        ids = torch.empty(sum(received), dtype=experts.dtype)
        dist.all_to_all_single(ids, (experts % self.local).contiguous(), received, send)
        world = dist.group.WORLD
        rows = funcol.wait_tensor(funcol.all_to_all_single_autograd(x[tokens], received, send, world))
        by_expert = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=self.local).tolist()
        outputs = []
        for e, group in enumerate(rows[by_expert].split(counts)):
            gate, up = (group @ self.gate_up_proj[e].t()).chunk(2, dim=-1)
            outputs.append((F.silu(gate) * up) @ self.down_proj[e].t())
        computed = torch.empty_like(rows).index_copy(0, by_expert, torch.cat(outputs))
        back = funcol.wait_tensor(funcol.all_to_all_single_autograd(computed, send, received, world))
        weighted = back * top_k_weights.reshape(-1)[order][:, None]
        return torch.zeros_like(x).index_add(0, tokens, weighted.to(x.dtype))


def shard_experts(model: nn.Module, rank: int, world: int) -> list[nn.Parameter]:
    """Replace each experts module by this rank's share; the dense parameters left whole."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if hasattr(child, "gate_up_proj") and child.gate_up_proj.dim() == 3:
                setattr(module, name, ExpertsByHand(child, rank, world))
    return [p for m in model.modules() if isinstance(m, ExpertsByHand) for p in m.parameters()]


def train_by_hand(rank: int, world: int, model_bytes: bytes, batch, steps: int) -> tuple[list, list]:
    """(each SGD step's seconds: forward, backward, the dense gradients' all-reduce, update;
    each step's loss, averaged over the ranks)."""
    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    experts = {id(p) for p in shard_experts(model, rank, world)}
    dense = [p for p in model.parameters() if id(p) not in experts]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = batch[0].shape[0] // world
    ids, labels = (t[rank * rows:(rank + 1) * rows] for t in batch)
    times, losses = [], []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = model(ids, labels)
        loss.backward()
        bucket = torch.cat([p.grad.reshape(-1) for p in dense])
        dist.all_reduce(bucket)
        for p, g in zip(dense, bucket.split([p.numel() for p in dense])):
            p.grad.copy_(g.view_as(p)).div_(world)
        for p in model.parameters():
            if id(p) in experts:  # the experts summed every rank's tokens' mean-over-a-quarter gradients
                p.grad.div_(world)
        opt.step()
        times.append(time.perf_counter() - start)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return times, losses
