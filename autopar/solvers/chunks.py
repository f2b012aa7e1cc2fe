"""Chunks and their moves, over plain arrays: packing tensors into fixed-size chunks, the
eviction schedule that moves the fewest chunks, and the time the moves add.

A step's program is a sequence of statements; ``needs[i]`` is the set of chunks statement ``i``
reads (or that hold storage a live value of it views). With ``slots`` chunks on the device at
once, evicting the chunk needed furthest in the future is optimal for the number of fetches
(Belady 1966, "A study of replacement algorithms for a virtual-storage computer"; with all
chunks of one size, fewest fetches is fewest bytes moved: the host keeps every chunk's master
copy, so an eviction moves nothing).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from autopar.ir.offload import EVICT, FETCH


def pack(sizes: list[int], capacity: int) -> list[list[int]]:
    """Items (by their sizes, in order) packed into chunks of ``capacity``, in order, a chunk
    closed when the next item does not fit; an item larger than a chunk is an error."""
    chunks: list[list[int]] = []
    used = capacity
    for i, size in enumerate(sizes):
        if size > capacity:
            raise ValueError(f"item {i} ({size}) is larger than a chunk ({capacity})")
        if used + size > capacity:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += size
    return chunks


@dataclass(frozen=True)
class Schedule:
    moves: tuple[tuple[int, str, int], ...]  # (statement it runs before, FETCH | EVICT, chunk)
    fetches: int
    resident: tuple[int, ...]  # chunks on the device during each statement

    def fetched_at(self) -> dict[int, list[int]]:
        """Statement -> chunks fetched right before it."""
        out: dict[int, list[int]] = {}
        for at, kind, chunk in self.moves:
            if kind == FETCH:
                out.setdefault(at, []).append(chunk)
        return out


def furthest_in_future(needs: list[frozenset], slots: int) -> Schedule:
    """The schedule of fewest fetches for ``needs`` with ``slots`` chunks on the device: a chunk
    is fetched when a statement needs it and it is away, into the slot of the resident chunk next
    needed furthest ahead. A move runs as early as it can: the eviction right after the victim's
    last need, and the fetch in its freed slot at once, so the copy has the most compute to hide
    under. Every chunk is evicted after its last need (``at`` may then be ``len(needs)``: after
the last statement)."""
    # only statements that need a chunk move anything: a step's program is mostly statements
    # that read no parameter, and walking them all for every candidate slot count was the cost
    needing = [(i, need) for i, need in enumerate(needs) if need]
    most = max((len(need) for _, need in needing), default=0)
    if most > slots:
        raise ValueError(f"a statement needs {most} chunks at once and only {slots} fit")
    uses: dict[int, list[int]] = {}
    for i, need in needing:
        for c in need:
            uses.setdefault(c, []).append(i)
    cursor = {c: 0 for c in uses}  # index into uses[c] of its next need
    resident: dict[int, int] = {}  # chunk -> the statement that needed it last
    moves, fetches = [], 0
    for i, need in needing:
        for c in need:
            cursor[c] += 1
        for c in sorted(need - resident.keys()):
            at = 0
            if len(resident) == slots:
                victim = max(resident.keys() - need, key=lambda v: (_next_use(uses[v], cursor[v]), v))
                at = resident.pop(victim) + 1
                moves.append((at, EVICT, victim))
            moves.append((at, FETCH, c))
            fetches += 1
            resident[c] = i
        for c in need:
            resident[c] = i
    moves += [(last + 1, EVICT, c) for c, last in sorted(resident.items())]
    moves.sort(key=lambda m: (m[0], m[1] == FETCH))  # at one statement, slots free before they fill
    return Schedule(tuple(moves), fetches, tuple(_resident_counts(moves, len(needs))))


def _next_use(uses: list[int], cursor: int) -> float:
    return uses[cursor] if cursor < len(uses) else math.inf


def _resident_counts(moves, length: int) -> list[int]:
    delta = [0] * (length + 1)
    for at, kind, _ in moves:
        delta[at] += 1 if kind == FETCH else -1
    return list(itertools.accumulate(delta))[:length]


def fewest_fetches_brute_force(needs: list[frozenset], slots: int) -> int:
    """The fewest fetches any eviction choices reach (exponential: for checking small traces)."""
    best = math.inf

    def walk(i: int, resident: frozenset, fetched: int):
        nonlocal best
        if fetched >= best:
            return
        if i == len(needs):
            best = fetched
            return
        missing = needs[i] - resident
        kept = resident | needs[i]
        over = len(kept) - slots
        if over <= 0:
            walk(i + 1, kept, fetched + len(missing))
            return
        for victims in itertools.combinations(sorted(resident - needs[i]), over):
            walk(i + 1, kept - frozenset(victims), fetched + len(missing))

    if any(len(n) > slots for n in needs):
        raise ValueError("a statement needs more chunks than fit")
    walk(0, frozenset(), 0)
    return int(best)


def stalls(durations: list[float], schedule: Schedule, needs: list[frozenset], copy_s: float,
           overlap: bool) -> tuple[float, float]:
    """(seconds the device waits for fetches, seconds the link is busy) of a step whose statements
    take ``durations``, each fetch ``copy_s``. With ``overlap`` the copies run beside compute,
    one at a time on the link, each started when its move is reached; without, each copy stops
    the program while it runs."""
    fetched_at = schedule.fetched_at()
    ready: dict[int, float] = {}
    now = link_free = waited = 0.0
    for i, duration in enumerate(durations):
        for c in fetched_at.get(i, ()):
            if overlap:
                link_free = max(now, link_free) + copy_s
                ready[c] = link_free
            else:
                now += copy_s
                waited += copy_s
                ready[c] = now
        start = max([now] + [ready.get(c, now) for c in needs[i]])
        waited += start - now
        now = start + duration
    return waited, schedule.fetches * copy_s
