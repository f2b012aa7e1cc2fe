"""Small models for tests. Importable by the worker processes (tests/ is on sys.path)."""
import torch
import torch.nn.functional as F
from torch import nn


class _Scan(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.logcumsumexp(self.fc(x), dim=1)


class UnruledOpModel(nn.Module):
    """Uses torch.logcumsumexp (inside ``scan``), which has no sharding rule: it must fall back to replication."""

    def __init__(self, width=16):
        super().__init__()
        self.scan = _Scan(width)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(self.scan(x)).pow(2).mean()


class BranchyModel(nn.Module):
    """Branches on a tensor's value: cannot be one static graph."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # data-dependent control flow
            h = h * 2
        return h.mean()


class TupleLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)  # not a scalar loss


def mlp_loss(model, x, y):
    return F.mse_loss(model(x), y)


class DropoutMLP(nn.Module):
    def __init__(self, width=32, hidden=64, p=0.2):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(self.drop(F.gelu(self.fc1(x)))), y)
