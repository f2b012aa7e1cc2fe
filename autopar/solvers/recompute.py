"""The recomputation solver over plain arrays, so it is testable against brute force.

The forward values that backward reads are either kept (held from forward into
backward) or recomputed just before their first backward use, from inputs that
are kept or recomputed in turn (so a chain is recomputed back to kept values).
Choose the recomputed set that adds the least time while the memory held at a
few points of backward stays under a limit.

Memory at a point ``t`` of backward: what the program holds there anyway
(``fixed[t]``: parameters, gradients, temporaries), plus each forward storage
held at ``t`` by a kept value (until its last use, or until a recomputation
that reads it), or by a recomputed copy (from the moment it is recomputed to
its last use). A value is recomputed at its first backward use or earlier, when
a recomputation that reads it runs earlier: that is the ``started`` variable,
which follows chains. This is the boolean-program view of Checkmate (Jain et
al., MLSys 2020) reduced to one recomputation per value.

Variables per value v: r_v (recomputed), k_v (kept), and per point t
started_{v,t}; per storage s and point t, held_{s,t}.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from autopar.errors import SolverError
from autopar.solvers.limits import DEFAULT_LIMITS, SolveLimits
from autopar.solvers.sharding import linear_constraint, run_scip

INF = math.inf


@dataclass(frozen=True)
class RecomputeProblem:
    seconds: Sequence[float]  # per value: the time to recompute it; inf where it cannot be
    inputs: Sequence[Sequence[int]]  # per value: the values its computation reads (never-freed inputs left out)
    storage: Sequence[int]  # per value: the storage it lives in (views share their base's)
    storage_bytes: Sequence[float]  # per storage
    first_use: Sequence[int | None]  # per value: the first backward point index it is read at (None: never)
    last_use: Sequence[int | None]  # per value: the last backward point index it is read at
    hold_until: Sequence[int | None]  # per value: the last point a kept copy is held (its last use, or a
    # recomputation that reads it)
    fixed: Sequence[float]  # per point: bytes held regardless of the choice
    at: Sequence[int] = ()  # per point, for the caller: the program statement it stands for
    # micro-batches whose saved values the device holds at once (a pipeline stage's in flight):
    # the storages held at the first point (where backward starts) count that many times at
    # every point, the other micro-batches' copies held all through this one's backward
    in_flight: int = 1

    @property
    def n(self) -> int:
        return len(self.seconds)

    @property
    def points(self) -> range:
        return range(len(self.fixed))

    def consumers(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for v, ins in enumerate(self.inputs):
            for w in ins:
                out[w].append(v)
        return out

    def storage_last_use(self) -> list[int]:
        last = [-1] * len(self.storage_bytes)
        for v in range(self.n):
            if self.last_use[v] is not None:
                last[self.storage[v]] = max(last[self.storage[v]], self.last_use[v])
        return last


@dataclass(frozen=True)
class RecomputeChoice:
    recomputed: tuple[int, ...]
    seconds: float  # added time
    memory: float  # the model's peak over the points
    status: str  # "optimal" | "feasible"


def _first(problem: RecomputeProblem, v: int) -> float:
    return problem.first_use[v] if problem.first_use[v] is not None else INF


def memory_of(problem: RecomputeProblem, recomputed: set) -> list[float]:
    """The model's bytes at each point when ``recomputed`` is recomputed and the rest is kept where
    needed: the function the solver keeps under the limit, evaluated directly."""
    consumers = problem.consumers()
    kept = [v not in recomputed and (problem.first_use[v] is not None or any(c in recomputed for c in consumers[v]))
            for v in range(problem.n)]
    start: dict[int, float] = {}  # recomputed value -> the point it is recomputed at

    def started(v: int) -> float:
        if v not in start:
            start[v] = INF  # cycles cannot occur (inputs come earlier), but guard anyway
            start[v] = min([_first(problem, v)] + [started(c) for c in consumers[v] if c in recomputed])
        return start[v]

    last = problem.storage_last_use()
    held_bytes = []
    for t in problem.points:
        held = set()
        for v in range(problem.n):
            s = problem.storage[v]
            kept_here = kept[v] and problem.hold_until[v] is not None and problem.hold_until[v] >= t
            if kept_here or (v in recomputed and started(v) <= t <= last[s]):
                held.add(s)
        held_bytes.append(sum(problem.storage_bytes[s] for s in held))
    in_flight = (problem.in_flight - 1) * held_bytes[0] if held_bytes else 0.0
    return [fixed + held + in_flight for fixed, held in zip(problem.fixed, held_bytes)]


def brute_force(problem: RecomputeProblem, limit: float) -> tuple[float, tuple[int, ...]]:
    """(least added seconds, recomputed set) over every subset of the recomputable values."""
    candidates = [v for v in range(problem.n) if not math.isinf(problem.seconds[v])]
    best = (INF, ())
    for k in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, k):
            seconds = sum(problem.seconds[v] for v in subset)
            if seconds < best[0] and max(memory_of(problem, set(subset)), default=0.0) <= limit:
                best = (seconds, subset)
    if math.isinf(best[0]):
        raise SolverError("no recomputation meets the limit")
    return best


def solve(problem: RecomputeProblem, limit: float | None = None, *, limits: SolveLimits = DEFAULT_LIMITS,
          horizon: int | None = None, relative_gap: float = 0.0, fold_views: bool = False) -> RecomputeChoice:
    """Least added time with the model's memory ≤ ``limit`` at every point; ``limit=None`` asks
    for the least memory instead (and the least time among plans with that memory).

    Three shortcuts for deep models, each giving plans that meet the limit, possibly slower ones:
    ``horizon``: a value is recomputed at most this many points before its own first use (or,
    for a value backward never reads, its readers'). None allows any chain, back to the forward
    pass's first value; a few points keep chains within a few layers (as checkpointing every
    few layers does) and cut the program several times on deep models. ``relative_gap``: stop at a
    solution proven within this fraction of the optimum (status "feasible" unless it is 0).
    ``fold_views``: see ``_fold_free_views``."""
    target, group_of = _fold_free_views(problem) if fold_views else (problem, None)
    if limit is None:
        limit = limit_at(_solve(target, None, limits, horizon, relative_gap))
    return _unfolded(problem, _solve(target, limit, limits, horizon, relative_gap), group_of)


def least_memory(problem: RecomputeProblem, *, limits: SolveLimits = DEFAULT_LIMITS, horizon: int | None = None,
                 relative_gap: float = 0.0, fold_views: bool = False) -> RecomputeChoice:
    """A set with the least memory (within ``relative_gap``), not the least time among such sets:
    ``solve(problem, None)`` without its second solve, for a caller that only needs to know how
    low the memory goes. Shortcuts as in ``solve``; with ``fold_views``, ``memory`` is the folded
    model's (at least the set's own): a limit that ``solve`` with the same shortcuts can meet."""
    target, group_of = _fold_free_views(problem) if fold_views else (problem, None)
    found = _solve(target, None, limits, horizon, relative_gap)
    return dataclasses.replace(_unfolded(problem, found, group_of), memory=found.memory)


def limit_at(lowest: RecomputeChoice) -> float:
    """The limit under which ``solve`` finds the least time at ``lowest``'s memory (a least-memory
    choice): a hair above it, so the solver's rounding cannot make it infeasible."""
    return lowest.memory * (1 + 1e-9) + 1.0


def _unfolded(problem: RecomputeProblem, found: RecomputeChoice, group_of) -> RecomputeChoice:
    """``found`` on the problem before _fold_free_views (``group_of`` None: it was not folded)."""
    if group_of is None:
        return found
    recomputed = set(found.recomputed)
    chosen = tuple(v for v in range(problem.n) if group_of[v] in recomputed and not math.isinf(problem.seconds[v]))
    return RecomputeChoice(chosen, sum(problem.seconds[v] for v in chosen),
                           max(memory_of(problem, set(chosen)), default=0.0), found.status)


def _fold_free_views(problem: RecomputeProblem) -> tuple[RecomputeProblem, list[int]]:
    """The problem with each free view (no time to recompute, one input, its input's storage)
    folded into the value it views: (smaller problem, each value's index in it). Half the values
    of a decoder are such views. The folded model holds a base as long as its longest-held view,
    and recomputes them together from the earliest point either is needed: so what it finds meets
    the limit, but it misses plans that hold a view without its base (or the base longer)."""
    group = list(range(problem.n))
    for v in range(problem.n):
        ins = problem.inputs[v]
        if problem.seconds[v] == 0 and len(ins) == 1 and problem.storage[ins[0]] == problem.storage[v]:
            group[v] = group[ins[0]]
    roots = sorted(set(group))
    index = {b: i for i, b in enumerate(roots)}
    group_of = [index[group[v]] for v in range(problem.n)]
    members: dict[int, list[int]] = {}
    for v in range(problem.n):
        members.setdefault(group_of[v], []).append(v)

    def merged(field, pick):
        out = []
        for i in range(len(roots)):
            present = [getattr(problem, field)[v] for v in members[i] if getattr(problem, field)[v] is not None]
            out.append(pick(present) if present else None)
        return out

    inputs = [sorted({group_of[w] for v in members[i] for w in problem.inputs[v]} - {i}) for i in range(len(roots))]
    return RecomputeProblem(
        seconds=[problem.seconds[b] for b in roots], inputs=inputs, storage=[problem.storage[b] for b in roots],
        storage_bytes=problem.storage_bytes, first_use=merged("first_use", min), last_use=merged("last_use", max),
        hold_until=merged("hold_until", max), fixed=problem.fixed, at=problem.at, in_flight=problem.in_flight), group_of


def _solve(problem: RecomputeProblem, limit: float | None, limits: SolveLimits,
           horizon: int | None, relative_gap: float) -> RecomputeChoice:
    model = _Model(problem)
    model.require_kept_or_recomputed()
    earliest, needed = _start_window(problem, horizon, model.recomputable)
    model.add_starts(earliest, needed)
    if horizon is not None:
        model.keep_for_early_readers(earliest, needed)
    peak = model.add_memory_rows(limit)
    model.set_objective(limit, peak)
    status, values, _ = run_scip(model.solver, limits, relative_gap)
    if values is None:
        raise SolverError("no recomputation meets the memory limit" if status == "infeasible"
                          else f"the recomputation solver found no solution within its limits ({limits.work} work, "
                               f"{limits.seconds:g} s): raise solver_work_limit")
    r = model.recomputed
    chosen = tuple(v for v in range(problem.n) if r[v] is not None and values[r[v].index()] > 0.5)
    memory = max(memory_of(problem, set(chosen)), default=0.0)
    return RecomputeChoice(chosen, sum(problem.seconds[v] for v in chosen), memory,
                           "optimal" if status == "optimal" and not relative_gap else "feasible")


def _start_window(problem: RecomputeProblem, horizon: int | None, recomputable: list) -> tuple[list, list]:
    """Per value, the first and the last point its recomputed copy can be started at. None before
    the first point any recomputation that reads it (directly or down a chain) could run (with a
    ``horizon``: at most that many points before the use it serves); none after the last point it
    is read at, by a memory row (while its storage is used) or by an input's chain row (before
    the input's own first use, while that input's variable is read in turn). Without the last
    cut every value had a variable at every later point."""
    n, consumers = problem.n, problem.consumers()
    earliest = [INF] * n
    for v in range(n - 1, -1, -1):
        if recomputable[v]:
            earliest[v] = min([_first(problem, v)] + [earliest[c] for c in consumers[v]])
    if horizon is not None:
        anchor = [INF] * n  # the first use a recomputation of v serves
        for v in range(n - 1, -1, -1):
            anchor[v] = _first(problem, v) if problem.first_use[v] is not None else \
                min([INF] + [anchor[c] for c in consumers[v]])
        earliest = [max(e, a - horizon) for e, a in zip(earliest, anchor)]
    last = problem.storage_last_use()
    needed = [-1] * n
    for v in range(n):  # inputs come before the values computed from them
        needed[v] = max([last[problem.storage[v]]] + [min(_first(problem, w) - 1, needed[w])
                                                      for w in problem.inputs[v] if recomputable[w]])
    return earliest, needed


class _Model:
    """The 0-1 program: per value "kept" or "recomputed", and per point whether its recomputed
    copy has started (Checkmate's formulation, Jain et al. 2020), one method per constraint family."""

    def __init__(self, problem: RecomputeProblem):
        from ortools.linear_solver import pywraplp

        self.problem = problem
        self.solver = pywraplp.Solver.CreateSolver("SCIP")
        self.inf = self.solver.infinity()
        self.consumers = problem.consumers()
        self.recomputable = [not math.isinf(s) for s in problem.seconds]
        self.recomputed = [self.solver.BoolVar(f"r{v}") if self.recomputable[v] else None for v in range(problem.n)]
        self.kept = [self.solver.BoolVar(f"k{v}") for v in range(problem.n)]
        self.started: dict[int, dict[int, object]] = {}  # value -> point -> its copy exists by then

    def row(self, lower: float, upper: float, terms) -> None:
        """lower <= sum(coef * var) <= upper, set coefficient by coefficient: the natural API's
        expression objects cost more than SCIP's solve on deep models."""
        linear_constraint(self.solver, [(var, coef) for var, coef in terms if var is not None], lower, upper)

    def require_kept_or_recomputed(self) -> None:
        """A value backward reads is kept or recomputed; recomputing needs its inputs, kept or recomputed."""
        k, r, inf = self.kept, self.recomputed, self.inf
        for v in range(self.problem.n):
            if self.problem.first_use[v] is not None:
                self.row(1, inf, [(k[v], 1), (r[v], 1)])
            for w in self.problem.inputs[v]:
                if r[v] is not None:
                    self.row(0, inf, [(k[w], 1), (r[w], 1), (r[v], -1)])

    def add_starts(self, earliest: list, needed: list) -> None:
        """started[v][t], monotone in t within v's window: on by v's own use when v is recomputed,
        and before it only when a recomputation reading v has started."""
        points, r, inf = list(self.problem.points), self.recomputed, self.inf
        for v in range(self.problem.n):
            if self.recomputable[v] and earliest[v] <= needed[v]:
                self.started[v] = {t: self.solver.NumVar(0, 1, "") for t in points if earliest[v] <= t <= needed[v]}
        for v, by_point in self.started.items():
            first = _first(self.problem, v)
            for t, var in by_point.items():
                if t >= first:
                    self.row(0, inf, [(var, 1), (r[v], -1)])
                elif t > earliest[v]:
                    self.row(0, inf, [(var, 1), (by_point[t - 1], -1)])
                if t < first:
                    for c in self.consumers[v]:
                        if c in self.started and t in self.started[c]:
                            self.row(-1, inf, [(var, 1), (self.started[c][t], -1), (r[v], -1)])

    def keep_for_early_readers(self, earliest: list, needed: list) -> None:
        """Under a horizon, a reader started before v's window keeps v (the last such point
        suffices, started being monotone)."""
        for v in range(self.problem.n):
            for c in self.consumers[v] if self.recomputable[v] else ():
                t = min(earliest[v] - 1, _first(self.problem, v) - 1, needed[v])
                if c in self.started and t in self.started[c]:
                    self.row(-self.inf, 1, [(self.started[c][t], 1), (self.recomputed[v], 1)])

    def add_memory_rows(self, limit: float | None):
        """At every point, the fixed bytes plus each storage some holder keeps alive: under
        ``limit``, or under the ``peak`` variable returned (to minimise) when there is none."""
        problem, inf, started = self.problem, self.inf, self.started
        last = problem.storage_last_use()
        by_storage: dict[int, list[int]] = {}
        for v in range(problem.n):
            by_storage.setdefault(problem.storage[v], []).append(v)
        peak = self.solver.NumVar(0, inf, "peak")
        in_flight: list = []  # the other micro-batches' copies of what is held at the first point
        for t in problem.points:
            terms = []
            for s, values in by_storage.items():
                holders = [self.kept[v] for v in values
                           if problem.hold_until[v] is not None and problem.hold_until[v] >= t]
                holders += [started[v][t] for v in values if v in started and t in started[v] and t <= last[s]]
                if holders and problem.storage_bytes[s]:
                    terms.append((self._any_of(holders), problem.storage_bytes[s]))
            if t == 0 and problem.in_flight > 1:
                in_flight = [(held, (problem.in_flight - 1) * b) for held, b in terms]
            terms = _summed(terms + in_flight)
            if limit is not None:  # fixed + sum(bytes * held) <= limit
                self.row(-inf, limit - problem.fixed[t], terms)
            else:  # peak >= fixed + sum(bytes * held)
                self.row(problem.fixed[t], inf, [(peak, 1)] + [(h, -b) for h, b in terms])
        return peak

    def _any_of(self, holders: list):
        if len(holders) == 1:
            return holders[0]
        held = self.solver.NumVar(0, 1, "")
        for h in holders:
            self.row(0, self.inf, [(held, 1), (h, -1)])
        return held

    def set_objective(self, limit: float | None, peak) -> None:
        """The least peak without a limit; under one, the least added time (in nanoseconds)."""
        objective = self.solver.Objective()
        if limit is None:
            objective.SetCoefficient(peak, 1.0)
        else:
            for v, var in enumerate(self.recomputed):
                if var is not None and self.problem.seconds[v]:
                    objective.SetCoefficient(var, self.problem.seconds[v] * 1e9)
        objective.SetMinimization()


def _summed(terms: list) -> list:
    """(variable, coefficient) terms with each variable once: a row sets coefficients, not adds them."""
    coefficients: dict[int, list] = {}
    for var, coef in terms:
        entry = coefficients.setdefault(id(var), [var, 0.0])
        entry[1] += coef
    return [(var, coef) for var, coef in coefficients.values()]
