"""An ill-conditioned regression where second-order methods are known to help: a linear teacher
on inputs whose covariance has condition number ``condition`` along random directions (not the
axes), fit by a chain of linear layers. A diagonal method (Adam) cannot undo rotated curvature;
K-FAC's input factor ``A = E[a aᵀ]`` whitens it. tests/test_bubbles.py and
benchmarks/bubbles.py compare K-FAC with SGD and AdamW on it."""
from __future__ import annotations

import math

import torch
from torch import nn


class LinearChain(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x, y):
        for layer in self.layers:
            x = layer(x)
        return ((x - y) ** 2).mean()


def make(width: int = 16, depth: int = 2, condition: float = 1e4, batch: int = 32, seed: int = 0):
    """(model, (inputs, targets)): rows are batch x 4 positions of ``width`` features."""
    torch.manual_seed(seed)
    rotation, _ = torch.linalg.qr(torch.randn(width, width))
    scales = torch.logspace(0, math.log10(condition) / 2, width)
    x = (torch.randn(batch, 4, width) / scales) @ rotation
    teacher = torch.randn(width, width) / math.sqrt(width)
    return LinearChain(width, depth), (x, x @ rotation.t() * scales @ teacher)


def loss_after(model: nn.Module, inputs, make_optimizer, steps: int) -> float:
    """The loss of a copy of ``model`` after ``steps`` full-batch steps of ``make_optimizer(params)``."""
    import copy

    model = copy.deepcopy(model)
    opt = make_optimizer(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        model(*inputs).backward()
        opt.step()
    with torch.no_grad():
        return model(*inputs).item()


SGD_LRS = (0.01, 0.03, 0.1, 0.3, 1.0)  # the grids the first-order baselines take their best from
ADAMW_LRS = (0.001, 0.003, 0.01, 0.03, 0.1)
KFAC_SETTINGS = dict(lr=0.03, momentum=0.9, damping=1e-3, factor_decay=0.95, kl_clip=1e-2)
