"""An event simulator of a pipeline schedule: any action lists (F, B, I, W per stage and
micro-batch, as torch's schedule IR lists them), priced with per-stage durations.

Each rank runs its actions in order; an action starts when its rank is free and its inputs
have arrived:
- F of stage s on micro-batch i needs F of stage s-1 on i, plus the P2P send of that
  stage's output when the two stages sit on different ranks;
- B or I of stage s needs its own F and the input gradient from stage s+1 (B or I of s+1,
  plus the send back);
- W needs the I of the same stage and micro-batch.
Sends are asynchronous (the sender goes on computing), links are not contended. Activations
a stage keeps for backward are held from its F to its B (or its W, for a split backward).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.ir.pipeline import Action


@dataclass(frozen=True)
class StageTimes:
    """One stage's durations for one micro-batch, and the P2P time of what it sends on (its
    output forward, the gradient of its input backward: the same bytes)."""
    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    send_s: float = 0.0

    @property
    def backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s

    def duration(self, kind: str) -> float:
        return {"F": self.forward_s, "B": self.backward_s, "I": self.backward_input_s,
                "W": self.backward_weight_s}[kind]


@dataclass(frozen=True)
class Interval:
    rank: int
    action: Action
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    intervals: tuple[Interval, ...]
    ranks: int

    @property
    def makespan_s(self) -> float:
        return max((iv.end_s for iv in self.intervals), default=0.0)

    def busy_s(self, rank: int) -> float:
        return sum(iv.end_s - iv.start_s for iv in self.intervals if iv.rank == rank)

    def rank_end_s(self, rank: int) -> float:
        return max((iv.end_s for iv in self.intervals if iv.rank == rank), default=0.0)

    @property
    def bubble_fraction(self) -> float:
        """The share of the ranks' time (ranks x makespan) that no action runs: the bubbles."""
        span = self.makespan_s * self.ranks
        return 1.0 - sum(self.busy_s(r) for r in range(self.ranks)) / span if span else 0.0

    def idle(self, rank: int) -> list[tuple[float, float]]:
        """The gaps on ``rank`` between time 0 and the makespan, in order."""
        gaps, clock = [], 0.0
        for iv in sorted((iv for iv in self.intervals if iv.rank == rank), key=lambda iv: iv.start_s):
            if iv.start_s > clock:
                gaps.append((clock, iv.start_s))
            clock = max(clock, iv.end_s)
        if clock < self.makespan_s:
            gaps.append((clock, self.makespan_s))
        return gaps


def simulate(actions: Mapping[int, Sequence[Action]], stages: Sequence[StageTimes],
             extra: Mapping[str, float] | None = None) -> Timeline:
    """The timeline of running ``actions`` (rank -> its actions in order) with each stage's
    durations. ``extra``: action label ("1W3") -> seconds of other work its rank runs right after
    it, before its sends (the bubbles' work, autopar.planning.bubbles). An order that can never
    finish (an action waiting on one that comes after it) is an AutoparError naming the stuck
    actions."""
    rank_of = {a.stage: rank for rank, acts in actions.items() for a in acts}
    done: dict[tuple[int, str, int], float] = {}
    clock = {rank: 0.0 for rank in actions}
    position = {rank: 0 for rank in actions}
    intervals: list[Interval] = []
    progressed = True
    while progressed:
        progressed = False
        for rank, acts in actions.items():
            while position[rank] < len(acts):
                action = acts[position[rank]]
                ready = _inputs_arrive(action, done, rank_of, stages)
                if ready is None:
                    break
                start = max(clock[rank], ready)
                end = start + stages[action.stage].duration(action.kind) + (extra or {}).get(str(action), 0.0)
                done[action.stage, action.kind, action.microbatch] = end
                intervals.append(Interval(rank, action, start, end))
                clock[rank], position[rank] = end, position[rank] + 1
                progressed = True
    stuck = [str(acts[position[r]]) for r, acts in actions.items() if position[r] < len(acts)]
    if stuck:
        raise AutoparError(f"the pipeline schedule deadlocks: rank actions {', '.join(stuck)} wait on work "
                           f"that never runs before them")
    return Timeline(tuple(intervals), len(actions))


def _inputs_arrive(action: Action, done: dict, rank_of: dict, stages: Sequence[StageTimes]):
    """When ``action``'s inputs are all on its rank, or None if one is not computed yet."""
    s, i = action.stage, action.microbatch
    if action.kind == "F":
        if s == 0:
            return 0.0
        return _arrival(done.get((s - 1, "F", i)), s - 1, s, rank_of, stages)
    if action.kind == "W":
        return done.get((s, "I", i))
    own = done.get((s, "F", i))
    if own is None:
        return None
    if s + 1 not in rank_of:  # the last stage: its loss seeds the backward
        return own
    grad = done.get((s + 1, "B", i), done.get((s + 1, "I", i)))
    arrived = _arrival(grad, s + 1, s, rank_of, stages)
    return None if arrived is None else max(own, arrived)


def _arrival(end, source: int, target: int, rank_of: dict, stages: Sequence[StageTimes]):
    """When a value computed at ``end`` on stage ``source`` is on ``target``'s rank."""
    if end is None:
        return None
    if rank_of[source] == rank_of[target]:
        return end
    sender = min(source, target)  # the boundary's activation and its gradient have the same bytes
    return end + stages[sender].send_s


def in_flight(actions: Sequence[Action]) -> dict[int, int]:
    """Stage -> the most micro-batches whose activations it holds at once on this rank's order
    (from a F to the B, or to the W of a split backward)."""
    live: dict[int, int] = {}
    peak: dict[int, int] = {}
    for a in actions:
        if a.kind == "F":
            live[a.stage] = live.get(a.stage, 0) + 1
            peak[a.stage] = max(peak.get(a.stage, 0), live[a.stage])
        elif a.kind in ("B", "W"):
            live[a.stage] -= 1
    return peak


def peak_activation_bytes(actions: Sequence[Action], activation_bytes: Mapping[int, float]) -> float:
    """The most activation bytes this rank's order holds at once (``activation_bytes``: stage
    -> bytes one micro-batch keeps for its backward)."""
    live = peak = 0.0
    for a in actions:
        if a.kind == "F":
            live += activation_bytes[a.stage]
            peak = max(peak, live)
        elif a.kind in ("B", "W"):
            live -= activation_bytes[a.stage]
    return peak
