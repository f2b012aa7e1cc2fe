"""The sharding solver over plain arrays, so it is testable and swappable.

Problem: pick one strategy per node minimising Σ node cost + Σ edge cost, where
an edge (i, j, M) costs M[a][b] when node i takes a and node j takes b;
``math.inf`` forbids a choice or a pair.

An optional ``Overlap`` adds costs that run concurrently with other work (gradient
all-reduces under the backward pass): only max(0, Σ hidden − Σ cover) counts,
linear with one continuous variable E ≥ 0, E ≥ Σ hidden − Σ cover.

Formulation (DESIGN.md): one boolean per (node, strategy) with exactly one per
node, and per edge "marginal" booleans y[a, b] whose row sums equal x_i[a] and
column sums equal x_j[b]. Its LP relaxation is the local polytope, much tighter
than y >= x_i + x_j - 1 linking.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autopar.errors import SolverError
from autopar.solvers.limits import CPSAT_DETERMINISTIC_PER_WORK, DEFAULT_LIMITS, SolveLimits
from autopar.solvers.local_polytope import SCALE, Found, LocalPolytope, allowed_pairs, priced_edges, solve_proto
from autopar.solvers.lp_first import Relaxations, solve_lp_first
from autopar.solvers.reduction import reduce_problem
from autopar.units import human_bytes

Matrix = Sequence[Sequence[float]]
# CP-SAT's objective units per second: whole nanoseconds, as it needs integers (SCIP's and the
# LP's: autopar.solvers.local_polytope.SCALE)
CPSAT_SCALE = 1e9
# SCIP stops at a solution proven within this share of its objective (pywraplp's default)
RELATIVE_GAP = 1e-4


@dataclass(frozen=True)
class SolverResult:
    choice: tuple[int, ...]
    objective: float  # seconds, re-evaluated exactly from the float costs
    bound: float  # seconds: proven lower bound
    # "optimal" | "feasible" | "least-memory" (solve_sharding's last answer: the layout that holds
    # the least memory, optimal for that, with no bound on its time)
    status: str
    seconds: float
    backend: str
    n_variables: int
    n_removed: int = 0  # strategies dropped before the solve (forbidden or dominated)
    # the wall-clock safety net, not the work limit, stopped it: the plan depends on the machine
    timed_out: bool = False

    @property
    def gap(self) -> float:
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)


@dataclass(frozen=True)
class Overlap:
    """``edges`` (priced like the problem's edges) run concurrently with the work in ``cover``
    (per node and strategy, like node costs); only the excess of the first over the second counts."""

    edges: list
    cover: list


@dataclass(frozen=True)
class MemoryLimit:
    """Σ bytes[i][choice_i] ≤ limit: a linear stand-in for the per-device memory budget;
    ``rows`` names what ``bytes`` counts (its caller's word for it)."""

    bytes: list
    limit: float
    rows: str = ""

    def used(self, choice: Sequence[int]) -> float:
        return sum(self.bytes[i][k] for i, k in enumerate(choice))


def evaluate(node_costs: Sequence[Sequence[float]], edges, choice: Sequence[int],
             overlap: Overlap | None = None) -> float:
    total = sum(node_costs[i][k] for i, k in enumerate(choice))
    total += sum(m[choice[i]][choice[j]] for i, j, m in edges)
    if overlap is not None:
        hidden = sum(m[choice[i]][choice[j]] for i, j, m in overlap.edges)
        total += max(0.0, hidden - sum(overlap.cover[i][k] for i, k in enumerate(choice)))
    return total


def brute_force(node_costs, edges, overlap: Overlap | None = None) -> tuple[tuple[int, ...], float]:
    best, best_choice = math.inf, None
    for choice in itertools.product(*(range(len(c)) for c in node_costs)):
        value = evaluate(node_costs, edges, choice, overlap)
        if value < best:
            best, best_choice = value, choice
    if best_choice is None:
        raise SolverError("no feasible assignment")
    return best_choice, best


BACKENDS = ("lp-first", "mip", "cp-sat")
_RELAXATIONS = Relaxations()


def solve(node_costs, edges, *, backend: str = "lp-first", limits: SolveLimits = DEFAULT_LIMITS,
          hint: Sequence[int] | None = None, progress: Callable[[str], None] | None = None,
          overlap: Overlap | None = None, memory: MemoryLimit | None = None,
          relative_gap: float = RELATIVE_GAP) -> SolverResult:
    """``limits``: the work (deterministic) and time (a safety net) the solve may take, with the
    best solution found and its proven bound past them (autopar.solvers.limits).
    ``relative_gap``: SCIP stops at a solution proven within this share of its objective.
    ``backend``: "lp-first" (the LP relaxation, then SCIP on what it leaves open:
    autopar.solvers.lp_first; the default, an exact optimum in seconds where SCIP alone takes
    minutes), "mip" (SCIP on the whole integer program, which proves optimality on our graphs
    where CP-SAT stalls: GPT-2-style 2-layer model on a 2-D mesh, SCIP 5 s optimal vs CP-SAT 60 s
    with a 33% gap) or "cp-sat"."""
    start = time.perf_counter()
    if backend not in BACKENDS:
        raise ValueError(f"unknown solver backend {backend!r}; use one of {', '.join(map(repr, BACKENDS))}")
    if memory is not None:
        _check_memory_floor(node_costs, memory)
    if backend == "lp-first":
        reduced, found = _solve_lp_first(node_costs, edges, hint, overlap, memory, limits, relative_gap, progress)
    else:
        reduced = reduce_problem(node_costs, edges, overlap, memory)
        small_hint = reduced.reduce_choice(hint) if hint is not None else None
        solve_reduced = _solve_mip if backend == "mip" else _solve_cpsat
        found = solve_reduced(reduced.node_costs, reduced.edges, limits, small_hint, reduced.overlap, reduced.memory,
                              relative_gap, progress)
    choice, status, bound = found.choice, found.status, found.bound
    if choice is None:
        if hint is None or math.isinf(evaluate(node_costs, edges, hint, overlap)) or \
                (memory is not None and memory.used(hint) > memory.limit):
            if status == "infeasible":
                raise SolverError(f"the sharding solver ({backend}) proved in {time.perf_counter() - start:.1f} s "
                                  f"that no plan meets the constraints (pins, restrictions, the memory limit): "
                                  f"relax a pin or a restriction")
            limit = (f"{limits.seconds:g} s (its safety time limit): raise solver_time_limit_s" if found.timed_out
                     else f"its work limit of {limits.work}: raise solver_work_limit")
            raise SolverError(f"the sharding solver ({backend}) found no feasible plan within {limit}")
        choice, status, bound = tuple(hint), "feasible", 0.0  # the warm start is always a valid plan
    else:
        choice, bound = reduced.expand(choice), bound + reduced.constant
    value = evaluate(node_costs, edges, choice, overlap)
    # "optimal" is within the relative gap: the bound stays the proven one
    result = SolverResult(tuple(choice), value, min(bound, value), status,
                          time.perf_counter() - start, backend, found.n_variables, reduced.n_removed, found.timed_out)
    if progress is not None:
        progress(f"solver {backend}: {status}, objective {value * 1e3:.4f} ms, bound {result.bound * 1e3:.4f} ms "
                 f"(gap {result.gap:.1%}), {result.n_variables} variables, {result.seconds:.1f} s"
                 + (", stopped by the safety time limit" if result.timed_out else ""))
    return result


def _check_memory_floor(node_costs, memory: MemoryLimit) -> None:
    """Fail at once when even each node's leanest allowed strategy is over the limit: the integer
    program would spend its whole work limit finding nothing (a one-axis step of a big model)."""
    floor = sum(min((b for c, b in zip(costs, row) if not math.isinf(c)), default=0.0)
                for costs, row in zip(node_costs, memory.bytes))
    if floor > memory.limit:
        raise SolverError(f"no layout fits the memory limit: the leanest allowed strategies hold "
                          f"{human_bytes(floor)}, over the limit of {human_bytes(memory.limit)}")


def _solve_lp_first(node_costs, edges, hint, overlap, memory, limits, relative_gap, progress):
    """(the reduced problem, its Found) by autopar.solvers.lp_first, its restrictions solved by
    SCIP; the LP kept for the next solve of the same problem."""
    reduced, relaxation, reused = _RELAXATIONS.get(node_costs, edges, overlap, memory, reduce_problem)
    if reused and progress is not None:
        progress("LP relaxation: the same problem as the last solve, re-optimized at the new memory limit")

    def exact(costs, restricted_edges, warm, left, gap):
        return solve(costs, restricted_edges, backend="mip", limits=left, hint=warm,
                     overlap=reduced.overlap, memory=reduced.memory, relative_gap=gap)

    small_hint = reduced.reduce_choice(hint) if hint is not None else None
    return reduced, solve_lp_first(reduced, relaxation, limits, small_hint, exact, evaluate, relative_gap,
                                   progress or (lambda message: None))


def _solve_mip(node_costs, edges, limits, hint, overlap, memory, relative_gap, progress) -> Found:
    # progress: SCIP reports once, at its end (solve does)
    polytope = LocalPolytope.build(node_costs, edges, overlap, memory)
    solution = solve_proto(polytope.proto(hint=hint), "scip", limits, relative_gap)
    if solution.values is None:
        return Found(None, solution.status, 0.0, polytope.n_variables, solution.timed_out)
    return Found(polytope.choice(solution.values), solution.status, solution.bound / SCALE, polytope.n_variables,
                 solution.timed_out)


def run_scip(solver, limits: SolveLimits, relative_gap: float = RELATIVE_GAP):
    """Solve a pywraplp model with SCIP from its exported proto: (status "optimal" | "feasible" |
    "infeasible" | None when nothing was found within ``limits``, each variable's value by its
    index, the best bound). ``solver.Solve()`` hands SCIP each row's terms in the order of a hash table keyed
    by variable address, which changes from run to run, and so did the tied optimum SCIP
    returns; the proto lists them in index order."""
    from ortools.linear_solver import linear_solver_pb2

    request = linear_solver_pb2.MPModelRequest()
    solver.ExportModelToProto(request.model)
    solution = solve_proto(request.model, "scip", limits, relative_gap)
    return solution.status, solution.values, (None if solution.values is None else solution.bound)


def linear_constraint(solver, terms, lower: float, upper: float) -> None:
    """lower <= Σ coefficient * variable <= upper (a variable listed twice counts twice:
    SetCoefficient overwrites)."""
    constraint = solver.Constraint(lower, upper)
    summed: dict[int, list] = {}
    for var, coefficient in terms:
        summed.setdefault(id(var), [var, 0.0])[1] += coefficient
    for var, coefficient in summed.values():
        constraint.SetCoefficient(var, coefficient)


def _solve_cpsat(node_costs, edges, limits, hint, overlap, memory, relative_gap, progress) -> Found:
    # the backends share one signature; CP-SAT proves to its own gap limit (0), not relative_gap
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    terms: list = []
    x, n_vars = _cpsat_choices(model, node_costs, edges, terms)
    if overlap is not None:
        n_vars += _cpsat_overlap(model, x, overlap, terms)
    if memory is not None:  # whole bytes: CP-SAT is integer
        model.Add(sum(math.ceil(b) * x[i][k] for i, row in enumerate(memory.bytes) for k, b in enumerate(row) if b)
                  <= math.floor(memory.limit))
    model.Minimize(sum(terms))
    if hint is not None:
        for i, k in enumerate(hint):
            for kk, var in enumerate(x[i]):
                model.AddHint(var, kk == k)
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = limits.work * CPSAT_DETERMINISTIC_PER_WORK
    solver.parameters.max_time_in_seconds = limits.seconds
    solver.parameters.num_workers = 1  # deterministic plans
    status = solver.Solve(model, _Progress(progress)) if progress else solver.Solve(model)
    timed_out = status != cp_model.OPTIMAL and limits.outlasted(solver.WallTime())
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Found(None, None, 0.0, n_vars, timed_out)
    choice = tuple(next(k for k, v in enumerate(row) if solver.Value(v)) for row in x)
    status = "optimal" if status == cp_model.OPTIMAL else "feasible"
    return Found(choice, status, solver.BestObjectiveBound() / CPSAT_SCALE, n_vars, timed_out)


def _marginals(add, xi, xj, y, n_a, n_b) -> None:
    for a in range(n_a):
        add(sum(y[a, b] for b in range(n_b) if (a, b) in y) == xi[a])
    for b in range(n_b):
        add(sum(y[a, b] for a in range(n_a) if (a, b) in y) == xj[b])


def _cpsat_choices(model, node_costs, edges, terms: list) -> tuple[list, int]:
    """(a boolean per node and strategy, one true per node; how many variables) with the edges'
    marginals; adds their costs to ``terms``."""
    x = []
    for costs in node_costs:
        row = [model.NewBoolVar("") for _ in costs]
        model.AddExactlyOne(row)
        for var, c in zip(row, costs):
            if math.isinf(c):
                model.Add(var == 0)
            elif c:
                terms.append(_ns(c) * var)
        x.append(row)
    n_vars = sum(len(r) for r in x)
    for i, j, m in priced_edges(edges):
        y = {}
        for a, b, c in allowed_pairs(m):
            y[a, b] = model.NewBoolVar("")
            if c:
                terms.append(_ns(c) * y[a, b])
        _marginals(model.Add, x[i], x[j], y, len(m), len(m[0]))
        n_vars += len(y)
    return x, n_vars


def _cpsat_overlap(model, x: list, overlap: Overlap, terms: list) -> int:
    """Adds the hidden communication's excess over the compute that covers it to ``terms``;
    returns the variables it added."""
    hidden, added = [], 0
    for i, j, m in priced_edges(overlap.edges):
        y = {(a, b): model.NewBoolVar("") for a, b, _ in allowed_pairs(m)}
        _marginals(model.Add, x[i], x[j], y, len(m), len(m[0]))
        hidden += [_ns(c) * y[a, b] for a, b, c in allowed_pairs(m) if c]
        added += len(y)
    cover = [_ns(c) * x[i][k] for i, row in enumerate(overlap.cover) for k, c in enumerate(row) if c]
    excess = model.NewIntVar(0, sum(_ns(c) for _, _, m in overlap.edges for r in m for c in r
                                    if not math.isinf(c)), "excess")
    model.Add(excess >= sum(hidden) - sum(cover))
    terms.append(excess)
    return added


def _ns(seconds: float) -> int:
    return max(1, round(seconds * CPSAT_SCALE))


def _progress_class():
    from ortools.sat.python import cp_model

    class Progress(cp_model.CpSolverSolutionCallback):
        def __init__(self, report):
            super().__init__()
            self.report = report

        def on_solution_callback(self):
            self.report(f"solver: objective {self.ObjectiveValue() / CPSAT_SCALE * 1e3:.3f} ms, "
                        f"bound {self.BestObjectiveBound() / CPSAT_SCALE * 1e3:.3f} ms")

    return Progress


def _Progress(report):
    return _progress_class()(report)
