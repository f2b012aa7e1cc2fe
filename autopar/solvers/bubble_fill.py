"""Placing deferrable work into the idle gaps (bubbles) of a pipeline step, over plain data.

A pipelined step leaves every rank idle between some of its actions: while it
waits for an activation or a gradient from a neighbour, and before the step's
end. PipeFisher (Osawa et al., MLSys 2023) fills those gaps with the work of a
second-order optimizer (K-FAC curvature, its inversion, preconditioning) that
need not run the moment its inputs exist. Work that fits no gap runs after the
step on its rank (the "tail") and lengthens that step; the aim is the least
step time, averaged over a refresh cycle.

The model, and why:

- A step lasts ``step_end_s``; each rank's gaps (``Gap``) are the same in every
  step, so a refresh cycle of R steps is R phases with identical gaps.
- Work comes as items (``Item``), given in a topological order. An item pinned
  to a phase is per-step work (it runs in that step); an unpinned one belongs to
  the refresh cycle and may run in any phase. Spreading cycle work over R steps is
  what lets it fit: the curvature need not be refreshed every step.
- Items placed in one gap of one phase run back to back from the gap's start in
  the order they were placed: the runtime launches them when the gap's action
  ends and never waits inside a gap. So an item's start in a gap is the gap's
  start plus the time already used there, and it fits only if its inputs are
  released and its dependencies have finished by then, and it ends
  ``margin_s`` before the gap does: the slack PipeFisher keeps so that filled
  work never delays the pipeline's own next action.
- An item that fits no gap goes to the tail: after the step's end, its rank's
  earlier tail work, its dependencies (same phase) and its release. That phase's
  step then lasts until its last tail item ends.
- An item's inputs are held from its release until it starts; deferring it holds
  them longer. On a rank with a ``headroom_bytes`` entry, a placement must keep
  the bytes held (by it and the items placed before it, in that phase) within
  the headroom over the time it holds them. Tail placements obey it too, except
  when no placement of the item (gap or tail, in any phase it may take) does:
  then it goes to the tail anyway, since the work must run, and the memory held
  past the headroom is left for memory planning to see. So ``verify`` checks the
  headroom for gap placements only.
- A cycle item runs in a phase no earlier than its dependencies' and no later
  than any pinned item that depends on it (directly or through others), so a
  fill never strands a pinned item behind its inputs.

``greedy`` is PipeFisher's first-fit placement; ``exact`` searches every choice
of small instances, to measure how far the greedy is from the optimum; ``verify``
checks a fill against the model without reusing the placement code. (The refresh
period is the planner's: autopar.planning.bubbles tries cycles of growing length.)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.ir.bubbles import TAIL  # Placed.after for work that runs after the step's end

_EPS = 1e-9  # relative slack: sums of float durations land a hair past exact bounds


@dataclass(frozen=True)
class Gap:
    rank: int
    after: str  # label of the pipeline action whose end opens this gap, e.g. "1W3"
    start_s: float  # that action's end
    end_s: float  # the next action's start on this rank, or the step's end for the rank's last gap


@dataclass(frozen=True)
class Item:
    name: str
    rank: int
    duration_s: float
    bytes: float = 0.0  # memory held from its release until it starts (deferred inputs)
    release_s: float = 0.0  # earliest start within a step (the end of the action whose outputs it reads)
    deps: tuple[str, ...] = ()  # items that must finish before it starts (same phase and earlier, or an earlier phase)
    phase: int | None = None  # None: refresh-cycle work, any phase 0..R-1; an int: pinned there (per-step work)


@dataclass(frozen=True)
class Placed:
    item: str
    phase: int
    rank: int
    after: str  # the gap's action label, or TAIL when it runs past the step's end
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Fill:
    placed: tuple[Placed, ...]  # every item exactly once, in the items' order
    refresh: int  # R: the number of phases (steps) a refresh cycle spans
    step_s: tuple[float, ...]  # per phase: the step's time with its overflow

    @property
    def mean_step_s(self) -> float:
        """The step time amortized over the refresh cycle."""
        return sum(self.step_s) / len(self.step_s)


@dataclass(frozen=True)
class _Problem:
    items: tuple[Item, ...]
    by_name: Mapping[str, Item]
    gaps: Mapping[int, tuple[Gap, ...]]  # per rank, in time order
    step_end_s: float
    refresh: int
    margin_s: float
    headroom: Mapping[int, float]
    phases: Mapping[str, tuple[int, int]]  # per item: the (earliest, latest) phase the pins around it allow


def _le(a: float, b: float) -> bool:
    return a <= b + _EPS * max(abs(a), abs(b))


def _problem(items: Sequence[Item], gaps: Sequence[Gap], step_end_s: float, refresh: int, margin_s: float,
             headroom_bytes: Mapping[int, float] | None) -> _Problem:
    if refresh < 1:
        raise AutoparError(f"refresh must be at least 1 (one step per cycle), got {refresh}")
    if margin_s < 0:
        raise AutoparError(f"margin_s must not be negative, got {margin_s}")
    items = tuple(items)
    by_name = _check_items(items, refresh)
    return _Problem(items, by_name, _gaps_by_rank(gaps, step_end_s), step_end_s, refresh, margin_s,
                    dict(headroom_bytes or {}), _phase_bounds(items, refresh))


def _check_items(items: tuple[Item, ...], refresh: int) -> dict[str, Item]:
    """The items by name, after checking the names, the topological order and the pins."""
    by_name: dict[str, Item] = {}
    names = {item.name for item in items}
    for item in items:
        if item.name in by_name:
            raise AutoparError(f"item {item.name!r} is given twice; give each item once")
        for dep in item.deps:
            if dep not in names:
                raise AutoparError(f"item {item.name!r} depends on {dep!r}, which is not an item")
            if dep not in by_name:
                raise AutoparError(f"item {item.name!r} depends on {dep!r}, which comes later in the list; "
                                   "give the items in a topological order")
        if item.phase is not None and not 0 <= item.phase < refresh:
            raise AutoparError(f"item {item.name!r} is pinned to phase {item.phase}, outside a refresh cycle of "
                               f"{refresh} phases; raise the refresh or pin it to a phase below {refresh}")
        if item.duration_s < 0 or item.bytes < 0:
            raise AutoparError(f"item {item.name!r} has a negative duration or size")
        by_name[item.name] = item
    return by_name


def _gaps_by_rank(gaps: Sequence[Gap], step_end_s: float) -> dict[int, tuple[Gap, ...]]:
    """Each rank's gaps in time order, after checking that they lie in the step and are named once."""
    out: dict[int, list[Gap]] = {}
    for gap in gaps:
        if gap.after == TAIL:
            raise AutoparError(f"a gap on rank {gap.rank} is named {TAIL!r}, the name of the overflow; rename it")
        if not gap.start_s <= gap.end_s or not _le(gap.end_s, step_end_s):
            raise AutoparError(f"gap after {gap.after!r} on rank {gap.rank} spans [{gap.start_s}, {gap.end_s}], "
                               f"not an interval within the step (which ends at {step_end_s})")
        if any(other.after == gap.after for other in out.get(gap.rank, ())):
            raise AutoparError(f"rank {gap.rank} has two gaps after {gap.after!r}; label each gap once")
        out.setdefault(gap.rank, []).append(gap)
    return {rank: tuple(sorted(own, key=lambda g: g.start_s)) for rank, own in out.items()}


def _phase_bounds(items: tuple[Item, ...], refresh: int) -> dict[str, tuple[int, int]]:
    """Per item, the phases it may take: a cycle item runs no earlier than its dependencies' pins allow
    and no later than the pinned items that (transitively) depend on it, else one of them cannot run."""
    earliest: dict[str, int] = {}
    for item in items:
        after = max((earliest[d] for d in item.deps), default=0)
        if item.phase is not None and item.phase < after:
            raise AutoparError(f"item {item.name!r} is pinned to phase {item.phase} but depends on work pinned to "
                               f"phase {after}; a dependency must run in the same or an earlier phase")
        earliest[item.name] = after if item.phase is None else item.phase
    latest = {item.name: refresh - 1 if item.phase is None else item.phase for item in items}
    for item in reversed(items):
        for dep in item.deps:
            latest[dep] = min(latest[dep], latest[item.name])
    for item in items:
        if earliest[item.name] > latest[item.name]:
            raise AutoparError(f"item {item.name!r} must run in phase {earliest[item.name]} or later (its "
                               f"dependencies' pins) but by phase {latest[item.name]} (its dependants' pins)")
    return {item.name: (earliest[item.name], latest[item.name]) for item in items}


def _peak(held: Sequence[tuple[float, float, float]], lo: float, hi: float) -> float:
    """The most bytes held at once during [lo, hi) by (release, start, bytes) holdings: the sum can only
    rise at a release, so it peaks at lo or at a release inside the interval."""
    instants = [lo] + [release for release, _, _ in held if lo < release < hi]
    return max(sum(b for release, start, b in held if release <= t < start) for t in instants)


def _within_headroom(prob: _Problem, placed: tuple[Placed, ...], cand: Placed) -> bool:
    """Whether ``cand`` keeps the bytes held on its rank and phase, by it and the items placed before it,
    within the headroom while it holds its inputs."""
    limit = prob.headroom.get(cand.rank)
    item = prob.by_name[cand.item]
    if limit is None or item.bytes <= 0 or cand.start_s <= item.release_s:
        return True  # holds nothing, so adds nothing to what is already held
    held = [(prob.by_name[p.item].release_s, p.start_s, prob.by_name[p.item].bytes) for p in placed
            if p.phase == cand.phase and p.rank == cand.rank]
    held.append((item.release_s, cand.start_s, item.bytes))
    return _le(_peak(held, item.release_s, cand.start_s), limit)


def _deps_done(done: Mapping[str, Placed], item: Item, phase: int, start_s: float) -> bool:
    return all(done[d].phase < phase or (done[d].phase == phase and _le(done[d].end_s, start_s)) for d in item.deps)


def _in_gap(prob: _Problem, done: Mapping[str, Placed], item: Item, phase: int, gap: Gap) -> Placed | None:
    """The item's placement at the end of what is already in ``gap`` in ``phase``, or None where it does not fit."""
    start = max((p.end_s for p in done.values() if p.phase == phase and p.rank == gap.rank and p.after == gap.after),
                default=gap.start_s)
    end = start + item.duration_s
    if not (_le(item.release_s, start) and _le(end, gap.end_s - prob.margin_s)
            and _deps_done(done, item, phase, start)):
        return None
    return Placed(item.name, phase, gap.rank, gap.after, start, end)


def _in_tail(prob: _Problem, done: Mapping[str, Placed], item: Item, phase: int) -> Placed:
    """The item's placement after the step's end in ``phase`` (no earlier than its dependencies' phases): after
    its rank's tail work there, its inputs' release and the ends of its dependencies in that phase."""
    start = max([prob.step_end_s, item.release_s]
                + [p.end_s for p in done.values() if p.phase == phase and p.rank == item.rank and p.after == TAIL]
                + [done[d].end_s for d in item.deps if done[d].phase == phase])
    return Placed(item.name, phase, item.rank, TAIL, start, start + item.duration_s)


def _choices(prob: _Problem, placed: tuple[Placed, ...], item: Item) -> list[Placed]:
    """Every placement the model allows ``item`` after ``placed``: the gaps (phase by phase, each in time order),
    then the tails; the tails that break the headroom only when nothing else is left."""
    done = {p.item: p for p in placed}
    first, last = prob.phases[item.name]
    phases = range(max([first] + [done[d].phase for d in item.deps]), last + 1)
    gaps = [c for phase in phases for gap in prob.gaps.get(item.rank, ())
            if (c := _in_gap(prob, done, item, phase, gap)) is not None and _within_headroom(prob, placed, c)]
    tails = [_in_tail(prob, done, item, phase) for phase in phases]
    kept = [c for c in tails if _within_headroom(prob, placed, c)]
    return gaps + kept if gaps or kept else tails


def _steps(prob: _Problem, placed: tuple[Placed, ...]) -> tuple[float, ...]:
    return tuple(max([prob.step_end_s] + [p.end_s for p in placed if p.phase == phase and p.after == TAIL])
                 for phase in range(prob.refresh))


def greedy(items: Sequence[Item], gaps: Sequence[Gap], step_end_s: float, refresh: int, margin_s: float = 0.0,
           headroom_bytes: Mapping[int, float] | None = None) -> Fill:
    """PipeFisher's first fit: each item in the given order goes into the first gap it fits (earliest phase
    first, then in time order), else into the tail of the phase whose step that lengthens least (among the
    tails within the headroom when there are any; ties: the lowest phase). The given order is kept, not sorted
    by release, so dependencies always come first."""
    prob = _problem(items, gaps, step_end_s, refresh, margin_s, headroom_bytes)
    placed: tuple[Placed, ...] = ()
    for item in prob.items:
        options = _choices(prob, placed, item)
        choice = next((c for c in options if c.after != TAIL), None)
        if choice is None:
            steps = _steps(prob, placed)
            choice = min(options, key=lambda c: (max(steps[c.phase], c.end_s), c.phase))
        placed += (choice,)
    return Fill(placed, refresh, _steps(prob, placed))


def _held_byte_s(prob: _Problem, placed: tuple[Placed, ...]) -> float:
    """Bytes times seconds held by deferred inputs: the tie-break between fills of equal step time."""
    return sum(prob.by_name[p.item].bytes * (p.start_s - prob.by_name[p.item].release_s) for p in placed)


@dataclass
class _Search:
    """Depth-first search state; mutable because the incumbent and the count change as the search runs."""
    prob: _Problem
    limit: int
    visited: int = 0
    best_key: tuple[float, float] = (float("inf"), float("inf"))
    best: tuple[Placed, ...] = ()

    def visit(self, placed: tuple[Placed, ...]) -> None:
        steps = _steps(self.prob, placed)
        # step times and held bytes only grow as items are added, so a prefix's key bounds its completions
        key = (sum(steps) / len(steps), _held_byte_s(self.prob, placed))
        if key >= self.best_key:
            return
        if len(placed) == len(self.prob.items):
            self.best_key, self.best = key, placed
            return
        for cand in _choices(self.prob, placed, self.prob.items[len(placed)]):
            self.visited += 1
            if self.visited > self.limit:
                raise AutoparError(f"the exact bubble fill passed {self.limit} assignments; it is meant for small "
                                   "instances: use greedy, or raise the limit")
            self.visit(placed + (cand,))


def exact(items: Sequence[Item], gaps: Sequence[Gap], step_end_s: float, refresh: int, margin_s: float = 0.0,
          headroom_bytes: Mapping[int, float] | None = None, limit: int = 200_000) -> Fill:
    """The least mean step time the model allows (ties: the fewest bytes·seconds held, then the first found),
    by depth-first search over every item's phase and gap or tail, items taken in the given order.
    ``limit`` bounds the partial assignments the search visits."""
    prob = _problem(items, gaps, step_end_s, refresh, margin_s, headroom_bytes)
    search = _Search(prob, limit)
    search.visit(())
    return Fill(search.best, refresh, _steps(prob, search.best))


def verify(fill: Fill, items: Sequence[Item], gaps: Sequence[Gap], step_end_s: float, margin_s: float,
           headroom_bytes: Mapping[int, float] | None = None) -> None:
    """Check ``fill`` against the model from the placements alone; raise AutoparError naming the first
    violation. The headroom is checked for gap placements (a tail placement may be forced past it)."""
    by_name = _check_items(tuple(items), fill.refresh)
    placed = _check_once(fill, items)
    gap_at = {(g.rank, g.after): g for g in gaps}
    for p in placed.values():
        _check_slot(p, by_name[p.item], fill.refresh, gap_at, step_end_s, margin_s)
    _check_back_to_back(placed, gap_at)
    _check_order(placed, by_name)
    _check_overlaps(placed)
    _check_steps(fill, placed, step_end_s)
    _check_memory(placed, items, dict(headroom_bytes or {}))


def _check_once(fill: Fill, items: Sequence[Item]) -> dict[str, Placed]:
    placed: dict[str, Placed] = {}
    for p in fill.placed:
        if p.item in placed:
            raise AutoparError(f"item {p.item!r} is placed twice")
        placed[p.item] = p
    missing = [item.name for item in items if item.name not in placed]
    extra = sorted(set(placed) - {item.name for item in items})
    if missing or extra:
        raise AutoparError(f"the fill misses items {missing} and places unknown items {extra}")
    return placed


def _check_slot(p: Placed, item: Item, refresh: int, gap_at: Mapping[tuple[int, str], Gap], step_end_s: float,
                margin_s: float) -> None:
    """One placement on its own: rank, phase, duration, and within its gap (less the margin) or past the step."""
    if p.rank != item.rank:
        raise AutoparError(f"item {p.item!r} of rank {item.rank} is placed on rank {p.rank}")
    if not 0 <= p.phase < refresh or (item.phase is not None and p.phase != item.phase):
        raise AutoparError(f"item {p.item!r} is placed in phase {p.phase}, outside its pin {item.phase} or the cycle")
    if abs(p.end_s - p.start_s - item.duration_s) > _EPS * max(1.0, item.duration_s):
        raise AutoparError(f"item {p.item!r} runs {p.end_s - p.start_s}s, not its duration {item.duration_s}s")
    if p.after == TAIL:
        if not _le(step_end_s, p.start_s):
            raise AutoparError(f"item {p.item!r} is in the tail but starts at {p.start_s}, before the step's end")
        return
    gap = gap_at.get((p.rank, p.after))
    if gap is None:
        raise AutoparError(f"item {p.item!r} is placed after {p.after!r}, not a gap of rank {p.rank}")
    if not (_le(gap.start_s, p.start_s) and _le(p.end_s, gap.end_s - margin_s)):
        raise AutoparError(f"item {p.item!r} runs [{p.start_s}, {p.end_s}], outside gap {p.after!r} "
                           f"[{gap.start_s}, {gap.end_s}] less the margin {margin_s}")


def _check_back_to_back(placed: Mapping[str, Placed], gap_at: Mapping[tuple[int, str], Gap]) -> None:
    """The items of one gap in one phase run one after another from the gap's start, with no wait."""
    runs: dict[tuple[int, int, str], list[Placed]] = {}
    for p in placed.values():
        if p.after != TAIL:
            runs.setdefault((p.phase, p.rank, p.after), []).append(p)
    for (phase, rank, after), run in runs.items():
        clock = gap_at[rank, after].start_s
        for p in sorted(run, key=lambda q: q.start_s):
            if abs(p.start_s - clock) > _EPS * max(1.0, clock):
                raise AutoparError(f"item {p.item!r} starts at {p.start_s} in gap {after!r} of phase {phase}, "
                                   f"not when the work before it there ends ({clock}): items never wait in a gap")
            clock = p.end_s


def _check_order(placed: Mapping[str, Placed], by_name: Mapping[str, Item]) -> None:
    for p in placed.values():
        item = by_name[p.item]
        if not _le(item.release_s, p.start_s):
            raise AutoparError(f"item {p.item!r} starts at {p.start_s}, before its release at {item.release_s}")
        for d in item.deps:
            dep = placed[d]
            if not (dep.phase < p.phase or (dep.phase == p.phase and _le(dep.end_s, p.start_s))):
                raise AutoparError(f"item {p.item!r} (phase {p.phase}, start {p.start_s}) starts before its "
                                   f"dependency {d!r} (phase {dep.phase}, end {dep.end_s}) ends")


def _check_overlaps(placed: Mapping[str, Placed]) -> None:
    lanes: dict[tuple[int, int], list[Placed]] = {}
    for p in placed.values():
        lanes.setdefault((p.phase, p.rank), []).append(p)
    for (phase, rank), lane in lanes.items():
        lane.sort(key=lambda q: (q.start_s, q.end_s))
        for before, after in zip(lane, lane[1:]):
            if not _le(before.end_s, after.start_s):
                raise AutoparError(f"items {before.item!r} and {after.item!r} overlap on rank {rank} in phase {phase}")


def _check_steps(fill: Fill, placed: Mapping[str, Placed], step_end_s: float) -> None:
    if len(fill.step_s) != fill.refresh:
        raise AutoparError(f"the fill has {len(fill.step_s)} step times for a cycle of {fill.refresh} phases")
    for phase, step in enumerate(fill.step_s):
        want = max([step_end_s] + [p.end_s for p in placed.values() if p.phase == phase and p.after == TAIL])
        if abs(step - want) > _EPS * max(1.0, want):
            raise AutoparError(f"phase {phase}'s step time is {step}, but its tail ends at {want}")


def _check_memory(placed: Mapping[str, Placed], items: Sequence[Item], headroom: Mapping[int, float]) -> None:
    """Each gap placement, with the items before it in the list on its rank and phase, holds within the headroom
    while it holds its inputs (the rule each placement was made under)."""
    for index, item in enumerate(items):
        p = placed[item.name]
        limit = headroom.get(p.rank)
        if limit is None or p.after == TAIL or item.bytes <= 0 or p.start_s <= item.release_s:
            continue
        held = [(other.release_s, placed[other.name].start_s, other.bytes) for other in items[:index + 1]
                if placed[other.name].phase == p.phase and other.rank == p.rank]
        peak = _peak(held, item.release_s, p.start_s)
        if not _le(peak, limit):
            raise AutoparError(f"item {item.name!r} in gap {p.after!r} of phase {p.phase} holds rank {p.rank}'s "
                               f"memory at {peak} bytes, over its headroom of {limit}")
