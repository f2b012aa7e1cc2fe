"""The sharding problem's integer program as arrays: the local-polytope form (DESIGN.md,
"Solver formulation"), built once with numpy, handed to SCIP as a proto and to HiGHS as its LP
relaxation (``Relaxation``, kept warm).

Variables, in this order: one per (node, strategy), ``x``; per priced edge, one per allowed
pair of strategies, ``y`` (continuous: once ``x`` is integral the marginal rows force ``y``
integral too); the hidden gradient syncs' own pairs where no priced edge has them; and the
excess of hidden over cover, ``E``. Rows: exactly one strategy per node; an edge's row and
column marginals; Σ hidden − Σ cover − E ≤ 0; and the memory row (bytes over the limit ≤ 1).

Built as a proto in variable order, the model is the same from run to run, and so is the
optimum SCIP returns among tied ones (rows built through pywraplp reach SCIP in the order of
a hash table keyed by address, and tied optima differed between runs).

``dual_bound`` turns any row prices into a proven lower bound (weak duality: Lagrangian
relaxation over the variables' boxes), recomputed here in float64 rather than trusted from the
solver, and gives each variable's reduced cost for reduced-cost fixing.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from autopar.solvers.limits import SolveLimits, node_work, resolve_work

# objective units per second. In microseconds: in nanoseconds, with coefficients up to 1e10,
# SCIP's LP runs into numerical trouble on large layers (README, "Solving at scale")
SCALE = 1e6


@dataclass
class Row:
    index: np.ndarray  # variable indices
    coefficient: np.ndarray
    lower: float
    upper: float


@dataclass
class LocalPolytope:
    objective: np.ndarray  # per variable, in SCALE units
    upper: np.ndarray  # every variable's lower bound is 0
    integer: np.ndarray  # bool per variable
    rows: list  # of Row
    x: list  # per node: the variable index of each strategy
    pairs: list  # per edge of the problem: {(a, b): variable index}, or None where it prices nothing
    memory_row: int | None  # the memory limit's row, None without one
    memory_unit: float  # bytes per unit of the memory row

    @property
    def n_variables(self) -> int:
        return len(self.objective)

    @classmethod
    def build(cls, node_costs, edges, overlap=None, memory=None) -> LocalPolytope:
        builder = _Builder(node_costs)
        shared = {}
        for i, j, m in edges:
            y = builder.pairs(i, j, m, price=True) if _prices(m) else None
            builder.edge_pairs.append(y)
            if y is not None:
                shared.setdefault((i, j), y)
        if overlap is not None:
            builder.overlap(overlap, shared)
        if memory is not None:  # in units of the limit: bytes (up to 1e11) next to costs near 1
            builder.memory_unit = memory.limit if memory.limit > 0 else 1.0
            terms = [(builder.x[i][k], b / builder.memory_unit) for i, row in enumerate(memory.bytes)
                     for k, b in enumerate(row) if b]
            builder.row(terms, -math.inf, memory.limit / builder.memory_unit)
            builder.memory_row = len(builder.rows) - 1
        return builder.finish(cls)

    def set_memory_limit(self, limit: float) -> None:
        """The memory row's bound at a new ``limit``: ``dual_bound`` prices the row at its bound,
        so a re-optimized LP read against the old one would prove a wrong bound (above the
        optimum, where the limit was raised)."""
        self.rows[self.memory_row].upper = limit / self.memory_unit
        self.__dict__.pop("row_bounds", None)  # the cached arrays, rebuilt from the rows

    def proto(self, hint=None):
        """The integer program as an MPModelProto (minimised; ``hint``: one strategy per node)."""
        from ortools.linear_solver import linear_solver_pb2

        model = linear_solver_pb2.MPModelProto()
        for c, u, z in zip(self.objective.tolist(), self.upper.tolist(), self.integer.tolist()):
            model.variable.add(lower_bound=0.0, upper_bound=u, objective_coefficient=c, is_integer=z)
        for row in self.rows:
            constraint = model.constraint.add(lower_bound=row.lower, upper_bound=row.upper)
            constraint.var_index.extend(row.index.tolist())
            constraint.coefficient.extend(row.coefficient.tolist())
        if hint is not None:
            model.solution_hint.var_index.extend(int(self.x[i][k]) for i, k in enumerate(hint))
            model.solution_hint.var_value.extend([1.0] * len(hint))
        return model

    def relaxation(self) -> Relaxation:
        return Relaxation(self)

    def choice(self, values) -> tuple[int, ...]:
        """Each node's strategy of largest value."""
        values = np.asarray(values)
        return tuple(int(np.argmax(values[ix])) for ix in self.x)

    @functools.cached_property
    def row_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's (lower, upper) bound as arrays (±inf where a side is free)."""
        return np.array([row.lower for row in self.rows]), np.array([row.upper for row in self.rows])

    @functools.cached_property
    def coefficients(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row's coefficients as (row, variable, value) arrays."""
        return (np.concatenate([np.full(len(row.index), r) for r, row in enumerate(self.rows)]),
                np.concatenate([row.index for row in self.rows]),
                np.concatenate([row.coefficient for row in self.rows]))

    def dual_bound(self, duals, upper: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """(a lower bound on every integer solution's objective, in SCALE units; each variable's
        reduced cost) for row prices ``duals``. For prices π and reduced costs d = c − Aᵀπ, any
        feasible v has c·v = π·Av + d·v ≥ Σ_rows min(π·lower, π·upper) + Σ_vars min(0, d)·upper.
        A price whose row has no bound on the side it needs counts as 0. ``upper``: the variables'
        upper bounds where a restriction lowered some (to 0)."""
        lower, upper_rows = self.row_bounds
        prices = np.asarray(duals, dtype=float).copy()
        prices[((prices > 0) & np.isinf(lower)) | ((prices < 0) & np.isinf(upper_rows))] = 0.0
        row_of, column, value = self.coefficients
        reduced = self.objective - np.bincount(column, weights=value * prices[row_of], minlength=self.n_variables)
        priced = prices != 0  # (a free side is infinite: 0 × inf would be nan)
        bound = float(prices[priced] @ np.where(prices > 0, lower, upper_rows)[priced])
        bound += float(np.minimum(reduced, 0.0) @ (self.upper if upper is None else upper))
        return bound, reduced


@dataclass(frozen=True)
class Solution:
    status: str | None  # "optimal" | "feasible" | "infeasible" | None: nothing found in time
    values: np.ndarray | None  # per variable
    duals: np.ndarray | None  # per row, from an LP
    bound: float  # the solver's own best bound, SCALE units
    work: int = 0  # spent, in autopar.solvers.limits' units (the LP's iterations and re-solve)
    timed_out: bool = False  # the wall-clock safety net stopped it


@dataclass(frozen=True)
class Found:
    """A backend's answer in the problem's own indices."""

    choice: tuple[int, ...] | None  # per node, its strategy; None: nothing found
    status: str | None  # as Solution's
    bound: float  # seconds, proven for every solution
    n_variables: int
    timed_out: bool = False  # the wall-clock safety net stopped some part of the solve


SOLVER_TYPES = {"scip": "SCIP_MIXED_INTEGER_PROGRAMMING"}


def solve_proto(model, kind: str, limits: SolveLimits, relative_gap: float | None = None) -> Solution:
    """Solve an MPModelProto with ``kind`` (a key of SOLVER_TYPES) within ``limits``: SCIP's
    nodes and each LP's iterations from the work limit (autopar.solvers.limits), the time limit
    as its safety net. ``relative_gap``: SCIP stops at a solution proven within it (pywraplp's
    default is 1e-4; the proto's own, 0, solves large problems slower)."""
    from ortools.linear_solver import linear_solver_pb2, pywraplp

    if limits.work <= 0:  # SCIP's presolve alone is unbounded by nodes: on the 70B shape, minutes
        return Solution(None, None, None, -math.inf)
    request = linear_solver_pb2.MPModelRequest(model=model, solver_time_limit_seconds=limits.seconds)
    request.solver_type = linear_solver_pb2.MPModelRequest.SolverType.Value(SOLVER_TYPES[kind])
    nodes = max(1, limits.work // node_work(len(model.variable)))
    parameters = [f"limits/totalnodes = {nodes}", f"lp/iterlim = {max(1, limits.work)}"]
    if relative_gap is not None:
        parameters.append(f"limits/gap = {relative_gap!r}")
    request.solver_specific_parameters = "\n".join(parameters)
    response = linear_solver_pb2.MPSolutionResponse()
    start = time.perf_counter()
    pywraplp.Solver.SolveWithProto(request, response)
    timed_out = limits.outlasted(time.perf_counter() - start)
    status = {linear_solver_pb2.MPSOLVER_OPTIMAL: "optimal", linear_solver_pb2.MPSOLVER_FEASIBLE: "feasible",
              linear_solver_pb2.MPSOLVER_INFEASIBLE: "infeasible"}.get(response.status)
    if status in (None, "infeasible"):
        return Solution(status, None, None, -math.inf, timed_out=timed_out and status is None)
    duals = np.array(response.dual_value, dtype=float) if len(response.dual_value) else None
    return Solution(status, np.array(response.variable_value, dtype=float), duals, response.best_objective_bound,
                    timed_out=timed_out and status != "optimal")


class Relaxation:
    """The polytope's LP relaxation in HiGHS, kept to re-optimize from its last basis after a
    change of variable bounds (a branch, reduced-cost fixing) or of the memory limit: HiGHS's
    dual simplex takes 8 s on the 70B shape's LP and 0.5 s to re-optimize a branch of it. (Not
    through OR-Tools: its HiGHS interface, 9.15, returns row activities in place of row prices;
    GLOP's prices are right, but it takes 41 s on that LP.)"""

    def __init__(self, polytope: LocalPolytope):
        import highspy

        self.polytope = polytope
        self.upper = polytope.upper.copy()  # the current upper bounds
        with _stdout_silenced():  # HiGHS prints its banner from C when a process makes its first model
            self.highs = highspy.Highs()
        self.highs.setOptionValue("output_flag", False)
        # serial: its dual simplex runs on one thread anyway, and the worker thread HiGHS starts
        # otherwise outlives the solve; a process that planned (a torchrun rank) then aborted at
        # exit once ("terminate called without an active exception")
        self.highs.setOptionValue("threads", 1)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = polytope.n_variables, len(polytope.rows)
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = polytope.objective, np.zeros(polytope.n_variables), self.upper
        infinite = highspy.kHighsInf
        lower, upper = polytope.row_bounds
        lp.row_lower_, lp.row_upper_ = np.maximum(lower, -infinite), np.minimum(upper, infinite)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = _by_column(polytope)
        self.highs.passModel(lp)

    def set_upper(self, upper: np.ndarray) -> None:
        """New upper bounds (0 or the polytope's own) for every variable; only changes are passed."""
        changed = np.nonzero(upper != self.upper)[0]
        if len(changed):
            self.highs.changeColsBounds(len(changed), changed.astype(np.int32), np.zeros(len(changed)),
                                        upper[changed].astype(float))
            self.upper = upper.copy()

    def set_memory_limit(self, limit: float) -> None:
        row = self.polytope.memory_row
        self.polytope.set_memory_limit(limit)
        self.highs.changeRowBounds(row, -self.highs.getInfinity(), self.polytope.rows[row].upper)

    def solve(self, limits: SolveLimits) -> Solution:
        """The optimum under the current bounds, its row prices and the bound they prove (SCALE
        units), or status "infeasible", or None when a limit stopped it; with the work it spent."""
        import highspy

        # HiGHS's iteration count and clock run on over every solve of this model
        info = self.highs.getInfo()
        iterations = info.simplex_iteration_count
        self.highs.setOptionValue("simplex_iteration_limit", iterations + max(1, limits.work))
        self.highs.setOptionValue("time_limit", self.highs.getRunTime() + float(limits.seconds))
        self.highs.run()
        work = self.highs.getInfo().simplex_iteration_count - iterations + resolve_work(self.polytope.n_variables)
        status = self.highs.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return Solution("infeasible", None, None, -math.inf, work)
        if status != highspy.HighsModelStatus.kOptimal:
            return Solution(None, None, None, -math.inf, work, status == highspy.HighsModelStatus.kTimeLimit)
        solution = self.highs.getSolution()
        duals = np.array(solution.row_dual, dtype=float)
        return Solution("optimal", np.array(solution.col_value, dtype=float), duals,
                        self.polytope.dual_bound(duals, self.upper)[0], work)


@contextlib.contextmanager
def _stdout_silenced():
    """File descriptor 1 to /dev/null for the duration (C code's printf, which sys.stdout misses)."""
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _by_column(polytope: LocalPolytope):
    """The rows' coefficients as a column-wise sparse matrix: (column starts, row indices, values)."""
    row_of, column, value = polytope.coefficients
    n_variables = polytope.n_variables
    order = np.argsort(column, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(column, minlength=n_variables))])
    return starts.astype(np.int32), row_of[order].astype(np.int32), value[order]


def priced_edges(edges):
    """Edges that can change the objective or forbid a pair (an all-zero matrix constrains nothing)."""
    return [(i, j, m) for i, j, m in edges if _prices(m)]


def _prices(m) -> bool:
    return any(v != 0.0 for r in m for v in r)


def allowed_pairs(m):
    return [(a, b, c) for a, r in enumerate(m) for b, c in enumerate(r) if not math.isinf(c)]


class _Builder:
    def __init__(self, node_costs):
        self.objective, self.upper, self.integer, self.rows = [], [], [], []
        self.x = []
        self.edge_pairs = []
        self.memory_row, self.memory_unit = None, 1.0
        for costs in node_costs:
            ix = self.variables([0.0 if math.isinf(c) else c * SCALE for c in costs],
                                [0.0 if math.isinf(c) else 1.0 for c in costs], integer=True)
            self.x.append(ix)
            self.row([(v, 1.0) for v in ix.tolist()], 1.0, 1.0)

    def variables(self, objective, upper, integer: bool) -> np.ndarray:
        start = len(self.objective)
        self.objective += objective
        self.upper += upper
        self.integer += [integer] * len(objective)
        return np.arange(start, len(self.objective))

    def row(self, terms, lower, upper) -> None:
        summed: dict[int, float] = {}  # a variable listed twice counts twice
        for v, c in terms:
            summed[int(v)] = summed.get(int(v), 0.0) + c
        self.rows.append(Row(np.fromiter(summed, dtype=np.int64, count=len(summed)),
                             np.fromiter(summed.values(), dtype=float, count=len(summed)), lower, upper))

    def pairs(self, i, j, m, price: bool) -> dict:
        allowed = allowed_pairs(m)
        ix = self.variables([c * SCALE if price else 0.0 for _, _, c in allowed], [1.0] * len(allowed), integer=False)
        y = {(a, b): int(v) for (a, b, _), v in zip(allowed, ix.tolist())}
        by_row = [[(self.x[i][a], -1.0)] for a in range(len(m))]
        by_column = [[(self.x[j][b], -1.0)] for b in range(len(m[0]))]
        for (a, b), v in y.items():
            by_row[a].append((v, 1.0))
            by_column[b].append((v, 1.0))
        for terms in by_row + by_column:  # Σ_b y[a, b] = x_i[a] and Σ_a y[a, b] = x_j[b]
            self.row(terms, 0.0, 0.0)
        return y

    def overlap(self, overlap, shared: dict) -> None:
        """Σ hidden − Σ cover − E ≤ 0, E priced at 1 per unit. The hidden part of an edge the
        objective also prices reads that edge's y: fresh marginals would let the relaxation pick
        another joint choice for it."""
        terms, most_hidden = [], 0.0
        for i, j, m in priced_edges(overlap.edges):
            y = _shared_pairs(shared, i, j)
            if y is None:
                y = self.pairs(i, j, m, price=False)
            terms += [(y[a, b], c * SCALE) for a, b, c in allowed_pairs(m) if c and (a, b) in y]
            most_hidden += max((c for _, _, c in allowed_pairs(m)), default=0.0) * SCALE
        terms += [(self.x[i][k], -c * SCALE) for i, row in enumerate(overlap.cover) for k, c in enumerate(row) if c]
        excess = self.variables([1.0], [max(most_hidden, 1.0)], integer=False)  # finite: the bound needs it
        self.row(terms + [(int(excess[0]), -1.0)], -math.inf, 0.0)

    def finish(self, cls) -> LocalPolytope:
        return cls(np.array(self.objective, dtype=float), np.array(self.upper, dtype=float),
                   np.array(self.integer, dtype=bool), self.rows, self.x, self.edge_pairs, self.memory_row,
                   self.memory_unit)


def _shared_pairs(pairs: dict, i: int, j: int):
    """The y of an edge between nodes i and j, indexed [choice of i, choice of j], or None. A pair
    it lacks is one the edge forbids."""
    if (i, j) in pairs:
        return pairs[i, j]
    if (j, i) in pairs:
        return {(a, b): var for (b, a), var in pairs[j, i].items()}
    return None
