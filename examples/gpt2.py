"""A GPT-2-style decoder: token and position embeddings, pre-norm blocks with
causal self-attention and a GELU MLP, a final layer norm and an LM head.
``forward(idx, targets)`` returns the cross-entropy loss."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MEGATRON_DROPOUT = 0.1


@dataclass(frozen=True)
class GPT2Config:
    vocab: int = 512
    seq: int = 64
    layers: int = 2
    heads: int = 4
    width: int = 256
    batch: int = 8
    megatron: bool = False  # Megatron-LM's block: softmax attention written out, dropout 0.1 (benchmarks/memory.py)
    tied: bool = False  # the head reads the token embedding's weight (GPT-2's own choice)


SIZES = {
    "tiny": GPT2Config(vocab=256, seq=32, layers=2, heads=4, width=128, batch=8),
    "small": GPT2Config(vocab=1024, seq=128, layers=2, heads=8, width=512, batch=8),
    "demo": GPT2Config(vocab=2048, seq=128, layers=2, heads=16, width=1024, batch=8),
    "gpt2-124m": GPT2Config(vocab=50304, seq=1024, layers=12, heads=12, width=768, batch=8),
    "gpt2-1.5b": GPT2Config(vocab=50304, seq=1024, layers=48, heads=25, width=1600, batch=8),
}


class Attention(nn.Module):
    # Separate q/k/v projections (as in Llama): a fused qkv weight split along its
    # output dim cannot be column-sharded without reordering its rows per head.
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.heads, self.megatron = cfg.heads, cfg.megatron
        if cfg.megatron:
            self.register_buffer("causal", torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).tril(), persistent=False)
        self.q = nn.Linear(cfg.width, cfg.width)
        self.k = nn.Linear(cfg.width, cfg.width)
        self.v = nn.Linear(cfg.width, cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (lin(x).view(b, t, self.heads, c // self.heads).transpose(1, 2) for lin in (self.q, self.k, self.v))
        if self.megatron:
            scores = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
            probs = F.softmax(scores.masked_fill(~self.causal[:t, :t], float("-inf")), dim=-1)
            y = F.dropout(probs, MEGATRON_DROPOUT, self.training) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.proj(y.transpose(1, 2).reshape(b, t, c))
        return F.dropout(y, MEGATRON_DROPOUT, self.training) if self.megatron else y


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.out = nn.Linear(4 * cfg.width, cfg.width)
        self.dropout = MEGATRON_DROPOUT if cfg.megatron else 0.0

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)))), self.dropout, self.training)


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.seq, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        if cfg.tied:
            self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def make(size: str | GPT2Config = "tiny", device: str = "cpu", seed: int = 0):
    """(model, example inputs) for one of ``SIZES`` or a config; ``device="meta"`` builds it without memory."""
    cfg = SIZES[size] if isinstance(size, str) else size
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT2(cfg)
        idx = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq)) if device != "meta" else \
            torch.empty(cfg.batch, cfg.seq, dtype=torch.long)
        targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq)) if device != "meta" else \
            torch.empty(cfg.batch, cfg.seq, dtype=torch.long)
    return model, (idx, targets)


def factory():
    """For the CLI: ``autopar plan examples.gpt2:factory --mesh dp=2,tp=2``."""
    return make("small")
