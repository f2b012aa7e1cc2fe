"""How a tensor moves from one spec to another: an ordered list of steps.

The cost model prices these steps and the backends emit them, so what is
priced is exactly what runs. Order: first make partial sums whole, then
un-shard, and only then shard locally, so no step meets a dim that another
axis still splits.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.ir.placement import Partial, Placement, R, Replicate, Shard, Spec

# a gradient's first step of these kinds starts asynchronously, as soon as the gradient exists,
# and overlaps the rest of backward (its wait is at the end of the step)
COMMUNICATING = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
STEP_KINDS = COMMUNICATING + ("shard", "zero_partial")  # shard: keep a block (no traffic); zero_partial: R -> P
ASYNC_KINDS = ("all_reduce", "reduce_scatter")


@dataclass(frozen=True)
class Step:
    kind: str  # all_reduce | reduce_scatter | all_gather | all_to_all | shard | zero_partial
    axis: int
    dim: int | None = None  # gather/scatter/shard dim; for all_to_all the dim that becomes sharded
    src_dim: int | None = None  # all_to_all: the dim that was sharded

    def describe(self, axis_names) -> str:
        name = axis_names[self.axis]
        if self.kind == "all_to_all":
            return f"all_to_all[{name}] S({self.src_dim})->S({self.dim})"
        return f"{self.kind}[{name}]" + (f" dim {self.dim}" if self.dim is not None else "")


def plan_steps(src: Spec, dst: Spec) -> list[Step]:
    cur: list[Placement] = list(src.placements)
    steps: list[Step] = []

    def sharded_elsewhere(dim: int, axis: int, spec: list) -> bool:
        return any(isinstance(p, Shard) and p.dim == dim for a, p in enumerate(spec) if a != axis)

    # 1. partial sums: reduce-scatter straight into the target when nothing else splits that dim
    for axis, (s, d) in enumerate(zip(src.placements, dst.placements)):
        if isinstance(s, Partial) and not isinstance(d, Partial):
            if isinstance(d, Shard) and not sharded_elsewhere(d.dim, axis, cur):
                steps.append(Step("reduce_scatter", axis, d.dim))
                cur[axis] = d
            else:
                steps.append(Step("all_reduce", axis))
                cur[axis] = R
    # 2. shards that must move: all-to-all when the target dim is free, else gather
    for axis, d in enumerate(dst.placements):
        s = cur[axis]
        if isinstance(s, Shard) and s != d:
            if isinstance(d, Shard) and not sharded_elsewhere(d.dim, axis, cur):
                steps.append(Step("all_to_all", axis, d.dim, s.dim))
                cur[axis] = d
            else:
                steps.append(Step("all_gather", axis, s.dim))
                cur[axis] = R
    # 3. local work: take this rank's block, or keep a summand on one rank only
    for axis, d in enumerate(dst.placements):
        if isinstance(cur[axis], Replicate) and isinstance(d, Shard):
            steps.append(Step("shard", axis, d.dim))
            cur[axis] = d
        elif isinstance(cur[axis], Replicate) and isinstance(d, Partial):
            steps.append(Step("zero_partial", axis))
            cur[axis] = d
    assert tuple(cur) == dst.placements, (src, dst, cur)
    return steps
