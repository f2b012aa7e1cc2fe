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


class GroupedConvNet(nn.Module):
    """Grouped convolutions (2 and 4 groups), then a linear head: the channels may split only by whole groups."""

    def __init__(self, channels=16):
        super().__init__()
        self.conv1 = nn.Conv2d(8, channels, 3, padding=1, groups=2)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, groups=4)
        self.head = nn.Linear(channels, 4)

    def forward(self, x, y):
        h = F.relu(self.conv2(F.relu(self.conv1(x))))
        return F.mse_loss(self.head(h.mean((2, 3))), y)


class DepthwiseConvNet(nn.Module):
    """A depthwise convolution (groups = channels) between pointwise ones, as MobileNet and ConvNeXt use."""

    def __init__(self, channels=16):
        super().__init__()
        self.expand = nn.Conv2d(4, channels, 1)
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.project = nn.Conv2d(channels, 4, 1)

    def forward(self, x, y):
        return F.mse_loss(self.project(F.gelu(self.depthwise(self.expand(x)))), y)


class GatherScatter(nn.Module):
    """A gather whose index has fewer rows than its source (the first rows only), an MLP on the
    gathered rows, and a scatter of them back into rows of that many."""

    def __init__(self, width=64):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, index):
        h = self.fc(x)  # (rows, width)
        picked = self.mlp(torch.gather(h, 1, index))  # index: (rows // 2, width)
        spread = torch.zeros_like(h).scatter(1, index, picked)
        return spread.pow(2).mean()


class HistogramPenalty(nn.Module):
    """A histogram over the activations' own range (torch.histc's default min=max=0) weights a
    loss term."""

    def __init__(self, width=64, bins=8):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, bins))

    def forward(self, x):
        h = self.fc(x)
        counts = torch.histc(h.detach(), bins=self.weight.numel())
        return h.pow(2).mean() + (counts / h.numel() * self.weight).sum()


class FrequencyScaledEmbedding(nn.Module):
    """An embedding whose gradient is divided by each index's frequency in the batch."""

    def __init__(self, vocab=32, width=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width, scale_grad_by_freq=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx, targets):
        logits = self.head(self.embed(idx))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class SoftplusStack(nn.Module):
    """Layers built of ops outside the rule table that capture decomposes: softplus and its
    backward, and stack."""

    def __init__(self, width=64, layers=2):
        super().__init__()
        self.up = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(layers))

    def forward(self, x, y):
        for up, down in zip(self.up, self.down):
            h = up(x)
            both = torch.stack([F.softplus(h), torch.sigmoid(h)])
            x = x + down(both[0] * both[1])
        return F.mse_loss(x, y)


def tiny_llama(heads: int, positions: int, sequence: int = 8):
    """A two-layer Hugging Face Llama (width 32, vocabulary 64, ``heads`` attention heads over 2
    key-value heads) from seed 0, and the keywords it is called with: a batch of 8 sequences of
    ``sequence`` tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=heads,
                      num_key_value_heads=2, vocab_size=64, max_position_embeddings=positions, use_cache=False)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 64, (8, sequence))
    return model, {"input_ids": ids, "labels": ids}
