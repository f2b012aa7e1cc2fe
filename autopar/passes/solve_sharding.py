"""solve_sharding: one strategy per node, by the OR-Tools model in ``autopar.solver``.

Nodes tied together (followers, and the layers cluster_layers matched to a
template layer) share one variable; edges inside a group fold into the group's
own cost. On an N-D mesh the solve starts from autopar.passes.warm_start's
axis-by-axis layout. Two constraints make the program a training step:
the loss ends replicated, and each gradient ends in its parameter's layout.
The first collective of each gradient's move runs under the backward pass
(``Hardware.gradient_overlap``), so only what backward cannot cover counts.

Memory: a linear stand-in (parameters with their gradients and optimizer state,
inputs, saved activations) is kept under the budget; the exact peak of the
solution (autopar.passes.memory) is then checked, and while it is over, the
stand-in's limit drops by the excess and the solve repeats. ZeRO/FSDP-style
layouts (parameters sharded over the data-parallel axis, gathered before use)
come out of this when memory demands them. A solution that fits only with
recomputation (autopar.passes.recompute) counts with the time it adds; of the
solutions tried, the fastest that fits wins (and one whose recomputation adds under 1%
of the step ends the search). On an N-D mesh the solutions tried
are the axis-by-axis descent's; the full integer program runs once, from the
winner, when it is small enough to solve in its time limit, and replaces it only when
it is faster and still fits.
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from autopar.errors import AutoparError, SolverError
from autopar.passes.base import Pass, PassContext
from autopar.passes.collectives import find_redistributions
from autopar.graph_ir import to_ir
from autopar.passes.memory import optimizer_bytes_per_element
from autopar.passes.recompute import fit, memory_budget
from autopar.passes.rule_table import rule_for
from autopar.passes.warm_start import descend_axes
from autopar.program import Program, forward_nodes, tensor_inputs
from autopar.solver import MemoryLimit, Overlap, evaluate, solve
from autopar.units import bytes_at_least, human_bytes, human_seconds


class SolveShardingPass(Pass):
    name = "solve_sharding"
    requires = ("meta", "strategies", "tied_to", "cluster_of", "allowed")
    provides = ("choice", "solver", "fit")

    def run(self, program: Program, ctx: PassContext) -> str:
        meta, strategies, tied = program.table("meta"), program.table("strategies"), program.table("tied_to")
        cluster_of = program.table("cluster_of")
        cost = ctx.cost

        def root(name: str) -> str:
            """The node whose variable decides ``name``'s strategy (same index, same layout)."""
            while True:
                if name in cluster_of:
                    name = cluster_of[name]
                elif name in tied:
                    name = tied[name]
                else:
                    return name

        groups = [n for n in strategies if n not in tied and n not in cluster_of]
        index = {g: i for i, g in enumerate(groups)}
        node_costs = [[0.0] * len(strategies[g]) for g in groups]
        cover = [[0.0] * len(strategies[g]) for g in groups]  # backward compute that gradient syncs hide under
        edge_acc: dict[tuple[int, int], np.ndarray] = {}
        overlap_acc: dict[tuple[int, int], np.ndarray] = {}
        matrices: dict[tuple, np.ndarray] = {}

        def add_edge(src: str, dst: str, kind, matrix_fn, acc_by_pair=edge_acc) -> None:
            """Add matrix_fn(src strategy, dst strategy) to the edge between their groups. Edges of
            clustered layers repeat the template's (same strategies, same shapes): priced once."""
            key = (cluster_of.get(src, src), cluster_of.get(dst, dst), kind)
            matrix = matrices.get(key)
            if matrix is None:
                matrix = matrices[key] = np.array([[matrix_fn(a, b) for b in range(len(strategies[dst]))]
                                                   for a in range(len(strategies[src]))], dtype=float)
            gi, gj = index[root(src)], index[root(dst)]
            if gi == gj:
                own = node_costs[gi]
                for k, c in enumerate(np.diagonal(matrix).tolist()):
                    own[k] += c
            elif (gj, gi) in acc_by_pair:
                acc_by_pair[gj, gi] += matrix.T
            elif (gi, gj) in acc_by_pair:
                acc_by_pair[gi, gj] += matrix
            else:
                acc_by_pair[gi, gj] = matrix.copy()

        forbidden_move = ctx.constraints.move_checker(ctx.mesh)

        def reshard_time(m, src, dst):
            return math.inf if forbidden_move is not None and forbidden_move(src, dst) else \
                cost.reshard_time(m, src, dst)

        forward = forward_nodes(program)
        kappa = cost.hardware.gradient_overlap
        for node in program.nodes():
            if node.op != "call_function":
                continue
            g = index[root(node.name)]
            for k, s in enumerate(strategies[node.name]):
                node_costs[g][k] += s.compute_s
                if node.name not in forward:
                    cover[g][k] += kappa * s.compute_s
            for j, arg in enumerate(tensor_inputs(node)):
                if node.name in tied and tied[node.name] == arg.name and arg.op == "call_function" \
                        and len(meta[arg.name]) > 1:
                    continue  # getitem of a multi-output op: same layout by construction
                src_meta = meta[arg.name][0]
                add_edge(arg.name, node.name, j, lambda a, b, arg=arg, node=node, j=j, m=src_meta: reshard_time(
                    m, strategies[arg.name][a].out_specs[0], strategies[node.name][b].in_specs[j]))

        # the loss must end replicated on every rank
        loss_group = index[root(program.loss)]
        for k, s in enumerate(strategies[program.loss]):
            if not s.out_specs[0].is_replicated():
                node_costs[loss_group][k] = math.inf
        # each gradient must end in its parameter's layout, so the optimizer updates matching shards
        for grad, param in program.gradient_targets():
            def layouts(a, b, g=grad, p=param):
                return meta[g][0], strategies[g][a].out_specs[0], strategies[p][b].out_specs[0]

            hideable = kappa > 0 and index[root(grad)] != index[root(param)]
            add_edge(grad, param, ("sync", hideable), lambda a, b: reshard_time(*layouts(a, b))
                     - (cost.async_time(*layouts(a, b)) if hideable else 0.0))
            if hideable:
                add_edge(grad, param, "hidden sync", lambda a, b: cost.async_time(*layouts(a, b)), overlap_acc)

        allowed = ctx.constraints.allowed(program, strategies, ctx.mesh)
        _check_clustering_saw(allowed, program.table("allowed"), cluster_of)
        for name, keep in allowed.items():
            for k, ok in enumerate(keep):
                if not ok:
                    node_costs[index[root(name)]][k] = math.inf

        edges = [(i, j, m.tolist()) for (i, j), m in edge_acc.items()]
        hint = [_replicated_index(strategies[g]) for g in groups]
        overlap = Overlap([(i, j, m.tolist()) for (i, j), m in overlap_acc.items()], cover) if overlap_acc else None

        def choice_of(result) -> dict:
            return {name: strategies[name][result.choice[index[root(name)]]] for name in strategies}

        time_limit = ctx.options.get("solver_time_limit_s", 60.0)  # per integer program
        options = [strategies[g] for g in groups]

        def run_solver(limit, costs=node_costs, start=hint, bounded=True, descend=True, polish=True):
            """``limit`` None: only what every rank holds all step must fit (never cuts off a plan
            that fits, and spares the solver layouts that cannot); ``bounded`` False: not even that.
            ``polish`` False: on an N-D mesh, the axis-by-axis descent's layout without the full
            integer program after it (which on a deep model's problem finds nothing better in
            its limit; the budget search runs it only on the layout it picks); ``descend`` False:
            the full program from ``start`` alone."""
            begin = time.perf_counter()
            if limit is None and bounded:
                limit = MemoryLimit(held, budget)

            def solve_for(restricted_costs, warm):
                return solve(restricted_costs, edges, backend=ctx.options.get("solver", "mip"),
                             time_limit_s=time_limit, hint=warm if None not in warm else None,
                             progress=ctx.progress, overlap=overlap, memory=limit)

            def solve_step(restricted_costs, warm, step):
                return steps.solve((id(costs), step), limit, lambda: solve_for(restricted_costs, warm))

            def solve_from(first):
                if ctx.mesh.ndim == 1 or None in first or not descend:
                    return solve_for(costs, first)
                warm = descend_axes(solve_step, costs, options, ctx.mesh.ndim, first, ctx.report)
                if warm is None and limit is not None and limit.used(first) > limit.limit:
                    raise SolverError("no one-axis step from the start meets the memory limit")
                return solve_for(costs, list(warm.choice) if warm is not None else first) \
                    if polish or warm is None else warm

            try:
                result = solve_from(start)
            except SolverError:
                # from a start over the limit (data parallel, for a model one mesh axis cannot shard
                # small enough) every one-axis step can be infeasible, and the full solve may find
                # nothing in time: start again from the leanest layout, which meets any limit that can be
                if limit is None or None in start or limit.used(start) <= limit.limit:
                    raise
                ctx.report("no one-axis step from data parallel fits the memory limit; "
                           "starting from the leanest layout")
                result = solve_from(list(lean.choice))
            return dataclasses.replace(result, seconds=time.perf_counter() - begin)

        graph = to_ir(program)
        budget = memory_budget(ctx)

        def fit_of(result, mode=None):
            chosen = choice_of(result)
            return fit(graph, chosen, find_redistributions(program, chosen, cost), ctx, budget, mode)

        rows, held = _memory_rows(program, strategies, groups, index, root, ctx)
        steps = _StepMemo(held, rows)
        lean = _Lean(run_solver, rows, node_costs, lambda choice: evaluate(node_costs, edges, choice, overlap))
        best, attempts = _solve_within_budget(run_solver, fit_of, rows, budget, lean, ctx.report,
                                              ctx.options.get("recompute") == "full")
        if best is not None:  # on a 1-D mesh every solve was the full program already
            # mesh search sets full_program False while it compares meshes, and runs it on the finalists
            polish = ctx.mesh.ndim > 1 and ctx.options.get("full_program", True) \
                and _solvable_in(time_limit, node_costs, edge_acc, ctx.report)
            best = _polished(best, run_solver, fit_of) if polish else best[:2]
        if best is None:
            # the leanest layout, as it is or with as much recomputation as helps: the loop may have
            # missed it (its recomputation solves can time out on deep models); it fits, or nothing
            # found does. Recomputing everything can also raise the peak, hence "none" first.
            lean_fit = fit_of(lean.result, "none")
            if lean_fit.recompute is None and ctx.options.get("recompute") != "none":
                lean_fit = fit_of(lean.result, "full")
            if lean_fit.recompute is None:
                if not attempts:  # even the memory floor failed: the fastest layout may still peak lower
                    fastest = fit_of(run_solver(None, bounded=False))
                    attempts.append((fastest.least.peak_bytes, fastest.least.breakdown))
                raise _infeasible(budget, attempts, lean_fit.least, ctx.mesh)
            best = (lean.result, lean_fit)
        result, program.tables["fit"] = best  # the recompute pass takes this layout's fit as decided here
        program.tables["choice"] = choice_of(result)
        program.tables["solver"] = result
        return (f"{len(groups)} variables groups, {len(edges)} edges, {result.n_variables} booleans, "
                f"{result.status}, objective {result.objective * 1e3:.4f} ms, gap {result.gap:.2%}"
                + (f", {len(attempts)} solves for the memory budget" if len(attempts) > 1 else ""))


_BUDGET_ATTEMPTS = 8
# recomputation adding at most this share of the step is kept without trying layouts that hold
# less: on the 70B model, in five runs while tuning the search, those were 3.7-5% slower where
# recomputation added 0.8-2.5%
_CHEAP_RECOMPUTE = 0.01
# the full program runs when it has at most this many booleans per second of its time limit:
# past that SCIP does not finish even the LP relaxation (Llama-8B's 4 layers on (dp=8, tp=8),
# 218k booleans: 60 s for the relaxation alone on a 2-core machine, so a 10 s limit returned its
# start with bound 0; GPT-3 1.3B's, 41k, solves to optimality in 7 s)
_POLISH_BOOLEANS_PER_SECOND = 10_000


class _Lean:
    """The layouts holding the least memory by the linear stand-in: ``choice``, each node's
    leanest strategy (the start of budgeted solves: it meets any limit that can be met, and on
    a 70B model the descent from it found a step time half that from the solved layout below);
    ``result``, solved with bytes as the objective (a valid plan, reshards and all: the last
    answer when no faster layout fits; solved once, when first needed), reported with its step
    time as the objective and status "least-memory": it is optimal for memory, and no bound on
    its time is known."""

    def __init__(self, run_solver, rows, node_costs, time_of):
        self.run_solver = run_solver
        self.time_of = time_of
        self._result = None
        # bytes as the objective, in GB: the solver scales costs by 1e9 (nanoseconds), and raw
        # bytes would pass SCIP's infinity (1e20) on an 80-layer model
        self.costs = [[math.inf if math.isinf(c) else b / 1e9 for c, b in zip(cr, br)]
                      for cr, br in zip(node_costs, rows)]
        self.choice = [min(range(len(cr)), key=cr.__getitem__) for cr in self.costs]

    @property
    def result(self):
        if self._result is None:
            leanest = self.run_solver(None, self.costs, start=self.choice, bounded=False, polish=False)
            self._result = dataclasses.replace(leanest, objective=self.time_of(leanest.choice), bound=0.0,
                                               status="least-memory")
        return self._result


class _StepMemo:
    """The axis descent's steps solved so far, by (node costs, step). A step's proven optimum
    that meets a tighter memory limit is that limit's optimum too (the limit only removes
    layouts), so a budget attempt skips the steps it shares with the attempts before it (on the
    70B model, the first two of every descent from the leanest layout)."""

    def __init__(self, held_rows, budgeted_rows):
        self.held_rows, self.budgeted_rows = held_rows, budgeted_rows  # see _memory_rows
        self.solved: dict = {}

    def solve(self, key, limit: "MemoryLimit | None", solve_now):
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
        nested = limit.bytes is wider.bytes or (limit.bytes is self.budgeted_rows and wider.bytes is self.held_rows)
        return nested and limit.limit <= wider.limit


def _solve_within_budget(run_solver, fit_of, rows, budget: float, lean: _Lean, report, full_recompute: bool):
    """((the solution that fits the budget, with recomputation if it needs it, for the least step
    time among those tried, its fit, and the stand-in's limit it was solved under) or None; the
    smallest (peak, breakdown) of each layout tried)."""
    stand_in = MemoryLimit(rows, 0)
    limit, attempts, best, best_time = None, [], None, math.inf
    for _ in range(_BUDGET_ATTEMPTS):
        try:
            result = run_solver(None, polish=False) if limit is None else \
                run_solver(MemoryLimit(rows, limit), start=list(lean.choice), polish=False)
        except SolverError:
            break
        if result.objective >= best_time:
            break  # tighter limits only slow the layout further: recomputing is the better answer
        fitted = fit_of(result)
        attempts.append((fitted.least.peak_bytes, fitted.least.breakdown))
        if fitted.recompute is not None and result.objective + fitted.recompute.seconds < best_time:
            best = (result, fitted, None if limit is None else MemoryLimit(rows, limit))
            best_time = result.objective + fitted.recompute.seconds
        if fitted.plain.peak_bytes <= budget or (best is not None and full_recompute):
            break
        if fitted.recompute is not None and fitted.recompute.seconds <= _CHEAP_RECOMPUTE * result.objective:
            # a layout that holds less would have to be slower by less than this to win
            report(f"the plan fits the budget by recomputing ({human_seconds(fitted.recompute.seconds)}, "
                   f"{fitted.recompute.seconds / result.objective:.1%} of the step); keeping it")
            break
        floor = stand_in.used(lean.choice)
        if limit is not None and limit <= floor:
            break  # the leanest layout has been tried
        # the stand-in misses temporaries and collective buffers, so it is only trusted for
        # differences: ask for this solution's stand-in value less the excess. The excess is what
        # it takes to need no recomputation (recomputation then covers what the stand-in misses):
        # the stand-in prices saved activations in full, so aiming at the least peak that
        # recomputation reaches creeps down a layout at a time to ones that fit only by
        # recomputing most of the model (on the 70B model: four attempts, and 162 ms of
        # recomputation, where the layout aimed this way fit with 12 ms)
        over = fitted.plain.peak_bytes - budget
        limit = max(floor, stand_in.used(result.choice) - over)
        if fitted.recompute is None:
            report(f"peak memory {human_bytes(fitted.least.peak_bytes)} is over the budget {human_bytes(budget)}, "
                   "and recomputation cannot close the gap")
        else:
            report(f"the plan fits the budget by recomputing ({human_seconds(fitted.recompute.seconds)}); "
                   "trying layouts that hold less instead")
    return best, attempts


def _solvable_in(time_limit: float, node_costs, edge_acc: dict, report) -> bool:
    """Whether the full program is small enough for SCIP in ``time_limit`` (see
    _POLISH_BOOLEANS_PER_SECOND); says so when it is not."""
    booleans = sum(len(c) for c in node_costs) + sum(int(np.isfinite(m).sum()) for m in edge_acc.values())
    if booleans <= _POLISH_BOOLEANS_PER_SECOND * time_limit:
        return True
    report(f"the full integer program ({booleans} booleans) is too large to solve in {time_limit:.0f} s: "
           "the axis-by-axis layout stands, with no proven bound")
    return False


def _polished(best, run_solver, fit_of):
    """(result, fit) of the budget search's pick after the full integer program from it, under
    the same limit: kept if it is faster and still fits, and otherwise the pick with the full
    program's bound (the search's own bound only held for one axis)."""
    result, fitted, limit = best
    try:
        polished = run_solver(limit, start=list(result.choice), descend=False)
    except SolverError:
        return result, fitted
    if polished.choice == result.choice:
        return polished, fitted
    if polished.objective < result.objective:
        refitted = fit_of(polished)
        if refitted.recompute is not None and polished.objective + refitted.recompute.seconds \
                <= result.objective + fitted.recompute.seconds:
            return polished, refitted
    proven = polished.status == "optimal" and result.objective <= polished.objective * (1 + 1e-9)
    return dataclasses.replace(result, bound=min(polished.bound, result.objective),
                               status="optimal" if proven else "feasible"), fitted


def _memory_rows(program: Program, strategies: dict, groups, index, root, ctx):
    """Per group and strategy: the bytes a rank holds all step (parameters, their gradients and
    optimizer state, inputs) or keeps from forward to backward (saved activations): the budget's
    linear stand-in; and of those, what no plan can free (parameters, optimizer state, inputs)."""
    meta = program.table("meta")
    forward = forward_nodes(program)
    optimizer = ctx.options.get("optimizer", "adam")
    saved = set()  # forward values backward reads, counted at the storage they view
    for node in program.nodes():
        if node.op == "call_function" and node.name in forward and any(u.name not in forward for u in node.users):
            saved.add(_storage_base(node).name)
    rows = [[0.0] * len(strategies[g]) for g in groups]
    held = [[0.0] * len(strategies[g]) for g in groups]
    for node in program.nodes():
        if node.name not in strategies or node.op == "output":
            continue
        m = meta[node.name][0]
        if m is None:
            continue
        if node.name in program.params:
            kept = m.itemsize + optimizer_bytes_per_element(optimizer, m.itemsize)
            per_element = kept + m.itemsize  # and the gradient
        elif node.op == "placeholder":
            kept = per_element = m.itemsize
        elif node.name in saved:
            kept, per_element = 0, m.itemsize
        else:
            continue
        g = index[root(node.name)]
        for k, s in enumerate(strategies[node.name]):
            elements = math.prod(s.out_specs[0].local_shape(m.shape, ctx.mesh))
            rows[g][k] += elements * per_element
            held[g][k] += elements * kept
    return rows, held


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


def _check_clustering_saw(allowed: dict, seen: dict, cluster_of: dict) -> None:
    """Layers were tied by the constraints cluster_layers saw; one added since could bind a
    whole cluster through one of its layers."""
    clustered = set(cluster_of) | set(cluster_of.values())
    late = sorted(n for n in set(allowed) | set(seen) if n in clustered and allowed.get(n) != seen.get(n))
    if late:
        raise AutoparError(f"constraints on {', '.join(late[:3])} came after cluster_layers tied them to other "
                           f"layers: run the pass that adds them before cluster_layers")


def _replicated_index(options) -> int | None:
    for k, s in enumerate(options):
        if all(spec.is_replicated() for spec in s.in_specs + s.out_specs):
            return k
    return None


