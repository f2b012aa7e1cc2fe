"""memory: per-device peak memory of a plan, by simulating its program (autopar.passes.recompute
runs it for the solved plan).

Parameters, their gradients and the optimizer state are held for the whole
step; everything else lives from the statement that allocates it to the last
statement that reads it (the emitted program deletes variables there). Views
share their input's storage. The peak is broken down by what is live at that
moment.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.lowering.schedule import RETURNS, Statement

# bytes of optimizer state per parameter element, beyond the parameter itself
OPTIMIZERS = {
    "sgd": lambda itemsize: 0,  # plain SGD keeps nothing
    "adam": lambda itemsize: 2 * itemsize,  # exp_avg and exp_avg_sq in the parameter's dtype
    "adam-mixed": lambda itemsize: 12,  # fp32 master copy, exp_avg, exp_avg_sq (2+2+12 with bf16 params, grads)
    # momentum; its curvature factors are per layer, counted with the pipeline (autopar.planning.bubbles)
    "kfac": lambda itemsize: itemsize,
}
CATEGORIES = ("parameters", "optimizer_state", "inputs", "gradients", "activations", "temporaries", "communication")


@dataclass(frozen=True)
class MemoryEstimate:
    peak_bytes: float
    breakdown: dict  # category -> bytes live at the peak
    timeline: tuple  # (variable, live bytes after its statement) in program order
    peak_at: str  # the statement (variable) where the peak occurs
    during: tuple = ()  # per statement, the bytes held while it runs (autopar.passes.recompute reads it)
    saved_bytes: float = 0.0  # forward values held where backward starts: what each micro-batch in flight keeps


def with_in_flight(memory: MemoryEstimate, in_flight: int) -> MemoryEstimate:
    """The memory of a device that keeps ``in_flight`` micro-batches' saved values at once (a
    pipeline stage's first micro-batches wait for their backward while later ones run forward):
    the other micro-batches' saved values are held all through this one's step."""
    extra = (in_flight - 1) * memory.saved_bytes
    if not extra:
        return memory
    breakdown = dict(memory.breakdown)
    breakdown["activations"] += extra
    return dataclasses.replace(memory, peak_bytes=memory.peak_bytes + extra, breakdown=breakdown,
                               timeline=tuple((v, held + extra) for v, held in memory.timeline),
                               during=tuple(held + extra for held in memory.during))


def optimizer_bytes_per_element(optimizer: str, itemsize: int) -> float:
    if optimizer not in OPTIMIZERS:
        raise AutoparError(f"unknown optimizer {optimizer!r}; autopar models {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[optimizer](itemsize)


def simulate(statements: list[Statement], graph, strategies, mesh, optimizer: str, offloaded=frozenset(),
             chunk_bytes=None, to_host=frozenset()) -> MemoryEstimate:
    """The program's memory. ``offloaded``: parameter placeholders whose value and optimizer state
    live in host memory (autopar.passes.offload); ``chunk_bytes``: per statement, the bytes of
    their chunks on the device then (counted as parameters); ``to_host``: gradient variables
    moved to host memory right after the statement that defines them
    (autopar.lowering.offload)."""
    persistent = _held_all_step(graph, strategies, mesh, optimizer, offloaded)
    chunks = chunk_bytes or [0.0] * len(statements)
    # what the programs return stays held by the caller: gradients, and forward's loss and values
    gradients = {v for s in statements if s.kind == "output" for v in s.uses}
    returned = gradients | {v for s in statements if s.kind == "forward_output" for v in s.uses}
    storages = _LiveStorages(gradients)
    peak, peak_breakdown, peak_at, timeline, during = -1.0, {}, "", [], []
    held_all_step = sum(persistent.values())
    saved = 0.0  # the activations live at forward's return: every one is kept for backward
    for s, on_device in zip(statements, chunks):
        if s.kind in ("placeholder",) + RETURNS:
            saved = storages.live["activations"] if s.kind == "forward_output" else saved
            during.append(held_all_step + storages.total() + on_device)
            continue
        sid = storages.allocate(s)
        now = storages.total() + s.scratch + on_device  # a rebound name's old value is still held here
        during.append(held_all_step + now)
        if now > peak:
            peak, peak_at = now, s.defines
            peak_breakdown = dict(storages.live)
            # a collective's buffers, or what a kernel holds while it runs (Rule.scratch_bytes)
            peak_breakdown["communication" if s.kind != "call" else "temporaries"] += s.scratch
            peak_breakdown["parameters"] += on_device
        storages.bind(s.defines, sid)
        for var in s.frees:
            if var not in returned:
                storages.release(var)
        if s.defines in to_host:
            storages.release(s.defines)
        timeline.append((s.defines, held_all_step + storages.total() + on_device))
    breakdown = {c: persistent[c] + peak_breakdown.get(c, 0.0) for c in CATEGORIES}
    return MemoryEstimate(sum(breakdown.values()), breakdown, tuple(timeline), peak_at, tuple(during), saved)


class _LiveStorages:
    """The storages a program holds at a point, by category: a view shares its base's storage,
    which is freed when the last name bound to it is."""

    def __init__(self, gradients: set):
        self.gradients = gradients
        self.storage_of: dict[str, int] = {}  # variable -> storage id
        self.refs: dict[int, int] = {}
        self.size: dict[int, float] = {}
        self.category: dict[int, str] = {}
        self.live = {c: 0.0 for c in CATEGORIES}

    def total(self) -> float:
        return sum(self.live.values())

    def allocate(self, s: Statement) -> int:
        """The storage ``s`` writes: its base's for a view, else a new one, counted as live."""
        if s.alias_of is not None and s.alias_of in self.storage_of:
            return self.storage_of[s.alias_of]
        sid = len(self.size)
        self.size[sid], self.refs[sid] = s.nbytes, 0
        self.category[sid] = _category(s, self.gradients)
        self.live[self.category[sid]] += s.nbytes
        return sid

    def bind(self, var: str, sid: int) -> None:
        """``var`` names storage ``sid`` from now on (rebinding a name drops its old value)."""
        if var in self.storage_of:
            self.release(var)
        self.storage_of[var] = sid
        self.refs[sid] += 1

    def release(self, var: str) -> None:
        sid = self.storage_of.pop(var, None)
        if sid is None:
            return
        self.refs[sid] -= 1
        if self.refs[sid] == 0:
            self.live[self.category[sid]] -= self.size[sid]


def _held_all_step(graph, strategies, mesh, optimizer: str, offloaded) -> dict:
    """By category, what the device holds all step: parameters (but the ``offloaded``) with their
    optimizer state, buffers and inputs."""
    persistent = {c: 0.0 for c in CATEGORIES}
    for ph in graph.params:
        if ph in offloaded:
            continue
        meta = graph.node(ph).outputs[0]
        n = math.prod(strategies[ph].out_specs[0].local_shape(meta.shape, mesh))
        persistent["parameters"] += n * meta.itemsize
        persistent["optimizer_state"] += n * optimizer_bytes_per_element(optimizer, meta.itemsize)
    for name in list(graph.inputs) + list(graph.buffers):
        meta = graph.node(name).outputs[0]
        if meta is not None:
            persistent["inputs" if name in graph.inputs else "parameters"] += \
                math.prod(strategies[name].out_specs[0].local_shape(meta.shape, mesh)) * meta.itemsize
    return persistent


def _category(s: Statement, gradients: set) -> str:
    if s.defines in gradients or (s.redistribution is not None and s.redistribution.consumers == ("output",)):
        return "gradients"
    if s.kind in ("move", "start", "wait"):
        return "communication"
    if s.node is not None and s.node.phase == "forward":
        return "activations"
    return "temporaries"
