"""A two-layer MLP block (Linear -> GELU -> Linear) with a mean-squared-error loss."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)


def make(batch: int = 8, width: int = 1024, hidden: int = 4096, seed: int = 0):
    torch.manual_seed(seed)
    return MLP(width, hidden), (torch.randn(batch, width), torch.randn(batch, width))


def factory():
    return make()
