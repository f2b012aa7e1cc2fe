"""A hand-written context-parallel training step, the baseline of benchmarks/long_context.py (b).

What a script writes by hand to split a Llama-style model's sequence over ``n`` ranks with the
all-gather variant (Llama 3's): each rank holds every parameter (their gradients all-reduced
in one bucket, as DDP does) and a contiguous block of the tokens; its rotary positions are
the block's; attention all-gathers the keys and values (torch's differentiable
``all_gather_single_autograd``, whose backward reduce-scatters) and attends the block's
queries to them under the causal mask offset by the block's position; the loss is the
block's tokens' share of the mean. Written apart from autopar's kernels
(autopar.runtime.context_parallel), which it is measured against.
"""
from __future__ import annotations

import io
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate(x, cos, sin):
    """Rotary embedding (Su et al., arXiv:2104.09864) in the half-split form Llama uses."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def attend(q, k, v):
    """Causal attention over the whole sequence: what one process runs."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.attend = attend

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return self.o(self.attend(q, k, v).transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.attn = Attention(width, heads, kv_heads)
        self.gate_up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(2 * width, width, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class LlamaStyle(nn.Module):
    """``forward(ids, labels, positions)`` -> the mean cross-entropy of the tokens given, times
    ``share`` (1 on one process; a rank's block's fraction of the tokens by hand)."""

    def __init__(self, vocab: int = 1024, width: int = 256, heads: int = 8, kv_heads: int = 2, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head_width = width // heads

    def forward(self, ids, labels, positions, share: float = 1.0):
        angles = positions[:, None].float() * 10000.0 ** (
            -torch.arange(0, self.head_width, 2, dtype=torch.float32) / self.head_width)
        cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) * share


def gathered_attention(rank: int, world: int):
    """This rank's attention by hand: the keys and values all-gathered along the sequence, the
    block's queries attending to them under the causal mask offset by its position."""
    group = dist.group.WORLD

    def attend_block(q, k, v):
        keys = funcol.all_gather_single_autograd(k.contiguous(), 2, group)
        values = funcol.all_gather_single_autograd(v.contiguous(), 2, group)
        block, total = q.shape[2], keys.shape[2]
        rows = torch.arange(rank * block, (rank + 1) * block)[:, None]
        mask = torch.arange(total)[None, :] <= rows
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    return attend_block


def train_by_hand(rank: int, world: int, model_bytes: bytes, batch, steps: int) -> tuple[list, list]:
    """(each SGD step's seconds: forward, backward, the gradients' all-reduce, update; each
    step's loss, summed over the ranks' shares)."""
    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    for block in model.blocks:
        block.attn.attend = gathered_attention(rank, world)
    ids, labels, positions = batch
    block = ids.shape[1] // world
    mine = slice(rank * block, (rank + 1) * block)
    ids, labels, positions = ids[:, mine], labels[:, mine], positions[mine]
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    times, losses = [], []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = model(ids, labels, positions, 1.0 / world)  # the block's share of the whole mean
        loss.backward()
        bucket = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(bucket)
        for p, g in zip(params, bucket.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
        opt.step()
        times.append(time.perf_counter() - start)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    return times, losses
