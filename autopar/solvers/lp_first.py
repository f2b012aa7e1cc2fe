"""The sharding solve, LP first: an optimum with its proof in seconds where the integer program
alone takes minutes.

The local polytope's LP relaxation is integral or nearly so on these graphs (chains of layers
with short skip edges; Meta's AutoParallel reports the same of its formulation), so:

1. solve the LP relaxation (HiGHS's dual simplex: 0.4 s on the demo decoder, 8 s on the 70B
   shape, where GLOP takes 0.7 s and 41 s), kept in HiGHS to re-optimize (0.5 s on the 70B
   shape) after a branch or a new memory limit;
2. turn its row prices into a proven lower bound (``LocalPolytope.dual_bound``, recomputed in
   float64, so a solver's tolerance cannot make it wrong);
3. find a good solution: the LP's own where it is integral; otherwise the integer program on the
   nodes the LP left fractional (and, where the memory limit binds, on every node whose
   strategies differ in memory: the LP trades memory between them fractionally), the rest
   fixed to the LP's choice (RINS: Danna, Rothberg and Le Pape, Math. Programming 2005);
4. reduced-cost fixing: a strategy or pair of strategies whose reduced cost lifts the bound above
   that solution's objective is in no better solution, so it is ruled out (Nemhauser and
   Wolsey, "Integer and Combinatorial Optimization", 1988, II.2.4);
5. what is left: SCIP where it is small; otherwise branch and bound over the warm LP (best
   bound first, branching on the fractional node whose strategies differ most in memory: on the
   70B shape one branch on the clustered layers' parameter layout lifts the bound from 3.6% to
   0.9% under the optimum), SCIP's own LP being the slow part of large programs.

Where the gap after 3 is already within SCIP's own tolerance, 4 and 5 are skipped.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autopar.errors import SolverError
from autopar.solvers.limits import Budget, SolveLimits
from autopar.solvers.local_polytope import SCALE, Found, LocalPolytope, Relaxation

# a strategy whose LP value is below this is outside the LP's support
_SUPPORT = 1e-6
# left after reduced-cost fixing, SCIP finishes programs of this many variables in seconds
# (the demo decoder's 5.7k in 0.2 s); past it, its LP is what takes the time (the 70B shape's
# 218k: no proof in 60 s)
_SCIP_VARIABLES = 40_000
# a solution over the memory limit by at most this share of it counts as within: HiGHS's default
# primal feasibility tolerance on the memory row (in units of the limit), so that an integral LP
# solution is one (the limit is a linear stand-in, checked exactly after the solve)
_MEMORY_TOLERANCE = 1e-7
# the incumbent search of step 3 stops at a solution proven within this share: step 5 closes the rest
_INCUMBENT_GAP = 1e-3


@dataclass(frozen=True)
class _Problem:
    node_costs: list
    edges: list
    overlap: object
    memory: object
    evaluate: Callable
    exact: Callable  # (node costs, edges, hint, SolveLimits, relative gap) -> SolverResult
    relative_gap: float
    report: Callable
    budget: Budget

    def value(self, choice) -> float:
        """The objective of ``choice``, infinite where it breaks the memory limit."""
        if choice is None or (self.memory is not None and
                              self.memory.used(choice) > self.memory.limit * (1 + _MEMORY_TOLERANCE)):
            return math.inf
        return self.evaluate(self.node_costs, self.edges, choice, self.overlap)

    def solve_exactly(self, node_costs, edges, hint, relative_gap: float):
        """The integer program on a restriction, with the work and time left."""
        result = self.exact(node_costs, edges, hint, self.budget.left(), relative_gap)
        self.budget.charge(result)  # SCIP's work is bounded by what it was given, not counted
        return result

    def closed(self, upper: float, bound: float) -> bool:
        return upper - bound <= self.relative_gap * upper


@dataclass(frozen=True)
class _Relaxed:
    """One LP relaxation, in the indices of the problem it relaxes."""

    bound: float  # seconds: proven for every integer solution
    values: list  # per node, the LP's value of each strategy
    memory_binds: bool

    def fractional(self) -> list[int]:
        return [i for i, v in enumerate(self.values) if v.max() < 1.0 - _SUPPORT]

    def choice(self) -> tuple[int, ...]:
        return tuple(int(np.argmax(v)) for v in self.values)


def solve_lp_first(reduced, relaxation: Relaxation, limits: SolveLimits, hint: Sequence[int] | None,
                   exact: Callable, evaluate: Callable, relative_gap: float, report: Callable[[str], None]) -> Found:
    """``reduced`` (a ReducedProblem) solved, like the integer program's backends.
    ``relaxation``: its LP, as the last solve left it (it is reset here);
    ``exact(node_costs, edges, hint, limits, relative_gap)`` solves a restriction of it with the
    integer program and returns its SolverResult (it raises SolverError when nothing fits)."""
    node_costs, edges = reduced.node_costs, reduced.edges
    budget = Budget(limits)
    problem = _Problem(node_costs, edges, reduced.overlap, reduced.memory, evaluate, exact, relative_gap, report,
                       budget)
    polytope = relaxation.polytope
    relaxation.set_upper(polytope.upper)
    solution = relaxation.solve(limits)
    budget.charge(solution)

    def found(choice, status, bound) -> Found:
        return Found(choice, status, bound, polytope.n_variables, budget.timed_out)
    if solution.status != "optimal":
        report(("the LP relaxation did not finish" if solution.status is None else "the LP relaxation is infeasible")
               + "; solving the integer program alone")
        result = problem.solve_exactly(node_costs, edges, hint, relative_gap)
        return found(result.choice, result.status, result.bound)
    bound_units, reduced_costs = polytope.dual_bound(solution.duals)
    root = _relaxed(polytope, solution)
    incumbent = root.choice() if not root.fractional() else \
        min([_rins(problem, root), hint], key=problem.value)
    upper = problem.value(incumbent)
    report(f"LP relaxation: bound {root.bound * 1e3:.4f} ms, {len(root.fractional())} of {len(node_costs)} nodes "
           f"fractional" + ("" if math.isinf(upper) else f", a solution at {upper * 1e3:.4f} ms"))
    if math.isinf(upper):
        result = problem.solve_exactly(node_costs, edges, hint, relative_gap)
        return found(result.choice, result.status, max(root.bound, result.bound))
    if problem.closed(upper, root.bound):
        return found(tuple(incumbent), "optimal", min(root.bound, upper))
    out = _ruled_out(reduced_costs, bound_units, upper * SCALE)
    report(f"reduced-cost fixing ruled out {int(out.sum())} of {polytope.n_variables} variables")
    if polytope.n_variables - out.sum() <= _SCIP_VARIABLES:
        costs, kept_edges = _without(polytope, out, node_costs, edges)
        choice, status, bound = _scip(problem, costs, kept_edges, incumbent, upper)
    else:
        choice, status, bound = _branch_and_bound(problem, relaxation, np.where(out, 0.0, polytope.upper), root,
                                                  incumbent, upper)
    return found(choice, status, max(root.bound, bound))


class Relaxations:
    """The last problems' reduced arrays and LPs, so that the same problem at a new memory limit
    (the budget search's attempts) is re-optimized from its last basis, not rebuilt. Matched by
    content (a frozen copy), so arrays changed in place are never taken for the ones solved."""

    def __init__(self, size: int = 2):
        self.size, self.entries = size, []  # [(frozen problem, reduced problem, Relaxation)], newest last

    def get(self, node_costs, edges, overlap, memory, reduce: Callable):
        """(the reduced problem at ``memory``'s limit, its LP, whether both were reused)."""
        key = _frozen((node_costs, edges, None if overlap is None else (overlap.edges, overlap.cover),
                       None if memory is None else memory.bytes))
        for frozen, reduced, relaxation in self.entries:
            if frozen == key:
                if memory is not None:
                    reduced = dataclasses.replace(reduced, memory=dataclasses.replace(reduced.memory,
                                                                                      limit=memory.limit))
                    relaxation.set_memory_limit(memory.limit)
                return reduced, relaxation, True
        reduced = reduce(node_costs, edges, overlap, memory)
        relaxation = LocalPolytope.build(reduced.node_costs, reduced.edges, reduced.overlap,
                                         reduced.memory).relaxation()
        self.entries = (self.entries + [(key, reduced, relaxation)])[-self.size:]
        return reduced, relaxation, False


def _frozen(value):
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _relaxed(polytope: LocalPolytope, solution) -> _Relaxed:
    binds = polytope.memory_row is not None and solution.duals[polytope.memory_row] < 0
    return _Relaxed(solution.bound / SCALE, [solution.values[ix] for ix in polytope.x], binds)


def _scip(problem: _Problem, costs, edges, incumbent, upper):
    """(choice, status, bound) of the fixed problem by SCIP from the incumbent. A better solution
    than the incumbent uses no ruled-out variable: the restricted program's bound holds for the
    whole problem below the incumbent, and the incumbent bounds the rest."""
    result = problem.solve_exactly(costs, edges, list(incumbent), problem.relative_gap)
    if result.objective > upper:  # stopped before it reached the incumbent
        return tuple(incumbent), "feasible", min(result.bound, upper)
    return result.choice, "optimal" if result.status == "optimal" else "feasible", min(result.bound, upper)


def _branch_and_bound(problem: _Problem, relaxation: Relaxation, fixed_upper: np.ndarray, root: _Relaxed,
                      incumbent, upper):
    """(choice, status, bound): best bound first over the warm LP with ``fixed_upper`` (reduced-cost
    fixing's), from ``root``'s solution (still optimal: fixing removes no variable the LP uses).
    A child allows the node's LP choice alone, or every other strategy; its LP re-optimizes from
    the last basis."""
    polytope = relaxation.polytope
    best, counter = (tuple(incumbent), upper), 0
    frontier = [(root.bound, counter, (), root)]  # (bound, tie, ((node, strategy, kept alone?), ...), LP)
    closed_at = math.inf  # the least bound of the subtrees closed without an integral LP of their own
    while frontier:
        bound, _, branches, relaxed = frontier[0]
        if problem.closed(best[1], bound):
            break
        if problem.budget.exhausted():
            problem.report(f"branch and bound: {problem.budget.stopped_by()} limit, {len(frontier)} open")
            break
        heapq.heappop(frontier)
        i = _branching_node(relaxed, problem.memory)
        k = int(np.argmax(relaxed.values[i]))
        for alone in (True, False):
            child = branches + ((i, k, alone),)
            relaxation.set_upper(_upper_of(polytope, fixed_upper, child))
            solution = relaxation.solve(problem.budget.left())
            problem.budget.charge(solution)
            if solution.status is None:  # out of work or time: the parent's bound stands for this subtree
                closed_at = min(closed_at, bound)
                continue
            if solution.status == "infeasible":
                continue
            solved = _relaxed(polytope, solution)
            rounded = solved.choice()  # the LP's own where it is integral, else its largest values: often a solution
            rounded_value = problem.value(rounded)
            if rounded_value < best[1]:
                best = (rounded, rounded_value)
                problem.report(f"branch and bound: a solution at {best[1] * 1e3:.4f} ms")
            if solved.fractional() and not problem.closed(best[1], solved.bound):
                counter += 1
                heapq.heappush(frontier, (solved.bound, counter, child, solved))
            else:  # its optimum is its LP's, or within the gap of the incumbent
                closed_at = min(closed_at, solved.bound)
        problem.report(f"branch and bound: bound {min([f[0] for f in frontier[:1]] + [closed_at, best[1]]) * 1e3:.4f}"
                       f" ms, {len(frontier)} open")
    proven = min([f[0] for f in frontier[:1]] + [closed_at, best[1]])
    return best[0], "optimal" if problem.closed(best[1], proven) else "feasible", proven


def _upper_of(polytope: LocalPolytope, fixed_upper: np.ndarray, branches) -> np.ndarray:
    upper = fixed_upper.copy()
    for i, k, alone in branches:
        for kk, v in enumerate(polytope.x[i].tolist()):
            if (kk == k) != alone:
                upper[v] = 0.0
    return upper


def _branching_node(relaxed: _Relaxed, memory) -> int:
    """The fractional node whose LP mix spans the most memory where the limit binds (the
    knapsack the relaxation splits), else the most fractional one."""
    def spread(i):
        support = [k for k, v in enumerate(relaxed.values[i]) if v > _SUPPORT]
        held = [memory.bytes[i][k] for k in support]
        return max(held) - min(held)

    fractional = relaxed.fractional()
    if relaxed.memory_binds and any(spread(i) > 0 for i in fractional):
        return max(fractional, key=spread)
    return min(fractional, key=lambda i: relaxed.values[i].max())


def _rins(problem: _Problem, root: _Relaxed):
    """Step 3: the integer program with the LP's integral nodes fixed to its choice, its
    fractional ones free among the strategies it mixes, and, where the memory limit binds, every
    node whose strategies differ in memory free among all of them; None where that restriction
    has no solution."""
    memory_nodes = set()
    if root.memory_binds:
        memory_nodes = {i for i, row in enumerate(problem.memory.bytes)
                        if len({b for b, c in zip(row, problem.node_costs[i]) if not math.isinf(c)}) > 1}

    def allowed(i, k):
        return i in memory_nodes or root.values[i][k] > _SUPPORT

    costs = [[c if allowed(i, k) else math.inf for k, c in enumerate(row)] for i, row in enumerate(problem.node_costs)]
    try:
        return problem.solve_exactly(costs, problem.edges, None, _INCUMBENT_GAP).choice
    except SolverError:
        return None


def _ruled_out(reduced: np.ndarray, bound_units: float, upper_units: float) -> np.ndarray:
    """Per variable, whether it is at 0 in every solution better than ``upper_units``: at 1 it
    would add at least max(reduced cost, 0) to the bound (see LocalPolytope.dual_bound)."""
    slack = upper_units - bound_units + 1e-9 * max(1.0, abs(upper_units))
    return np.maximum(reduced, 0.0) > slack


def _without(polytope: LocalPolytope, out: np.ndarray, node_costs, edges):
    """(node costs, edges) with the ruled-out strategies and pairs of strategies infinite."""
    costs = [[math.inf if out[v] else c for v, c in zip(ix.tolist(), row)] for ix, row in zip(polytope.x, node_costs)]
    kept_edges = []
    for (i, j, m), y in zip(edges, polytope.pairs):
        if y is not None:
            m = [list(r) for r in m]
            for (a, b), v in y.items():
                if out[v]:
                    m[a][b] = math.inf
        kept_edges.append((i, j, m))
    return costs, kept_edges
