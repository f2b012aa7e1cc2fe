"""offload: the third memory lever beside sharding and recomputation (PatrickStar, Fang et
al. 2021): parameters, with their gradients and optimizer state, kept in host memory in
fixed-size chunks that visit the device for the statements that read them.

For one layout (and the recomputation it already takes) ``best_offload`` sweeps the chunk size
and how many chunks live on the host, and keeps the fastest choice whose device peak fits the
budget and whose host bytes fit the device's share of host memory:

- parameters are packed per dtype in the order the program first reads them, so a chunk holds
  what the next statements read and a fetch brings its neighbours; the chunks read last in
  forward (first in backward) go to the host first, as they cross from forward to backward
  without a second fetch;
- the moves follow autopar.solvers.chunks.furthest_in_future (the fewest fetches, exact, as the
  program's order is known), with as many chunks on the device at once as the budget leaves room
  for;
- a view of a parameter that backward reads is recomputed in backward instead of saved (it
  costs nothing, and a saved view would hold its chunk on the device from forward to backward);
- the time it adds: the fetches the compute cannot hide (autopar.solvers.chunks.stalls), and the
  optimizer step of the offloaded state, on the host (the host's Adam) or streamed through the
  device chunk by chunk (parameters, gradients and state up, back down), whichever is faster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.ir.offload import Chunk, Move, Offload, OptimizerChoice
from autopar.lowering.memory import optimizer_bytes_per_element, simulate
from autopar.lowering.offload import gradients_to_host
from autopar.lowering.schedule import RETURNS, Statement, backward_start, schedule
from autopar.passes.base import PassContext
from autopar.passes.recompute import Recompute
from autopar.solvers.chunks import furthest_in_future, pack, stalls
from autopar.units import human_bytes

# chunk sizes swept: the offloadable bytes over these counts (never below the largest parameter,
# which must fit one chunk); PatrickStar sweeps its chunk size the same way, under the budget
_CHUNK_COUNTS = (4, 8, 16, 32, 64)
_MiB = 2**20


@dataclass(frozen=True)
class _Param:
    placeholder: str
    name: str
    dtype: str
    itemsize: int
    numel: int  # this rank's block
    has_grad: bool


class _Program:
    """One layout's step program as offload sees it: its statements, with the views of
    parameters that backward reads recomputed there, and which parameter each statement needs."""

    def __init__(self, graph, strategies, redistributions, ctx: PassContext, recomputed=()):
        self.graph, self.strategies, self.ctx = graph, strategies, ctx
        library = ctx.cost.hardware.collectives_library
        plain = schedule(graph, strategies, redistributions, ctx.mesh, recomputed, library)
        self.recomputed = tuple(recomputed) + _saved_parameter_views(plain, graph)
        self.statements = schedule(graph, strategies, redistributions, ctx.mesh, self.recomputed, library)
        self.params = _params(graph, strategies, ctx.mesh)
        self.reads = _parameter_reads(self.statements, graph)
        self.durations = [_duration(s, strategies) for s in self.statements]
        self._first_read: dict[str, int] = {}
        for i, read in enumerate(self.reads):
            for placeholder in read:
                self._first_read.setdefault(placeholder, i)

    def first_read(self, placeholder: str) -> int:
        return self._first_read.get(placeholder, len(self.reads))


def best_offload(graph, strategies, redistributions, ctx: PassContext, budget: float, recomputed=(),
                 recompute_s: float = 0.0) -> Recompute | None:
    """The fastest offload of this layout (with ``recomputed`` forward values, adding
    ``recompute_s``) that fits ``budget`` and the host's memory; None when none does."""
    program = _Program(graph, strategies, redistributions, ctx, recomputed)
    if not program.params:
        return None
    best = None
    for chunk_bytes in _chunk_sizes(program.params):
        found = _with_chunk_size(program, chunk_bytes, budget, ctx)
        if found is not None and (best is None or found.offload.added_s < best.offload.added_s):
            best = found
    if best is None:
        return None
    return Recompute(program.recomputed, recompute_s, best.memory, offload=best.offload)


@dataclass(frozen=True)
class _Found:
    offload: Offload
    memory: object  # MemoryEstimate


def _with_chunk_size(program: _Program, chunk_bytes: int, budget: float, ctx: PassContext) -> _Found | None:
    """The fewest chunks on the host (of this size) that fit the budget: each further chunk offloaded
    adds its moves and its optimizer step, so the fewest that fit is the fastest. Offloading more
    holds less on the device and more on the host, so the counts that fit both are a range: the
    host's bound is read off directly, the device's bisected."""
    chunks = _chunks(program, chunk_bytes)
    order = sorted(chunks, key=lambda c: -max(program.first_read(p.placeholder) for p in c))
    if ctx.request.offload is True:
        return _offloading(program, order, chunk_bytes, budget, ctx)
    most = _most_on_host(program, order, chunk_bytes, ctx)
    found, low, high = None, 1, most
    while low <= high:  # the fewest chunks, up to ``most``, whose offload fits the device
        count = (low + high) // 2
        attempt = _offloading(program, order[:count], chunk_bytes, budget, ctx)
        if attempt is None:
            low = count + 1
        else:
            found, high = attempt, count - 1
    return found


def _most_on_host(program: _Program, order: list, chunk_bytes: int, ctx: PassContext) -> int:
    """How many of ``order``'s chunks (from the first) the device's share of host memory holds."""
    share, optimizer = ctx.cost.hardware.host_memory_per_device, ctx.request.optimizer
    count, held = 0, 0.0
    for group in order:
        held += _host_bytes(group, chunk_bytes, optimizer)
        if held > share:
            break
        count += 1
    return count


def _offloading(program: _Program, offloaded: list, chunk_bytes: int, budget: float, ctx) -> _Found | None:
    hw, request = ctx.cost.hardware, ctx.request
    chunks = [_chunk(k, params, chunk_bytes) for k, params in enumerate(sorted(
        offloaded, key=lambda c: program.first_read(c[0].placeholder)))]
    host = sum(_host_bytes(group, chunk_bytes, request.optimizer) for group in offloaded)
    if host > hw.host_memory_per_device:
        return None
    of = {p: c.index for c in chunks for p in c.params}
    placeholder = {p.name: p.placeholder for p in program.params}
    gone = frozenset(placeholder[p] for p in of)
    chunk_of = {ph: of[name] for ph, name in program.graph.params.items() if name in of}
    needs = [frozenset(chunk_of[ph] for ph in read if ph in chunk_of) if read else read for read in program.reads]
    to_host = frozenset(gradients_to_host(program.statements, program.graph, set(of)))
    base = simulate(program.statements, program.graph, program.strategies, ctx.mesh, request.optimizer,
                    offloaded=gone, to_host=to_host).during
    found = _fewest_fetches_within(needs, base, chunk_bytes, budget, len(chunks))
    if found is None:
        return None
    slots, moves = found
    on_device = [n * chunk_bytes for n in moves.resident]
    memory = simulate(program.statements, program.graph, program.strategies, ctx.mesh, request.optimizer,
                      offloaded=gone, chunk_bytes=on_device, to_host=to_host)
    if memory.peak_bytes > budget:
        return None
    copy_s = hw.host_link.seconds(chunk_bytes)
    waited, busy = stalls(program.durations, moves, needs, copy_s, hw.host_copies_overlap)
    optimizer = _optimizer_choice(chunks, program.params, hw, request.optimizer, memory.during[-1], budget)
    offload = Offload(tuple(chunks), tuple(Move(*m) for m in moves.moves), slots, optimizer, busy, waited,
                      tuple(on_device), host, _reason(memory.peak_bytes, budget, chunks, slots))
    return _Found(offload, memory)


def _fewest_fetches_within(needs, base, chunk_bytes: int, budget: float, chunks: int):
    """(slots, schedule) with the most chunks on the device at once (the fewest fetches) whose
    peak fits; None when even the fewest slots every statement needs do not."""
    least = max((len(n) for n in needs), default=0)
    room = math.floor((budget - min(base)) / chunk_bytes)
    base = np.asarray(base, dtype=float)
    for slots in range(min(chunks, room), max(least, 1) - 1, -1):
        moves = furthest_in_future(needs, slots)
        if (base + np.asarray(moves.resident, dtype=float) * chunk_bytes).max() <= budget:
            return slots, moves
    return None


# the optimizers whose step autopar's runtime streams through the device, chunk by chunk
# (autopar.runtime.offload.DeviceStep: torch's Adam and AdamW)
_DEVICE_STEPPED = ("adam",)


def _optimizer_choice(chunks: list[Chunk], params: list[_Param], hw, optimizer: str, after_backward: float,
                      budget: float) -> OptimizerChoice:
    """Where the offloaded state's step runs: on the host (the gradients copied down in backward,
    then the host's Adam), or on the device (per chunk: parameters, gradients and state up, the step
    at the device's memory bandwidth, parameters and state back down), whichever is faster and fits:
    the device step holds one chunk's parameters, gradients, state and a temporary beside what the
    step holds after backward (``after_backward``)."""
    by_name = {p.name: p for p in params}
    stepped = [by_name[name] for c in chunks for name in c.params if by_name[name].has_grad]
    elements = sum(p.numel for p in stepped)
    param_bytes = sum(p.numel * p.itemsize for p in stepped)
    state_bytes = sum(p.numel * optimizer_bytes_per_element(optimizer, p.itemsize) for p in stepped)
    link = hw.host_link
    latency = len(chunks) * link.latency
    gradients_down = param_bytes / link.bandwidth + latency  # in backward, for either place
    host_s = gradients_down + elements / hw.host_optimizer_rate_per_device
    # up and down run at once (each direction has its own lanes): the longer one counts; the step
    # reads parameter, gradient and state and writes parameter and state
    up, down = 2 * param_bytes + state_bytes, param_bytes + state_bytes
    device_s = gradients_down + max(up, down) / link.bandwidth + 2 * latency + \
        (3 * param_bytes + 2 * state_bytes) / (hw.memory_bandwidth * hw.memory_efficiency)
    # a chunk's parameters, their gradients and state, and the step's one temporary (Adam's
    # denominator) at a time
    state_ratio = optimizer_bytes_per_element(optimizer, chunks[0].itemsize) / chunks[0].itemsize
    device_bytes = after_backward + (3 + state_ratio) * chunks[0].nbytes
    on_device = optimizer in _DEVICE_STEPPED and device_s < host_s and device_bytes <= budget
    return OptimizerChoice("device" if on_device else "host", host_s, device_s, device_bytes)


def _reason(peak: float, budget: float, chunks: list[Chunk], slots: int) -> str:
    return (f"{len(chunks)} chunks of {human_bytes(chunks[0].nbytes)} live in host memory, at most {slots} on the "
            f"device at once: the device peaks at {human_bytes(peak)} of its {human_bytes(budget)} budget")


def _host_bytes(group: list[_Param], chunk_bytes: int, optimizer: str) -> float:
    """Per device: one chunk of ``group``'s parameters, and their gradients and optimizer state."""
    capacity = chunk_bytes // group[0].itemsize * group[0].itemsize
    return capacity + sum(_stepped_bytes(p, optimizer) for p in group)


def _stepped_bytes(p: _Param, optimizer: str) -> float:
    """A parameter's gradient and optimizer state (none for a frozen one)."""
    return p.numel * (p.itemsize + optimizer_bytes_per_element(optimizer, p.itemsize)) if p.has_grad else 0.0


def _chunks(program: _Program, chunk_bytes: int) -> list[list[_Param]]:
    """The parameters packed per dtype, each dtype's in first-read order."""
    out = []
    ordered = sorted(program.params, key=lambda p: program.first_read(p.placeholder))
    for dtype in dict.fromkeys(p.dtype for p in ordered):
        same = [p for p in ordered if p.dtype == dtype]
        for members in pack([p.numel for p in same], chunk_bytes // same[0].itemsize):
            out.append([same[i] for i in members])
    return out


def _chunk(index: int, params: list[_Param], chunk_bytes: int) -> Chunk:
    offsets, at = [], 0
    for p in params:
        offsets.append(at)
        at += p.numel
    itemsize = params[0].itemsize
    return Chunk(index, params[0].dtype, chunk_bytes // itemsize, tuple(p.name for p in params), tuple(offsets),
                 tuple(p.numel for p in params), itemsize)


def _chunk_sizes(params: list[_Param]) -> list[int]:
    largest = max(p.numel * p.itemsize for p in params)
    total = sum(p.numel * p.itemsize for p in params)
    align = _MiB if largest >= 16 * _MiB else 4096
    sizes = {math.ceil(max(largest, total / count) / align) * align for count in _CHUNK_COUNTS}
    return sorted(sizes)


def _params(graph, strategies, mesh) -> list[_Param]:
    grads = set(graph.grads.values())
    out = []
    for ph, name in graph.params.items():
        meta = graph.node(ph).outputs[0]
        numel = math.prod(strategies[ph].out_specs[0].local_shape(meta.shape, mesh))
        if numel:
            out.append(_Param(ph, name, meta.dtype, meta.itemsize, int(numel), name in grads))
    return out


def _storage_bases(statements: list[Statement], graph) -> dict[str, str]:
    """variable -> the parameter placeholder whose storage it is or views."""
    base = {ph: ph for ph in graph.params}
    for s in statements:
        if s.alias_of is not None and s.alias_of in base and s.defines is not None:
            base[s.defines] = base[s.alias_of]
    return base


def _parameter_reads(statements: list[Statement], graph) -> list[frozenset]:
    """Per statement, the parameter placeholders whose storage it reads or a live variable views."""
    base = _storage_bases(statements, graph)
    live_until: dict[str, int] = {}
    defined: dict[str, int] = {}
    for i, s in enumerate(statements):
        if s.defines in base and s.kind != "placeholder":
            defined.setdefault(s.defines, i)
        for u in s.uses:
            if u in base and u not in graph.params:
                live_until[u] = i
    reads = [{base[u] for u in s.uses if u in graph.params} for s in statements]  # placeholders: where read
    for var, last in live_until.items():  # a view: from where it is made to its last read
        for i in range(defined.get(var, last), last + 1):
            reads[i].add(base[var])
    return [frozenset(r) for r in reads]


def _saved_parameter_views(statements: list[Statement], graph) -> tuple[str, ...]:
    """Forward variables that view a parameter and that backward reads."""
    base = _storage_bases(statements, graph)
    boundary = backward_start(statements)
    read_later = {u for s in statements[boundary:] for u in s.uses}
    return tuple(s.defines for s in statements[:boundary]
                 if s.kind not in ("placeholder",) + RETURNS and s.defines in base and s.defines in read_later)


def _duration(s: Statement, strategies) -> float:
    if s.kind == "call":
        return strategies[s.node.name].compute_s
    if s.kind == "move":
        return s.redistribution.step_seconds[s.step]
    return 0.0


def host_bytes_of_everything(graph, strategies, mesh, optimizer: str) -> float:
    """Per device: the host memory that offloading every parameter of this layout takes (their
    values, gradients and optimizer state, chunks packed without gaps)."""
    return sum(p.numel * p.itemsize + _stepped_bytes(p, optimizer) for p in _params(graph, strategies, mesh))
