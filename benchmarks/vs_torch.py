"""autopar's runtime against PyTorch's own parallel methods, measured on 4 local gloo processes.

    autopar calibrate                       # once: prices plans with this machine's spec
    python benchmarks/vs_torch.py [--hardware cpu] [--steps 5] [--rounds 3]

One GPT-style decoder (written here, apart from the examples the planner is tested on; its
attention reads the number of heads from its input, so DTensor's tensor parallelism can run it
unchanged) trains for SGD steps under five methods on 4 processes of one thread each:

- torch DDP (each rank its quarter of the batch) and autopar's ``dp`` baseline plan;
- DTensor's ColwiseParallel/RowwiseParallel on tp=4 and autopar's ``megatron-tp4`` plan;
- the plan autopar picks itself for 4 devices (``mesh=4``);
- with ``--compile``, the dp plan and the own pick again with ``compile=True`` (ratios to
  their uncompiled runs printed apart: they are not the targets' figures).

Every method runs once per round, rounds in turn (the machine is shared and noisy), and each
figure is the median over rounds of the slowest rank's median step. Printed: the step times,
autopar dp / DDP, autopar Megatron / DTensor TP, and autopar's own pick / the fastest torch
method. FSDP2 is not a CPU peer (gloo has no reduce-scatter). Last line:
`worst autopar/torch ratio: X.XX` (target <= 1.05 for the matched pairs, <= 1.00 for the pick).
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import autopar  # noqa: E402
from autopar.cost_models.hardware import get_hardware  # noqa: E402
from autopar.errors import AutoparError  # noqa: E402
from autopar.runtime.local_cluster import get_cluster  # noqa: E402
from benchmarks.cost_accuracy import measure  # noqa: E402

WORLD = 4
# baselines recognise a batch-carrying dim by its size: batch x sequence (512) is no other dim's
SEQ = 64


class Attention(nn.Module):
    def __init__(self, width: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.o = nn.Linear(width, width)

    def forward(self, x):
        b, t, _ = x.shape
        # the heads from the input's width, so a column-sharded projection (a rank's heads) works
        q, k, v = (lin(x).view(b, t, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Layer(nn.Module):
    def __init__(self, width: int, head_dim: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, head_dim)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    """About 6.8M parameters: vocabulary 4096, width 256, 6 layers, 4 heads, 128 positions."""

    def __init__(self, vocab: int = 4096, width: int = 256, layers: int = 6, head_dim: int = 64, seq: int = 128):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.layers = nn.ModuleList(Layer(width, head_dim) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _timed_steps(step, steps: int) -> float:
    """Median of ``steps`` timed calls of ``step`` after one warm-up, ranks aligned by barriers."""
    times = []
    for _i in range(steps + 1):
        torch.distributed.barrier()
        start = time.perf_counter()
        step()
        torch.distributed.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _sgd_step(model, opt, inputs):
    def step():
        opt.zero_grad()
        model(*inputs).backward()
        opt.step()
    return step


def run_ddp(rank, world_size, model_bytes, inputs, steps):
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    model = DistributedDataParallel(torch.load(io.BytesIO(model_bytes), weights_only=False))
    local = tuple(x.chunk(world_size)[rank] for x in inputs)
    return _timed_steps(_sgd_step(model, torch.optim.SGD(model.parameters(), lr=0.01), local), steps)


def run_dtensor_tp(rank, world_size, model_bytes, inputs, steps):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.set_num_threads(1)
    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {}
    for i in range(len(model.layers)):
        plan.update({f"layers.{i}.attn.{n}": ColwiseParallel() for n in ("q", "k", "v")})
        plan.update({f"layers.{i}.attn.o": RowwiseParallel(), f"layers.{i}.up": ColwiseParallel(),
                     f"layers.{i}.down": RowwiseParallel()})
    parallelize_module(model, mesh, plan)
    return _timed_steps(_sgd_step(model, torch.optim.SGD(model.parameters(), lr=0.01), inputs), steps)


def run_autopar(rank, world_size, model_bytes, inputs, plan_json, compile, steps):
    torch.set_num_threads(1)
    # the same SGD step, timed alike
    return measure(rank, world_size, model_bytes, inputs, plan_json, steps, compile=compile)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", default="cpu", help="the spec plans are priced with (default: this "
                                                          "machine's, from `autopar calibrate`)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--compile", action="store_true", help="also time the dp plan and the own pick with "
                                                               "compile=True (torch.compile, Inductor)")
    args = parser.parse_args()
    try:
        hw = get_hardware(args.hardware)
    except AutoparError as exc:
        sys.exit(f"vs_torch: {exc}")
    torch.manual_seed(0)
    model = Decoder()
    g = torch.Generator().manual_seed(1)
    inputs = tuple(torch.randint(0, 4096, (args.batch, SEQ), generator=g) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        baselines = autopar.baselines(model, inputs, devices=WORLD, hardware=hw, tp_degrees=[WORLD])
        plans = {"autopar dp": baselines["dp"], "autopar megatron-tp4": baselines[f"megatron-tp{WORLD}"],
                 "autopar own pick": autopar.plan(model, inputs, mesh=WORLD, hardware=hw)}
    buffer = io.BytesIO()
    torch.save(model, buffer)
    cluster = get_cluster(WORLD)
    jobs = {"torch DDP": (run_ddp,), "DTensor TP": (run_dtensor_tp,)}
    jobs.update({name: (run_autopar, plan.to_json(), False) for name, plan in plans.items()})
    if args.compile:
        jobs.update({f"{name} compiled": (run_autopar, plans[name].to_json(), True)
                     for name in ("autopar dp", "autopar own pick")})
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M-parameter decoder, batch {args.batch}x{SEQ}, "
          f"{WORLD} gloo processes of one thread; plans priced with {hw.name}; {args.rounds} rounds of "
          f"{args.steps} steps", flush=True)
    rounds: dict[str, list[float]] = {name: [] for name in jobs}
    for r in range(args.rounds):
        order = list(jobs)[r % len(jobs):] + list(jobs)[:r % len(jobs)]
        for name in order:
            fn, *extra = jobs[name]
            rounds[name].append(max(cluster.run(fn, buffer.getvalue(), inputs, *extra, args.steps)))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    ms = {name: 1e3 * statistics.median(times) for name, times in rounds.items()}
    for name, value in ms.items():
        plan = plans.get(name.removesuffix(" compiled"))
        mesh = f"  plan on {plan.mesh}" if plan is not None else ""
        print(f"{name:<22} {value:8.1f} ms per step{mesh}")
    ratios = {"autopar dp / torch DDP": ms["autopar dp"] / ms["torch DDP"],
              "autopar megatron-tp4 / DTensor TP": ms["autopar megatron-tp4"] / ms["DTensor TP"],
              "autopar own pick / fastest torch": ms["autopar own pick"] / min(ms["torch DDP"], ms["DTensor TP"])}
    for name, ratio in ratios.items():
        print(f"{name:<36} {ratio:.2f}")
    for name in [n for n in ms if n.endswith(" compiled")]:
        print(f"{name + ' / uncompiled':<36} {ms[name] / ms[name.removesuffix(' compiled')]:.2f}")
    print(f"worst autopar/torch ratio: {max(ratios.values()):.2f}")


if __name__ == "__main__":
    main()
