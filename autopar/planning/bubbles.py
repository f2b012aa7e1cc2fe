"""K-FAC's work placed in a pipelined plan's bubbles (PipeFisher, Osawa et al. 2023).

The planner knows every bubble from its simulated timeline and prices every piece of K-FAC's
work with the cost model, per stage:
- ``factor``: one layer's factors ``A = aᵀa/n`` and ``G = ĝᵀĝ/n`` from one micro-batch's
  operands (released when that micro-batch's weight gradients have run; its operands are held
  until then, which is its memory cost);
- ``reduce``: the stage's factors averaged over its devices (one all-reduce per axis);
- ``invert``: one layer's damped factors inverted;
- ``precondition``: every step, after the stage's last weight gradients and their syncs.
Factors, reduction and inversion form a refresh cycle of ``refresh`` steps (the factors of a
micro-batch may be computed in any step of the cycle, from that step's micro-batch); the new
inverses take effect in the cycle's last step; the cycle is the shortest whose step time,
amortized, is within 1% of the best cycle's (``_refresh_period``), unless ``inv_every`` pins it.
autopar.solvers.bubble_fill places the pieces into the gaps; the step times before and after
are the plan's prediction.

The runtime runs a piece when the stage's program of the action before its gap returns, which
is before torch's schedule posts that action's sends; so only gaps after actions that send
nothing another rank waits for are offered: weight gradients (W), the last stage's forwards
and the first stage's backwards; the wait for a rank's first input, where work that needs
nothing of the step (an inversion) runs; and the time from when a rank's schedule returns (its
last sends taken) to the step's end, while other ranks finish. Work after any other action would
delay the next stage.
"""
from __future__ import annotations

import dataclasses

from autopar.cost_models.collectives import axis_placement, collective_time
from autopar.cost_models.compute import roofline_time
from autopar.errors import AutoparError
from autopar.ir.bubbles import END, FACTOR, INVERT, PRECONDITION, REDUCE, START, BubbleFill, Work
from autopar.ir.mesh import Mesh
from autopar.ir.pipeline import Action, ActionKind, Block
from autopar.lowering.curvature import CurvatureLayer, curvature_layers
from autopar.passes.predict import exposed
from autopar.solvers.bubble_fill import Gap, Item, greedy

MAX_REFRESH = 10  # the longest refresh cycle the planner proposes
REFRESH_TOLERANCE = 0.01  # a cycle this much slower (per step) than the best is still preferred if shorter
MARGIN_SHARE = 0.001  # of the step: each gap's slack, so an estimate that runs long delays no action
FACTOR_COPIES = 4  # per factor: its running average, the cycle's sum, its inverse, the next inverse
_FLOAT = 4  # bytes: factors and their work in float32


@dataclasses.dataclass
class PlacementProblem:
    """K-FAC's work of one plan as the placement solver takes it (autopar.solvers.bubble_fill)."""
    items: list  # Item, dependencies first
    gaps: list  # Gap
    step_end_s: float
    refresh: int
    margin_s: float
    headroom_bytes: dict  # pp rank -> bytes beside the pipeline and the factors

    def solve(self, into_bubbles: bool = True):
        return greedy(self.items, self.gaps if into_bubbles else [], self.step_end_s, self.refresh, self.margin_s,
                      self.headroom_bytes)


def placement_problem(plan, request, refresh: int) -> tuple[PlacementProblem, _StageWork]:
    """The placement problem of ``plan``'s K-FAC work over a cycle of ``refresh`` steps."""
    work = _StageWork(plan, request)
    return work.problem(refresh), work


def fill_bubbles(plan, request, into_bubbles: bool = True) -> BubbleFill:
    """The K-FAC work of ``plan`` (pipelined, its layouts solved) placed into its bubbles; with
    ``into_bubbles`` False, all of it after the step (the baseline the filling is measured by)."""
    pipeline = plan.pipeline
    work = _StageWork(plan, request)
    refresh = request.inv_every or _refresh_period(work)
    problem = work.problem(refresh)
    filled = problem.solve(into_bubbles)
    unfilled = problem.solve(into_bubbles=False)
    if unfilled.mean_step_s < filled.mean_step_s:  # the greedy is no optimum: never worse than not filling
        filled = unfilled
    busy = sum(b.end_s - b.start_s for b in pipeline.timeline)
    items = {i.name: i for i in problem.items}
    return BubbleFill(
        "kfac", refresh, problem.margin_s, tuple(layer.weight for layer in work.layers), tuple(work.first_order),
        tuple(work.placed(p, items[p.item]) for p in filled.placed), pipeline.step_time_s, unfilled.mean_step_s,
        filled.mean_step_s, _idle(busy, pipeline.pp, [pipeline.step_time_s]),
        _idle(busy + sum(i.duration_s for i in problem.items) / refresh, pipeline.pp, filled.step_s),
        max(work.factor_bytes(r) for r in range(pipeline.pp)))


def _refresh_period(work: _StageWork) -> int:
    """The fewest steps per curvature refresh whose filled step, amortized over the cycle, is
    within ``REFRESH_TOLERANCE`` of the least any cycle up to ``MAX_REFRESH`` steps reaches: a
    longer cycle spreads the curvature work over more steps' bubbles, and refreshes it less often."""
    steps = [work.problem(r).solve().mean_step_s for r in range(1, MAX_REFRESH + 1)]
    return next(r for r, s in enumerate(steps, 1) if s <= (1 + REFRESH_TOLERANCE) * min(steps))


def _idle(busy_s: float, ranks: int, step_s) -> float:
    """The share of the ranks' time no work runs, over a cycle's steps."""
    span = ranks * sum(step_s) / len(step_s)
    return 1.0 - busy_s / span if span else 0.0


def _blocks(pipeline, hw) -> list[Block]:
    """The simulated step's actions; a stage's last weight gradients end after its gradient
    syncs, which run inside them and which the pipeline left exposed."""
    last: dict = {}
    for b in pipeline.timeline:
        if b.action.kind in (ActionKind.B, ActionKind.W) and \
                b.end_s >= getattr(last.get(b.action.stage), "end_s", 0.0):
            last[b.action.stage] = b
    out = []
    for b in pipeline.timeline:
        if last.get(b.action.stage) is b:
            stage = pipeline.stages[b.action.stage]
            b = dataclasses.replace(b, end_s=b.end_s + exposed(stage.sync_s, stage.backward_s, hw.gradient_overlap))
        out.append(b)
    return out


def _gaps(blocks: list[Block], ranks: int, stages: int, step_end_s: float) -> list[Gap]:
    """The idle intervals after each quiet action, before each rank's first, and from when a
    rank's schedule returns to the step's end, per rank (a gap after an action is named by the
    action's label, as the runtime names the work it runs after it)."""
    gaps = []
    starts = {b.action: b.start_s for b in blocks}
    for r in range(ranks):
        mine = sorted((b for b in blocks if b.rank == r), key=lambda b: b.start_s)
        if mine and mine[0].start_s > 0:
            gaps.append(Gap(r, START, 0.0, mine[0].start_s))
        for b, following in zip(mine, mine[1:] + [None]):
            if following is not None and following.start_s > b.end_s and _quiet(b.action, stages):
                gaps.append(Gap(r, str(b.action), b.end_s, following.start_s))
        done = _returns(mine[-1], starts, stages) if mine else step_end_s
        if done < step_end_s:
            gaps.append(Gap(r, END, done, step_end_s))
    return gaps


def _returns(last: Block, starts: dict, stages: int) -> float:
    """When a rank's schedule returns: after its last action, once what that action sends has
    been taken (its receiver's action starts)."""
    a = last.action
    if _quiet(a, stages):
        return last.end_s
    receivers = [Action(a.stage + 1, ActionKind.F, a.microbatch)] if a.kind == ActionKind.F else \
        [Action(a.stage - 1, kind, a.microbatch) for kind in (ActionKind.B, ActionKind.I)]
    return max([last.end_s] + [starts[r] for r in receivers if r in starts])


def _quiet(a: Action, stages: int) -> bool:
    """Whether no other stage waits on what ``a`` sends (it sends nothing)."""
    return a.kind == ActionKind.W or (a.kind == ActionKind.F and a.stage == stages - 1) or \
        (a.kind in (ActionKind.B, ActionKind.I) and a.stage == 0)


class FactorsDoNotFit(AutoparError):
    """K-FAC's factors do not fit beside the pipeline: ``factor_bytes`` is the most a rank holds."""

    def __init__(self, message: str, factor_bytes: float):
        super().__init__(message)
        self.factor_bytes = factor_bytes


class _StageWork:
    """The pieces of K-FAC's work of each stage, priced on the plan's hardware, and the gaps and
    memory headroom they may go into: what every refresh cycle's placement problem shares."""

    def __init__(self, plan, request):
        self.plan, self.hw = plan, request.hardware
        self.pipeline = pipeline = plan.pipeline
        self.layers, self.first_order = curvature_layers(plan)
        if not self.layers:
            raise AutoparError("optimizer='kfac' preconditions linear layers (nn.Linear weights), and this model "
                               "has none: use 'sgd' or 'adam'")
        node_stage = pipeline.node_stages()
        self.by_stage: dict[int, list[CurvatureLayer]] = {}
        for layer in self.layers:
            self.by_stage.setdefault(node_stage[layer.gradient_mm], []).append(layer)
        self.meta: dict[str, tuple] = {}  # item name -> (kind, stage, layers, micro-batch)
        self._full = Mesh(("pp",) + plan.mesh.axis_names, (pipeline.pp,) + plan.mesh.shape)
        # each piece's price, alike in every cycle
        self.factor_s = {la.weight: self._factor_s(la) for la in self.layers}
        self.held_bytes = {la.weight: _FLOAT * self._rows(la) * (la.in_features + la.out_features)
                           for la in self.layers}  # a micro-batch's operands, held until its factors run
        self.invert_s = {la.weight: self._invert_s(la) for la in self.layers}
        self.reduce_s = {s: self._reduce_s(layers) for s, layers in self.by_stage.items()}
        self.precondition_s = {s: self._precondition_s(layers) for s, layers in self.by_stage.items()}
        self.blocks = _blocks(pipeline, request.hardware)
        self.gaps = _gaps(self.blocks, pipeline.pp, len(pipeline.stages), pipeline.step_time_s)
        self.headroom = {r: request.memory_budget_bytes - pipeline.rank_peak_bytes[r] - self.factor_bytes(r)
                         for r in range(pipeline.pp)}
        if min(self.headroom.values()) < 0:
            r = min(self.headroom, key=self.headroom.get)
            raise FactorsDoNotFit(f"K-FAC's factors ({self.factor_bytes(r) / 2**30:.2f} GiB on pipeline rank {r}) "
                                  f"do not fit the memory budget beside the pipeline's "
                                  f"{pipeline.rank_peak_bytes[r] / 2**30:.2f} GiB: use more stages or a first-order "
                                  f"optimizer", max(self.factor_bytes(r) for r in range(pipeline.pp)))

    def problem(self, refresh: int) -> PlacementProblem:
        """The placement problem over a cycle of ``refresh`` steps."""
        step = self.pipeline.step_time_s
        return PlacementProblem(list(self.items(refresh).values()), self.gaps, step, refresh, MARGIN_SHARE * step,
                                self.headroom)

    def factor_bytes(self, rank: int) -> float:
        return sum(FACTOR_COPIES * _FLOAT * (la.in_features ** 2 + la.out_features ** 2)
                   for s, layers in self.by_stage.items() if self.pipeline.stages[s].rank == rank for la in layers)

    def items(self, refresh: int) -> dict[str, Item]:
        """name -> item, in an order where every dependency comes first."""
        ends = {b.action: b.end_s for b in self.blocks}
        out: dict[str, Item] = {}
        self.meta = {}
        for s, layers in sorted(self.by_stage.items()):
            rank, weights = self.pipeline.stages[s].rank, tuple(la.weight for la in layers)
            factors: dict[str, list[str]] = {w: [] for w in weights}  # weight -> its factors' items
            for i in range(self.pipeline.microbatches):
                done = ends.get(Action(s, ActionKind.W, i), ends.get(Action(s, ActionKind.B, i)))
                for la in layers:
                    factors[la.weight].append(f"{FACTOR} {la.weight} mb{i}")
                    self._add(out, Item(factors[la.weight][-1], rank, self.factor_s[la.weight],
                                        self.held_bytes[la.weight], done), FACTOR, s, (la.weight,), i)
            reduced = None
            if self.plan.mesh.size > 1:
                reduced = f"{REDUCE} stage {s}"
                self._add(out, Item(reduced, rank, self.reduce_s[s], deps=tuple(n for f in factors.values()
                                                                                  for n in f)), REDUCE, s, weights)
            for la in layers:
                own = (reduced,) if reduced else tuple(factors[la.weight])
                self._add(out, Item(f"{INVERT} {la.weight}", rank, self.invert_s[la.weight], deps=own),
                          INVERT, s, (la.weight,))
            synced = max(end for a, end in ends.items() if a.stage == s and a.kind in (ActionKind.B, ActionKind.W))
            inverted = tuple(f"{INVERT} {w}" for w in weights)
            for p in range(refresh):
                self._add(out, Item(f"{PRECONDITION} stage {s} step {p}", rank, self.precondition_s[s],
                                    release_s=synced, deps=inverted if p == refresh - 1 else (), phase=p),
                          PRECONDITION, s, weights)
        return out

    def _add(self, out: dict, item: Item, kind: str, stage: int, layers: tuple, microbatch: int = -1) -> None:
        out[item.name] = item
        self.meta[item.name] = (kind, stage, layers, microbatch)

    def placed(self, p, item: Item) -> Work:
        kind, stage, layers, microbatch = self.meta[p.item]
        return Work(p.item, kind, stage, item.rank, p.phase, p.after, p.start_s, p.end_s, layers, microbatch)

    def _rows(self, layer: CurvatureLayer) -> int:
        """The rows of one micro-batch's operands a device holds (dim 1 of the first: gᵀ or aᵀ)."""
        node = self.plan.graph.node(layer.gradient_mm)
        shape = self.plan.graph.node(node.refs()[0]).outputs[0].shape
        return self.plan.strategies[node.name].in_specs[0].local_shape(shape, self.plan.mesh)[1]

    def _factor_s(self, la: CurvatureLayer) -> float:
        n, d = self._rows(la), la.in_features ** 2 + la.out_features ** 2
        gathers = sum(self._gather_s(_FLOAT * n * features, axes)
                      for features, axes in zip((la.out_features, la.in_features) if not la.swapped else
                                                (la.in_features, la.out_features), la.operand_gathers))
        return gathers + roofline_time(2 * n * d, _FLOAT * (n * (la.in_features + la.out_features) + d), _FLOAT,
                                       self.hw)

    def _invert_s(self, la: CurvatureLayer) -> float:
        # an inverse by LU costs about 2 n³ flops; two factors per layer
        cubes = la.in_features ** 3 + la.out_features ** 3
        return roofline_time(2 * cubes, 2 * _FLOAT * (la.in_features ** 2 + la.out_features ** 2), _FLOAT, self.hw)

    def _precondition_s(self, layers) -> float:
        flops = sum(2 * la.in_features * la.out_features * (la.in_features + la.out_features) for la in layers)
        nbytes = sum(_FLOAT * (la.in_features ** 2 + la.out_features ** 2 + 2 * la.in_features * la.out_features)
                     for la in layers)
        gathers = sum(self._gather_s(_FLOAT * la.in_features * la.out_features, la.weight_gathers) for la in layers)
        return gathers + roofline_time(flops, nbytes, _FLOAT, self.hw)

    def _gather_s(self, whole_bytes: float, gathers) -> float:
        """The all-gathers that make a tensor of ``whole_bytes`` whole along ``gathers`` (axis, dim)."""
        return sum(collective_time("all_gather", whole_bytes, axis_placement(self._full, self._axis(axis), self.hw),
                                   self.hw) for axis, _ in gathers)

    def _axis(self, name: str) -> int:
        return self.plan.mesh.axis_names.index(name) + 1  # after pp

    def _reduce_s(self, layers) -> float:
        nbytes = sum(_FLOAT * (la.in_features ** 2 + la.out_features ** 2) for la in layers)
        return sum(collective_time("all_reduce", nbytes, axis_placement(self._full, a + 1, self.hw), self.hw)
                   for a in range(self.plan.mesh.ndim))


def with_fill(plan, request):
    """``plan`` with K-FAC's work placed in its bubbles, its predicted step time the filled one."""
    fill = fill_bubbles(plan, request)
    pipeline = dataclasses.replace(plan.pipeline, fill=fill)
    memory = dict(plan.predicted.memory_bytes)
    memory["optimizer_state"] += fill.factor_bytes  # K-FAC's state: its factors and their inverses
    predicted = dataclasses.replace(plan.predicted, step_time_s=fill.step_filled_s, memory_bytes=memory)
    return dataclasses.replace(plan, pipeline=pipeline, predicted=predicted)
