"""The memory-budget search of the sharding solve: which layout to take when the fastest one
does not fit.

A linear stand-in (parameters with their gradients and optimizer state, inputs, saved
activations) is kept under a limit; the exact peak of the solution (autopar.lowering.memory)
is then checked, and while it is over, the stand-in's limit drops by the excess and the solve
repeats. ZeRO/FSDP-style layouts (parameters sharded over the data-parallel axis, gathered
before use) come out of this when memory demands them. A solution that fits only with
recomputation (autopar.passes.recompute) counts with the time it adds; of the solutions
tried, the fastest that fits wins (and one whose recomputation adds under 1% of the step ends
the search). On an N-D mesh the solutions tried are the axis-by-axis descent's; the full
integer program runs once, from the winner, when it is small enough to solve in its time
limit, and replaces it only when it is faster and still fits. Offloading to host memory is the
third lever (autopar.passes.budget_offload): tried where the fastest layout does not fit as it
is, and kept where it is the fastest that fits (or where nothing else fits).
"""
from __future__ import annotations

import dataclasses
import math
import time

from autopar.errors import AutoparError, SolverError
from autopar.ir.graph import to_ir
from autopar.ir.program import STEP, Program, forward_nodes, tensor_inputs
from autopar.lowering.memory import optimizer_bytes_per_element
from autopar.ops.table import rule_for
from autopar.passes.base import PassContext
from autopar.passes.budget_layout import BUDGETED, HELD, MEMORY, TIME, Layout
from autopar.passes.budget_offload import OffloadLever, because, offload_limits
from autopar.passes.collectives import find_redistributions
from autopar.passes.recompute import fit, memory_budget
from autopar.passes.sharding_problem import ShardingProblem
from autopar.solvers.limits import SolveLimits
from autopar.solvers.sharding import RELATIVE_GAP, MemoryLimit, evaluate, solve
from autopar.solvers.warm_start import descend_axes
from autopar.units import bytes_at_least, human_bytes, human_seconds

_BUDGET_ATTEMPTS = 8
# recomputation adding at most this share of the step is kept without trying layouts that hold
# less: a layout that holds less would have to be slower by less than this to win
_CHEAP_RECOMPUTE = 0.01
# the full program runs when it has at most this many booleans per unit of its work limit: past
# that SCIP does not finish even the LP relaxation in the limit (docs, "Solving at scale": 10k
# booleans a second on a 2-core machine, where a second is about 2k units)
_POLISH_BOOLEANS_PER_WORK = 5
# the least-memory layout is proven within this share of the linear stand-in's least bytes: the
# stand-in itself misses the exact peak by far more (temporaries, buffers), so a tighter proof
# only spends time (on the 70B shape, 6 s of branching for 0.005% of the bytes)
_LEAN_GAP = 1e-3


class BudgetSearch:
    """One sharding problem's search for the fastest layout within the memory budget."""

    def __init__(self, program: Program, problem: ShardingProblem, ctx: PassContext):
        self.program, self.problem, self.ctx = program, problem, ctx
        self.graph = to_ir(program)
        self.budget = memory_budget(ctx)
        self.rows, self.held = _memory_rows(program, problem, ctx)
        self.steps = _StepMemo()
        self.lean = _Lean(self, problem.node_costs, self.rows)
        self.attempts: list = []  # (smallest peak, its breakdown) of each layout tried
        self.fastest: Layout | None = None  # the fastest layout, solved with no limit of the stand-in

    def run(self) -> Layout:
        """The layout the search picks, with its fit, offloading or not; an AutoparError when none fits."""
        try:
            chosen = self._on_device()
        except AutoparError as refusal:
            offloaded = OffloadLever(self).best(None)
            if offloaded is None and self.ctx.request.offload is not False and self.graph.kind == STEP:
                raise AutoparError(f"{refusal}; offloading parameters and optimizer state to host memory does not "
                                   f"fit either: {offload_limits(self)}") from refusal
            if offloaded is None:
                raise refusal
            return because(offloaded, f"no layout fits {human_bytes(self.budget)} on the device alone, even with "
                                      f"sharding and recomputation", self.ctx)
        offloaded = OffloadLever(self).best(chosen)
        if offloaded is None:
            return chosen
        device_only, with_offload = chosen.step_s, offloaded.step_s
        if self.ctx.request.offload is True:
            return because(offloaded, "offload=True", self.ctx)
        if with_offload >= device_only:
            return chosen
        return because(offloaded, f"it is faster ({human_seconds(with_offload)} a step) than the fastest layout that "
                                   f"fits on the device alone ({human_seconds(device_only)})", self.ctx)

    def _on_device(self) -> Layout:
        best = self._within_budget()
        if best is not None:  # on a 1-D mesh, or LP first, every solve was the full program already
            # mesh search sets full_program False while it compares meshes, and runs it on the finalists
            polish = self._descends() and self.ctx.request.full_program and self._solvable()
            return self._polished(best) if polish else best
        return self._leanest_that_fits()

    # ---- one solve ----------------------------------------------------------------
    def solve(self, limit: MemoryLimit | None, objective: str = TIME, start=None, bounded=True, descend=True,
              polish=True):
        """The solver's result for ``objective`` (TIME: the step; MEMORY: the bytes held).
        ``limit`` None: only what every rank holds all step must fit (never cuts off a plan that
        fits, and spares the solver layouts that cannot); ``bounded`` False: not even that.
        ``polish`` False: on an N-D mesh, the axis-by-axis descent's layout without the full
        integer program after it; ``descend`` False: the full program from ``start`` alone."""
        begin = time.perf_counter()
        start = self.problem.hint if start is None else start
        if limit is None and bounded:
            limit = MemoryLimit(self.held, self.budget, HELD)
        try:
            result = self._solve_from(start, objective, limit, descend, polish)
        except SolverError:
            # from a start over the limit (data parallel, for a model one mesh axis cannot shard
            # small enough) every one-axis step can be infeasible, and the full solve may find
            # nothing in time: start again from the leanest layout, which meets any limit that can be
            if limit is None or None in start or limit.used(start) <= limit.limit:
                raise
            self.ctx.report("no one-axis step from data parallel fits the memory limit; "
                            "starting from the leanest layout")
            result = self._solve_from(list(self.lean.choice), objective, limit, descend, polish)
        return dataclasses.replace(result, seconds=time.perf_counter() - begin)

    def _descends(self) -> bool:
        """Whether solves go axis by axis first: on an N-D mesh, for the backends that solve the
        whole integer program at once ("lp-first" solves it exactly in seconds)."""
        return self.ctx.mesh.ndim > 1 and self.ctx.request.solver != "lp-first"

    def _solve_from(self, first, objective: str, limit, descend: bool, polish: bool):
        costs = self.problem.node_costs if objective == TIME else self.lean.costs
        gap = RELATIVE_GAP if objective == TIME else _LEAN_GAP
        if not self._descends() or None in first or not descend:
            return self._solve_full(costs, first, limit, gap)

        def solve_step(restricted_costs, warm, step):
            return self.steps.solve((objective, step), limit,
                                    lambda: self._solve_full(restricted_costs, warm, limit, gap))

        warm = descend_axes(solve_step, costs, self.problem.options, self.ctx.mesh.ndim, first, self.ctx.report)
        if warm is None and limit is not None and limit.used(first) > limit.limit:
            raise SolverError("no one-axis step from the start meets the memory limit")
        if warm is not None and not polish:
            return warm
        return self._solve_full(costs, list(warm.choice) if warm is not None else first, limit, gap)

    def _solve_full(self, costs, warm, limit, gap: float):
        request = self.ctx.request
        return solve(costs, self.problem.edges, backend=request.solver, limits=SolveLimits.of(request),
                     hint=warm if None not in warm else None, progress=self.ctx.progress,
                     overlap=self.problem.overlap, memory=limit, relative_gap=gap)

    def fit(self, result, mode: str | None = None):
        """The recompute pass's fit of ``result``'s layout under the budget."""
        chosen = self.problem.choice_of(result.choice)
        moves = find_redistributions(self.program, chosen, self.ctx.cost, self.ctx.request.precision)
        return fit(self.graph, chosen, moves, self.ctx, self.budget, mode)

    def step_time(self, choice) -> float:
        return evaluate(self.problem.node_costs, self.problem.edges, choice, self.problem.overlap)

    # ---- the search ---------------------------------------------------------------
    def _within_budget(self) -> Layout | None:
        """The layout that fits the budget, with recomputation if it needs it, for the least step
        time among those tried (with its fit and the stand-in's limit it was solved under), or None."""
        stand_in = MemoryLimit(self.rows, 0, BUDGETED)
        limit, best, best_time = None, None, math.inf
        for _ in range(_BUDGET_ATTEMPTS):
            try:
                result = self.solve(None, polish=False) if limit is None else \
                    self.solve(MemoryLimit(self.rows, limit, BUDGETED), start=list(self.lean.choice), polish=False)
            except SolverError:
                break
            if result.objective >= best_time:
                break  # tighter limits only slow the layout further: recomputing is the better answer
            fitted = self.fit(result)
            if limit is None:
                self.fastest = Layout(result, fitted)
            self.attempts.append((fitted.least.peak_bytes, fitted.least.breakdown))
            if fitted.recompute is not None and result.objective + fitted.recompute.seconds < best_time:
                best = Layout(result, fitted, None if limit is None else MemoryLimit(self.rows, limit, BUDGETED))
                best_time = result.objective + fitted.recompute.seconds
            if self._settled(result, fitted, best is not None):
                break
            floor = stand_in.used(self.lean.choice)
            if limit is not None and limit <= floor:
                break  # the leanest layout has been tried
            # the stand-in misses temporaries and collective buffers, so it is only trusted for
            # differences: ask for this solution's stand-in value less the excess. The excess is
            # what it takes to need no recomputation (recomputation then covers what the stand-in
            # misses): aiming at the least peak that recomputation reaches instead creeps down a
            # layout at a time to ones that fit only by recomputing most of the model
            limit = max(floor, stand_in.used(result.choice) - (fitted.plain.peak_bytes - self.budget))
            self._report_next_attempt(fitted)
        return best

    def _settled(self, result, fitted, found: bool) -> bool:
        """Whether the search stops at ``result``: it fits as it is, or fits by recomputing
        (with recompute="full", or for a cheap enough recomputation)."""
        if fitted.plain.peak_bytes <= self.budget or (found and self.ctx.request.recompute == "full"):
            return True
        if fitted.recompute is not None and fitted.recompute.seconds <= _CHEAP_RECOMPUTE * result.objective:
            self.ctx.report(f"the plan fits the budget by recomputing ({human_seconds(fitted.recompute.seconds)}, "
                            f"{fitted.recompute.seconds / result.objective:.1%} of the step); keeping it")
            return True
        return False

    def _report_next_attempt(self, fitted) -> None:
        if fitted.recompute is None:
            self.ctx.report(f"peak memory {human_bytes(fitted.least.peak_bytes)} is over the budget "
                            f"{human_bytes(self.budget)}, and recomputation cannot close the gap")
        else:
            self.ctx.report(f"the plan fits the budget by recomputing ({human_seconds(fitted.recompute.seconds)}); "
                            "trying layouts that hold less instead")

    def _solvable(self) -> bool:
        """Whether the full program is small enough for SCIP in its work limit (see
        _POLISH_BOOLEANS_PER_WORK); says so when it is not."""
        booleans, work = self.problem.booleans, self.ctx.request.solver_work_limit
        if booleans <= _POLISH_BOOLEANS_PER_WORK * work:
            return True
        self.ctx.report(f"the full integer program ({booleans} booleans) is too large to solve in its work limit "
                        f"({work}): the axis-by-axis layout stands, with no proven bound")
        return False

    def _polished(self, pick: Layout) -> Layout:
        """The search's pick after the full integer program from it, under the same limit: kept if
        it is faster and still fits, and otherwise the pick with the full program's bound (the
        search's own bound only held for one axis)."""
        result, fitted = pick.result, pick.fit
        try:
            polished = self.solve(pick.limit, start=list(result.choice), descend=False)
        except SolverError:
            return pick
        if polished.choice == result.choice:
            return Layout(polished, fitted)
        if polished.objective < result.objective:
            refitted = self.fit(polished)
            if refitted.recompute is not None and polished.objective + refitted.recompute.seconds \
                    <= result.objective + fitted.recompute.seconds:
                return Layout(polished, refitted)
        proven = polished.status == "optimal" and result.objective <= polished.objective * (1 + 1e-9)
        return Layout(dataclasses.replace(result, bound=min(polished.bound, result.objective),
                                          status="optimal" if proven else "feasible"), fitted)

    def _leanest_that_fits(self) -> Layout:
        """The leanest layout, as it is or with as much recomputation as helps: the search may
        have missed it (its recomputation solves can time out on deep models); it fits, or
        nothing found does. Recomputing everything can also raise the peak, hence "none" first."""
        lean_fit = self.fit(self.lean.result, "none")
        if lean_fit.recompute is None and self.ctx.request.recompute != "none":
            lean_fit = self.fit(self.lean.result, "full")
        if lean_fit.recompute is None:
            if not self.attempts:  # even the memory floor failed: the fastest layout may still peak lower
                fastest = self.fit(self.solve(None, bounded=False))
                self.attempts.append((fastest.least.peak_bytes, fastest.least.breakdown))
            raise _infeasible(self.budget, self.attempts, lean_fit.least, self.ctx.mesh)
        return Layout(self.lean.result, lean_fit)


class _Lean:
    """The layouts holding the least memory by the linear stand-in: ``choice``, each node's
    leanest strategy (the start of budgeted solves: it meets any limit that can be met, and the
    descent is a local search whose start matters: README, "Solving at scale");
    ``result``, solved with bytes as the objective (a valid plan, reshards and all: the last
    answer when no faster layout fits; solved once, when first needed), reported with its step
    time as the objective and status "least-memory": it is optimal for memory, and no bound on
    its time is known."""

    def __init__(self, search: BudgetSearch, node_costs, rows):
        self.search = search
        self._result = None
        # bytes as the objective, in GB: the solver scales costs by 1e9 (nanoseconds), and raw
        # bytes would pass SCIP's infinity (1e20) on an 80-layer model
        self.costs = [[math.inf if math.isinf(c) else b / 1e9 for c, b in zip(cr, br)]
                      for cr, br in zip(node_costs, rows)]
        self.choice = [min(range(len(cr)), key=cr.__getitem__) for cr in self.costs]

    @property
    def result(self):
        if self._result is None:
            leanest = self.search.solve(None, MEMORY, start=self.choice, bounded=False, polish=False)
            self._result = dataclasses.replace(leanest, objective=self.search.step_time(leanest.choice), bound=0.0,
                                               status="least-memory")
        return self._result


class _StepMemo:
    """The axis descent's steps solved so far, by (objective, step). A step's proven optimum
    that meets a tighter memory limit is that limit's optimum too (the limit only removes
    layouts), so a budget attempt skips the steps it shares with the attempts before it."""

    def __init__(self):
        self.solved: dict = {}

    def solve(self, key, limit: MemoryLimit | None, solve_now):
        found = self.solved.get(key)
        if found is not None:
            result, solved_under = found
            if result.status == "optimal" and self._within(limit, solved_under) and \
                    (limit is None or limit.used(result.choice) <= limit.limit):
                return result
        result = solve_now()
        self.solved[key] = (result, limit)
        return result

    def _within(self, limit, wider) -> bool:
        """Whether every layout that meets ``limit`` meets ``wider``."""
        if wider is None:
            return True
        if limit is None:
            return False
        # the budgeted stand-in's rows hold at least what a rank holds all step, row by row
        nested = limit.rows == wider.rows or (limit.rows, wider.rows) == (BUDGETED, HELD)
        return nested and limit.limit <= wider.limit


def _memory_rows(program: Program, problem: ShardingProblem, ctx: PassContext):
    """Per group and strategy: the bytes a rank holds all step (parameters, their gradients and
    optimizer state, inputs) or keeps from forward to backward (saved activations): the budget's
    linear stand-in; and of those, what no plan can free (parameters, optimizer state, inputs)."""
    meta, strategies = program.table("meta"), problem.strategies
    rows = [[0.0] * len(strategies[g]) for g in problem.groups]
    held = [[0.0] * len(strategies[g]) for g in problem.groups]
    saved = _saved_storage(program)
    for node in program.nodes():
        if node.name not in strategies or node.op == "output" or meta[node.name][0] is None:
            continue
        m = meta[node.name][0]
        if node.name in program.params:
            kept = m.itemsize + optimizer_bytes_per_element(ctx.request.optimizer, m.itemsize)
            per_element = kept + m.itemsize  # and the gradient
        elif node.op == "placeholder":
            kept = per_element = m.itemsize
        elif node.name in saved:  # one copy per micro-batch in flight
            kept, per_element = 0, m.itemsize * ctx.request.activations_in_flight
        else:
            continue
        g = problem.group_of[node.name]
        for k, s in enumerate(strategies[node.name]):
            elements = math.prod(s.out_specs[0].local_shape(m.shape, ctx.mesh))
            rows[g][k] += elements * per_element
            held[g][k] += elements * kept
    return rows, held


def _saved_storage(program: Program) -> set:
    """Forward values backward reads, named by the storage they view."""
    forward = forward_nodes(program)
    return {_storage_base(node).name for node in program.nodes()
            if node.op == "call_function" and node.name in forward and any(u.name not in forward for u in node.users)}


def _storage_base(node):
    """The node whose storage ``node`` views (itself unless it is a view op)."""
    while node.op == "call_function" and len(tensor_inputs(node)) == 1:
        rule = rule_for(node.target)
        if rule is None or not rule.free:
            break
        node = tensor_inputs(node)[0]
    return node


def _infeasible(budget, attempts, peak, mesh) -> AutoparError:
    """The error for a budget no plan meets, with the smallest peak among the plans tried and
    ``peak``, the memory-first plan's (with as much recomputation as helps)."""
    smallest, breakdown = min(attempts + [(peak.peak_bytes, peak.breakdown)], key=lambda a: a[0])
    top = sorted(breakdown.items(), key=lambda kv: -kv[1])[:3]
    return AutoparError(
        f"no plan on mesh {mesh} fits the memory budget of {human_bytes(budget)} per device: the smallest "
        f"peak autopar finds is {human_bytes(smallest)} (" + ", ".join(f"{k.replace('_', ' ')} "
        f"{human_bytes(v)}" for k, v in top) + f"); raise memory_budget to at least {bytes_at_least(smallest)!r}, "
        "use more devices, a lighter optimizer, or recompute='auto' if recomputation is off")
