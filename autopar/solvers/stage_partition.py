"""Pipeline stage partition: contiguous ranges of a chain of layers, one per stage.

A pipeline of m micro-batches over stages of times t_s (forward + backward of one
micro-batch, plus the P2P send of the stage's output) runs in about
``sum_s t_s + (m - 1) * max_s t_s``: the first micro-batch crosses every stage, the others
follow at the pace of the slowest (the classic fill-and-drain bound, exact for GPipe and
1F1B on equal stages). The partition minimises it under each stage's memory: the bytes it
holds all step (parameters, gradients, optimizer state) plus the activations of the
micro-batches its schedule keeps in flight.

Exact by bottleneck enumeration: for a cap T on the slowest stage, a dynamic program over
layer boundaries finds the partition of least total time whose stages all fit and stay under
T; the optimum's slowest stage is one of the range times, so trying the caps in increasing
order, until ``(m - 1) * T`` alone exceeds the best objective, finds it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class Chain:
    """Per layer: one micro-batch's compute time, the bytes held all step and the activation
    bytes one micro-batch keeps; per boundary (after layer u): the send time of cutting there."""
    seconds: Sequence[float]
    static_bytes: Sequence[float]
    activation_bytes: Sequence[float]
    boundary_s: Sequence[float]  # len(seconds) - 1 entries

    def __len__(self) -> int:
        return len(self.seconds)


@dataclass(frozen=True)
class Partition:
    ranges: tuple[tuple[int, int], ...]  # per stage, [first layer, last layer + 1)
    stage_s: tuple[float, ...]
    objective_s: float


def pipeline_time(stage_s: Sequence[float], microbatches: int) -> float:
    """The fill-and-drain estimate the partition minimises."""
    return sum(stage_s) + (microbatches - 1) * max(stage_s)


def partition(chain: Chain, stages: int, microbatches: int, in_flight: Sequence[int],
              budget_bytes: Sequence[float]) -> Partition | None:
    """The best split of ``chain`` into ``stages`` non-empty contiguous ranges, stage s holding
    ``in_flight[s]`` micro-batches' activations within ``budget_bytes[s]``; None when no split fits."""
    n = len(chain)
    if not 1 <= stages <= n:
        return None
    cost = _RangeCosts(chain)
    caps = sorted({cost.seconds(i, j) for i in range(n) for j in range(i + 1, n + 1)})
    if _solve(cost, stages, caps[-1], in_flight, budget_bytes) is None:
        return None  # no split fits the memory, whatever its times
    lowest = _first_feasible(cost, stages, caps, in_flight, budget_bytes)
    floor = sum(chain.seconds)  # every split's total is at least the layers' own time
    best: Partition | None = None
    for T in caps[lowest:]:
        if best is not None and floor + (microbatches - 1) * T >= best.objective_s:
            break
        ranges = _solve(cost, stages, T, in_flight, budget_bytes)
        if ranges is None:
            continue
        times = tuple(cost.seconds(i, j) for i, j in ranges)
        objective = pipeline_time(times, microbatches)
        if best is None or objective < best.objective_s:
            best = Partition(tuple(ranges), times, objective)
    return best


def _first_feasible(cost: _RangeCosts, stages: int, caps: list, in_flight, budget_bytes) -> int:
    """The index of the least cap some split fits under (fitting is monotone in the cap)."""
    lo, hi = 0, len(caps) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _solve(cost, stages, caps[mid], in_flight, budget_bytes) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _RangeCosts:
    """Prefix sums: a range's time (its layers and the send after it) and bytes in O(1)."""

    def __init__(self, chain: Chain):
        self.n = len(chain)
        self._s = [0.0] + list(accumulate(chain.seconds))
        self._static = [0.0] + list(accumulate(chain.static_bytes))
        self._act = [0.0] + list(accumulate(chain.activation_bytes))
        self._send = list(chain.boundary_s) + [0.0]  # the last stage sends nothing on

    def seconds(self, i: int, j: int) -> float:
        return self._s[j] - self._s[i] + self._send[j - 1]

    def bytes(self, i: int, j: int, in_flight: int) -> float:
        return self._static[j] - self._static[i] + in_flight * (self._act[j] - self._act[i])


def _solve(cost: _RangeCosts, stages: int, cap: float, in_flight, budget_bytes) -> list | None:
    """The split of least total time whose stages each take at most ``cap`` and fit, or None."""
    n, inf = cost.n, math.inf
    # best[k][j]: least total time of k stages covering layers [0, j); back[k][j]: where stage k starts
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    back = [[-1] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        s = k - 1
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                if best[k - 1][i] == inf:
                    continue
                t = cost.seconds(i, j)
                if t > cap or cost.bytes(i, j, in_flight[s]) > budget_bytes[s]:
                    continue
                if best[k - 1][i] + t < best[k][j]:
                    best[k][j], back[k][j] = best[k - 1][i] + t, i
    if best[stages][n] == inf:
        return None
    ranges, j = [], n
    for k in range(stages, 0, -1):
        i = back[k][j]
        ranges.append((i, j))
        j = i
    return ranges[::-1]



def even_partition(chain: Chain, stages: int, microbatches: int) -> Partition | None:
    """Megatron-LM's split: the layers (all units but the first and last, the parts before and
    after them) in equal runs, earlier stages taking one fewer where they do not divide; the
    part before on the first stage, the part after on the last. None with more stages than layers."""
    layers = len(chain) - 2
    if not 1 <= stages <= layers:
        return None
    cost = _RangeCosts(chain)
    bounds = [1 + (s * layers) // stages for s in range(stages + 1)]
    bounds[0], bounds[-1] = 0, len(chain)
    ranges = tuple(zip(bounds[:-1], bounds[1:]))
    times = tuple(cost.seconds(i, j) for i, j in ranges)
    return Partition(ranges, times, pipeline_time(times, microbatches))


def fits(chain: Chain, ranges, in_flight: Sequence[int], budget_bytes: Sequence[float]) -> bool:
    cost = _RangeCosts(chain)
    return all(cost.bytes(i, j, in_flight[s]) <= budget_bytes[s] for s, (i, j) in enumerate(ranges))
