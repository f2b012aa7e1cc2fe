"""Measure this machine and fit a hardware spec: ``autopar calibrate --out cpu.json``.

Each "device" is one local gloo process, as in ``autopar.check``. Everything is
measured with every rank busy at once, as when a program runs: the ranks share
the cores, so a collective among 2 of 4 processes takes far longer than the same
collective in a world of 2. Compute is timed on every rank together; collectives
through the RankMesh calls emitted programs use, in groups of each size with all
groups of the world running together (as the groups of one mesh axis do).

Fits (least squares):
- matmul time t = (f + f_half) / rate, i.e. the efficiency curve f / (f + f_half);
- collective time t − floor = c + a·α + b·β, with a, b from the ring formulas of
  ``cost_models.collectives`` for each kind, size and group size, and c a fixed
  cost per call (on shared cores every rank of the group must be scheduled before
  the first ring step: a 4 KiB all-gather among 2 of 4 busy processes takes about
  1.2 ms, not one ring step's 0.5 ms);
- host link (offload) time t = latency + bytes / bandwidth, from copies into freshly allocated
  buffers, as the runtime moves a chunk between "device" and "host" (both CPU memory here).

Measured directly: the kernel floor, a view's host time, memory bandwidth, the node's Adam rate
(parameter elements per second through ``torch.optim.AdamW``, all ranks stepping at once, summed
over the node) and its physical memory (host memory; each "device" gets an equal share). Host
copies do not overlap compute here: both run on the same cores.
"""
from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable

import torch

from autopar.cost_models.collectives import as_run
from autopar.cost_models.hardware import Hardware, Link
from autopar.errors import AutoparError

MATMUL_SIZES = (64, 128, 256, 512, 768)
MESSAGE_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)
# chunk moves from the small chunks of test models (latency-bound) to the large ones of real models
HOST_COPY_BYTES = (64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
# parameters the optimizer rate is timed on, per rank: large enough that per-tensor overheads
# do not dominate, small enough for four ranks' Adam state to fit a small machine
OPTIMIZER_SHAPES = ((1024, 1024),) * 4


def calibrate(world_sizes=(2, 4), name: str = "local-cpu",
              progress: Callable[[str], None] | None = None) -> Hardware:
    """The spec fitted to this machine's measurements."""
    from autopar.runtime.local_cluster import get_cluster

    report = progress or (lambda msg: None)
    largest = max(world_sizes)
    uneven = [p for p in world_sizes if p < 2 or largest % p]
    if uneven:
        raise AutoparError(f"cannot measure collectives in groups of {', '.join(map(str, uneven))}: every group "
                           f"size must be at least 2 and divide the largest ({largest}), e.g. 2,4")
    report(f"starting {largest} local processes ...")
    cluster = get_cluster(largest)
    report("matmul throughput, all ranks at once ...")
    matmuls = cluster.run(_measure_matmuls, MATMUL_SIZES)[0]
    for f, t in matmuls:
        report(f"  {f / 1e6:9.1f} MFLOP: {f / t / 1e9:7.2f} GFLOP/s")
    floor, host_op, bandwidth = cluster.run(_measure_memory)[0]
    report(f"kernel floor {floor * 1e6:.1f} us, view {host_op * 1e6:.1f} us, "
           f"memory bandwidth {bandwidth / 1e9:.2f} GB/s")
    collectives = []
    for p in sorted(world_sizes):
        report(f"gloo collectives in groups of {p}, all {largest} processes at once ...")
        rows = cluster.run(_measure_collectives, p, MESSAGE_BYTES)[0]
        for kind, nbytes, seconds in rows:
            report(f"  {kind:<15} {nbytes / 1024:>8.0f} KiB: {seconds * 1e6:9.1f} us")
            collectives.append((kind, p, nbytes, seconds))
    host_link, host_optimizer_rate = _host_figures(cluster, report)
    rate, half = fit_compute(matmuls)
    emulated = ("reduce_scatter", "all_to_all")  # gloo lacks them; RankMesh composes them
    launch, alpha, beta = fit_link(collectives, floor, emulated)
    report(f"fit: {rate / 1e9:.2f} GFLOP/s (half at {half / 1e6:.1f} MFLOP), collective launch "
           f"{launch * 1e6:.1f} us, alpha {alpha * 1e6:.1f} us, bandwidth {1 / beta / 1e9:.2f} GB/s")
    link = Link(bandwidth=1.0 / beta, latency=alpha)
    return Hardware(name=name, peak_flops=rate, memory_bytes=_memory_bytes() / largest, memory_bandwidth=bandwidth,
                    intra_node=link, inter_node=link, devices_per_node=largest, compute_efficiency=1.0,
                    half_efficiency_flops=half, memory_efficiency=1.0, kernel_floor_s=floor, host_op_s=host_op,
                    collective_launch_s=launch, fp32_flops_ratio=1.0, emulated_collectives=emulated,
                    collectives_library="gloo", host_link=host_link, host_memory_bytes=_memory_bytes(),
                    host_optimizer_rate=host_optimizer_rate, host_copies_overlap=False)


def _host_figures(cluster, report) -> tuple[Link, float]:
    """(host link, node's Adam rate) for offload, each timed on every rank at once."""
    report("host copies (offload moves), all ranks at once ...")
    copies = cluster.run(_measure_host_copies, HOST_COPY_BYTES)[0]
    for nbytes, seconds in copies:
        report(f"  {nbytes / 1024:>8.0f} KiB: {seconds * 1e6:9.1f} us, {nbytes / seconds / 1e9:6.2f} GB/s")
    link = fit_host_link(copies)
    report(f"fit: host link {link.bandwidth / 1e9:.2f} GB/s, latency {link.latency * 1e6:.1f} us")
    per_rank = cluster.run(_measure_host_optimizer, OPTIMIZER_SHAPES)[0]
    # the field is per node (the planner divides it among the node's devices): all ranks stepped at once
    rate = per_rank * cluster.world_size
    report(f"host optimizer (AdamW, fp32): {per_rank / 1e6:.1f} M elements/s per rank, "
           f"{rate / 1e6:.1f} M/s for the node")
    return link, rate


def fit_compute(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """(rate, f_half) from (flops, seconds) pairs: t = f / rate + f_half / rate, fitted on
    relative error so small kernels (where the curve matters) count as much as large ones."""
    slope, intercept = _relative_lstsq([[f, 1.0] for f, _ in samples], [t for _, t in samples])
    rate = 1.0 / slope
    return rate, max(0.0, intercept * rate)


def fit_host_link(samples: list[tuple[float, float]]) -> Link:
    """The link t = latency + bytes / bandwidth through (bytes, seconds) pairs, on relative error;
    the latency is dropped (0) where the data make it negative."""
    latency, per_byte = _relative_lstsq([[1.0, n] for n, _ in samples], [t for _, t in samples])
    if latency < 0:
        latency, (per_byte,) = 0.0, _relative_lstsq([[n] for n, _ in samples], [t for _, t in samples])
    return Link(bandwidth=1.0 / max(per_byte, 1e-15), latency=latency)


def ring_terms(kind: str, p: int, nbytes: float, emulated=()) -> tuple[float, float]:
    """(latency steps, bytes per link) of a ring collective: time = steps·α + bytes·β."""
    kind, nbytes = as_run(kind, nbytes, p, emulated)
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * (p - 1) / p * nbytes
    return p - 1, (p - 1) / p * nbytes


def fit_link(samples: list[tuple[str, int, float, float]], floor: float,
             emulated=()) -> tuple[float, float, float]:
    """(per-call launch, α, β) minimising the squared relative error over all collectives; the
    launch is dropped (0) where the data make it negative."""
    terms = [ring_terms(kind, p, nbytes, emulated) for kind, p, nbytes, _ in samples]
    rhs = [max(seconds - floor, 0.0) for *_, seconds in samples]
    weights = [1.0 / t for *_, t in samples]
    launch, alpha, beta = _relative_lstsq([[1.0, a, b] for a, b in terms], rhs, weights)
    if launch < 0:
        launch, (alpha, beta) = 0.0, _relative_lstsq([list(t) for t in terms], rhs, weights)
    return launch, max(alpha, 1e-7), max(beta, 1e-12)


def _relative_lstsq(rows, rhs, weights=None) -> list[float]:
    """Least squares of rows·x ≈ rhs, each equation scaled by its weight (default 1/rhs)."""
    weights = weights or [1.0 / y for y in rhs]
    a = torch.tensor([[v * w for v in row] for row, w in zip(rows, weights)], dtype=torch.float64)
    b = torch.tensor([y * w for y, w in zip(rhs, weights)], dtype=torch.float64).unsqueeze(1)
    return [float(v) for v in torch.linalg.lstsq(a, b).solution.squeeze(1)]


def _median_time(fn, repeats: int) -> float:
    import torch.distributed as dist

    fn()  # warm up
    times = []
    for _ in range(repeats):
        dist.barrier()  # every rank starts together, as in a program
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Ranks leave a barrier milliseconds apart on shared cores, so a window of one short kernel
# often runs alone and times the whole machine's speed, not this rank's share (a 768^3 matmul
# timed singly read 110 GFLOP/s; sustained beside three others, 70). Each timed window holds
# about this many seconds of work at 100 GFLOP/s, so the ranks' windows overlap nearly fully.
_WINDOW_S = 0.1


def _per_call(fn, calls: int, repeats: int = 5) -> float:
    """Median seconds per call of ``fn`` over windows of ``calls`` back-to-back calls on every rank."""
    return _median_time(lambda: [fn() for _ in range(calls)], repeats) / calls


def _measure_matmuls(rank, world_size, sizes):
    out = []
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        flops = 2.0 * n ** 3
        calls = max(1, int(_WINDOW_S * 1e11 / flops))  # ~0.1 s at 100 GFLOP/s
        out.append((flops, _per_call(functools.partial(torch.mm, a, b), calls)))
    return out


def _measure_memory(rank, world_size):
    """(kernel floor, host time of a view, memory bandwidth), calling ops as emitted programs do."""
    aten = torch.ops.aten
    tiny = torch.ones(1)
    floor = _per_call(lambda: aten.add.Tensor(tiny, tiny), calls=20000)
    view = _per_call(lambda: aten.view.default(tiny, [1]), calls=20000)
    big = torch.randn(1 << 22)
    out = torch.empty_like(big)
    seconds = _per_call(lambda: torch.add(big, 1, out=out), calls=30)
    return floor, view, 2 * big.numel() * big.element_size() / seconds


def _measure_host_copies(rank, world_size, sizes):
    """(bytes, seconds) of a chunk's move: allocate the destination and copy into it, as the
    runtime does (a fresh buffer pays its page faults, which a reused one would hide)."""
    out = []
    for nbytes in sizes:
        src = torch.randn(nbytes // 4)
        calls = max(1, int(_WINDOW_S * 1e10 / nbytes))  # ~0.1 s at 10 GB/s
        out.append((nbytes, _per_call(functools.partial(_fresh_copy, src), calls)))
    return out


def _fresh_copy(src: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(src).copy_(src)


def _measure_host_optimizer(rank, world_size, shapes):
    """Parameter elements per second this rank takes through an fp32 AdamW step."""
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params)  # default foreach: the optimizer users build (see parallelize.py)
    opt.step()  # the first step allocates the moments: not part of the steady rate
    seconds = _per_call(opt.step, calls=3)
    return sum(p.numel() for p in params) / seconds


def _measure_collectives(rank, world_size, group, sizes):
    """(kind, bytes, seconds) of collectives over axis "x": groups of ``group`` ranks, all at once."""
    from autopar.ir.mesh import Mesh
    from autopar.runtime.rank_mesh import RankMesh

    rest = world_size // group
    rm = RankMesh(Mesh(("rest", "x"), (rest, group)) if rest > 1 else Mesh(("x",), (group,)))
    rows = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 4)
        local = torch.randn(nbytes // 4 // group)
        # every call moves a message of nbytes as the cost model counts it (see collectives.py)
        ops = {
            "all_reduce": functools.partial(rm.all_reduce, x, "x"),
            "all_gather": functools.partial(rm.all_gather, local, "x", 0),
            "reduce_scatter": functools.partial(rm.reduce_scatter, x, "x", 0),
            "all_to_all": functools.partial(rm.all_to_all, x, "x", 0, 0),
        }
        repeats = 30 if nbytes < (1 << 20) else 12
        for kind, fn in ops.items():
            rows.append((kind, nbytes, _median_time(fn, repeats)))
    return rows


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16e9
