"""recompute: which forward values backward reads are kept and which are computed again.

``recompute="auto"`` (the default) recomputes only when the plan's peak is over
the memory budget, and then the set that adds the least time while the peak
fits; ``"full"`` recomputes for the least memory the program can reach (and the
least time among such sets); ``"none"`` never recomputes.

The exact peak comes from simulating the program (autopar.lowering.memory); the
solver (autopar.solvers.recompute) works on a linear model of the memory at a
few points of backward, built from the program without recomputation. While the
simulated peak is over the budget, the statement where it peaks becomes a point
of the model and the solve repeats; where the peak already was a point, the model
misses what recomputing allocates, and its limit drops by the excess instead. If
no set found fits, the least-memory set is the last answer.

A value can be recomputed when the op that made it can run again with the same
result: not a random op, not a constant. Forward collectives recompute too
(a parameter all-gathered for forward and gathered again for backward, as
FSDP does).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.errors import AutoparError, SolverError
from autopar.ir.graph import to_ir
from autopar.ir.offload import Offload
from autopar.ir.program import STEP, Program
from autopar.lowering.memory import MemoryEstimate, simulate, with_in_flight
from autopar.lowering.schedule import (
    RETURNS,
    Statement,
    backward_start,
    prefetch_parameter_gathers,
    recomputed_name,
    schedule,
    with_frees,
)
from autopar.passes.base import Pass, PassContext, side_table
from autopar.solvers.limits import SolveLimits
from autopar.solvers.recompute import RecomputeProblem, least_memory, limit_at, solve
from autopar.units import human_bytes, human_seconds

MODES = ("auto", "full", "none")
_ATTEMPTS = 6
_MAX_POINTS = 24  # backward points the model checks; the simulation checks every statement
# the recompute solver's shortcuts (autopar.solvers.recompute.solve). A recomputation runs at
# most this many model points before the value's first use: chains reach back a few layers, not
# to the first layer. Within 1% of the least added time: the rest of the step dwarfs the
# difference. Together with folded views they shrink a deep model's program several times over
# (README, "Memory").
_HORIZON = 3
_GAP = 0.01
_RANDOM = ("dropout", "rand", "bernoulli", "normal", "uniform", "multinomial")


@dataclass(frozen=True)
class Recompute:
    variables: tuple[str, ...]  # forward variables recomputed in backward
    seconds: float  # the time recomputation adds to a step
    memory: MemoryEstimate  # the program's memory with this recomputation
    # parameter gathers start together per layer, a layer ahead (autopar.lowering.schedule.
    # prefetch_parameter_gathers): taken where the program fits the budget so without recomputing
    # anything; ``ahead`` names the redistributions started a layer ahead, which run under compute
    prefetch: bool = False
    ahead: tuple[str, ...] = ()
    # parameters and optimizer state kept in host memory (autopar.passes.offload), with the time
    # it adds (``offload.added_s``, beside ``seconds``)
    offload: Offload | None = None


@dataclass(frozen=True)
class Fit:
    plain: MemoryEstimate  # without recomputation
    recompute: Recompute | None  # the cheapest recomputation under the budget; None if none fits
    lowest: MemoryEstimate | None = None  # the smallest peak seen, when it is not ``plain``'s

    @property
    def least(self) -> MemoryEstimate:
        return self.lowest if self.lowest is not None and self.lowest.peak_bytes < self.plain.peak_bytes else self.plain


side_table('recompute', Recompute, 'the forward values computed again in backward, and what they cost')
side_table('memory', MemoryEstimate, "the program's simulated memory: peak, breakdown, timeline")


class RecomputePass(Pass):
    name = "recompute"
    requires = ("meta", "choice", "redistributions")
    provides = ("recompute", "memory")
    optional = ("fit",)  # the layout's fit as the sharding solve decided it

    def run(self, program: Program, ctx: PassContext) -> str:
        # the sharding pass's budget loop has decided it for the layout it chose; a pipeline that
        # sets the layout another way gets it decided here
        result = program.table_if_present("fit") or fit(to_ir(program), program.table("choice"),
                                                  program.table("redistributions"), ctx, memory_budget(ctx))
        chosen = result.recompute or Recompute((), 0.0, result.plain)  # over budget: only with recompute="none"
        program.tables["recompute"] = chosen
        program.tables["memory"] = chosen.memory
        peak = f"peak {human_bytes(chosen.memory.peak_bytes)} per device at {chosen.memory.peak_at}"
        if chosen.prefetch:
            return f"parameter gathers prefetched a layer ahead, {peak}"
        if not chosen.variables:
            return peak
        return (f"{len(chosen.variables)} values recomputed (+{human_seconds(chosen.seconds)}), {peak} "
                f"(without: {human_bytes(result.plain.peak_bytes)})")


def memory_budget(ctx: PassContext) -> float:
    budget = ctx.request.memory_budget_bytes
    cap = ctx.constraints.memory_cap  # a pass's cap_memory
    return budget if cap is None else min(budget, cap)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise AutoparError(f"unknown recompute mode {mode!r}; use one of {', '.join(MODES)}")
    return mode


def fit(graph, strategies: dict, redistributions, ctx: PassContext, budget: float, mode: str | None = None) -> Fit:
    """The memory of this solution, and the recomputation it takes to fit ``budget``."""
    mode = check_mode(mode or ctx.request.recompute) if graph.kind == STEP else "none"  # no backward to recompute in
    fitter = _Fitter(graph, strategies, redistributions, ctx, budget)
    plain = fitter.plain
    # prefetching only allocates earlier, so its peak is never below plain's: tried where plain fits
    prefetched = fitter.prefetched() if mode != "full" and plain.peak_bytes <= budget else None
    if prefetched is not None and prefetched.memory.peak_bytes <= budget:
        return Fit(prefetched.memory, prefetched)
    if mode == "none" or (mode == "auto" and plain.peak_bytes <= budget):
        return Fit(plain, Recompute((), 0.0, plain) if plain.peak_bytes <= budget else None)
    if not fitter.build():
        return Fit(plain, None)
    return fitter.least() if mode == "full" else fitter.within_budget()


class _Fitter:
    """One layout's recomputation: the program without it, and the solves that choose it."""

    def __init__(self, graph, strategies: dict, redistributions, ctx: PassContext, budget: float):
        self.graph, self.strategies, self.redistributions = graph, strategies, redistributions
        self.ctx, self.budget = ctx, budget
        self.limits = SolveLimits.of(ctx.request)
        # recomputation is solved on the program whose parameter gathers run where they are read:
        # prefetching them holds two layers' parameters at once, the memory recomputing is for
        # the simulated program without recomputation; ``plain`` adds the micro-batches in flight
        self.plain_statements, self.plain_alone = self.program_of()
        self.plain = self.held(self.plain_alone)
        self.extra_points: list[int] = []
        self.problem, self.names = None, []

    def build(self) -> bool:
        """The solver's problem for this layout (built only once recomputation is needed); False
        where no forward value could be recomputed."""
        self.problem, self.names = build_problem(self.plain_statements, self.plain_alone.during, self.strategies,
                                                 self.extra_points, self.ctx.request.activations_in_flight,
                                                 self.ctx.constraints.kept)
        return bool(self.names)

    def prefetched(self) -> Recompute | None:
        """The plain program with its parameter gathers started a layer ahead; None where it
        gathers no parameter."""
        prefetching = prefetch_parameter_gathers(self.plain_statements, self.graph)
        if len(prefetching) == len(self.plain_statements):  # each parameter gather gains a start
            return None
        memory = self.held(simulate(with_frees(prefetching), self.graph, self.strategies, self.ctx.mesh,
                                    self.ctx.request.optimizer))
        return Recompute((), 0.0, memory, prefetch=True, ahead=tuple(s.redistribution.id for s in prefetching
                                                                      if s.prefetch))

    def held(self, memory: MemoryEstimate) -> MemoryEstimate:
        """``memory`` with the saved activations of the other micro-batches in flight."""
        return with_in_flight(memory, self.ctx.request.activations_in_flight)

    def program_of(self, variables=()) -> tuple[list[Statement], MemoryEstimate]:
        """The program recomputing ``variables``, and its memory for one micro-batch alone."""
        ctx = self.ctx
        statements = schedule(self.graph, self.strategies, self.redistributions, ctx.mesh, variables,
                              ctx.cost.hardware.collectives_library)
        return statements, simulate(statements, self.graph, self.strategies, ctx.mesh, ctx.request.optimizer)

    def decided(self, choice) -> tuple[list[Statement], Recompute]:
        names = self.names
        statements, memory = self.program_of(tuple(names[v] for v in choice.recomputed))
        # a free value (a view) may be marked recomputed without backward needing it: leave it out
        copies = {s.defines for s in statements if s.recomputed}
        variables = tuple(names[v] for v in choice.recomputed if recomputed_name(names[v]) in copies)
        return statements, Recompute(variables, choice.seconds, self.held(memory))

    def least(self) -> Fit:
        """The least memory recomputation reaches, at the least time if that fits the budget (the
        second solve is skipped when it does not: a layout over the budget only needs its figure).
        The second solve holds the model's memory, not the simulated program's: where its set
        peaks over the budget, the least-memory set, which fits, stays."""
        shortcuts = dict(horizon=_HORIZON, relative_gap=_GAP, fold_views=True, limits=self.limits)
        try:
            lowest = least_memory(self.problem, **shortcuts)
            found = self.decided(lowest)[1]
            if found.memory.peak_bytes <= self.budget:
                faster = self.decided(solve(self.problem, limit_at(lowest), **shortcuts))[1]
                found = faster if faster.memory.peak_bytes <= self.budget else found
        except SolverError:  # too large to solve in time: this layout gets no recomputation
            self.ctx.report("the recomputation solver found no solution in time; keeping every value")
            return Fit(self.plain, None)
        return Fit(self.plain, found if found.memory.peak_bytes <= self.budget else None, found.memory)

    def within_budget(self) -> Fit:
        """The least added time that fits the budget, solved against the model's points; where the
        simulated program still peaks over, the point is added or the limit lowered."""
        budget, limit, margin = self.budget, self.budget, 1.25
        for attempt in range(_ATTEMPTS):
            try:
                choice = solve(self.problem, limit, horizon=_HORIZON, relative_gap=_GAP, fold_views=True,
                               limits=self.limits)
            except SolverError:
                if attempt == 0:
                    # no set meets the budget in the model, which is close to the simulation at its
                    # points: the least memory it reaches would only be a figure, and costs a solve
                    # as long as a whole descent on a deep model
                    return Fit(self.plain, None)
                break
            statements, found = self.decided(choice)
            if found.memory.peak_bytes <= budget:
                return Fit(self.plain, found)
            # the model checks memory at a few statements: add the one where the program peaks; if
            # it was already there, the model misses what recomputing allocates there (temporaries
            # of recomputed ops): ask for the excess less, and twice as much more each time in a
            # row that was not enough
            peak_at = _plain_index(statements, found.memory.during)
            if peak_at in self.problem.at or peak_at < backward_start(self.plain_statements):
                limit -= margin * (found.memory.peak_bytes - budget)
                margin *= 2
            else:
                self.extra_points.append(peak_at)
                self.build()
            self.ctx.report(f"with recomputation the peak is {human_bytes(found.memory.peak_bytes)}, over the "
                            f"budget {human_bytes(budget)}; recomputing more")
        return self.least()  # the budget is about as low as recomputation reaches: the least memory it can


def build_problem(statements: list[Statement], during, strategies: dict,
                  extra_points=(), in_flight: int = 1, kept=frozenset()) -> tuple[RecomputeProblem, list[str]]:
    """The solver's view of a program without recomputation (``during``: its memory for one
    micro-batch alone; ``kept``: values that may not be recomputed): (problem, variable of each value)."""
    boundary = backward_start(statements)
    returned = {u for s in statements if s.kind in RETURNS for u in s.uses}  # the caller holds these anyway
    defining: dict[str, list[Statement]] = {}
    for s in statements[:boundary]:
        if s.kind in ("call", "getitem", "move", "constant") and s.defines not in returned:
            defining.setdefault(s.defines, []).append(s)
    names = list(defining)
    index = {name: v for v, name in enumerate(names)}
    first, last = _backward_reads(statements, boundary, index)
    inputs = [sorted({index[u] for u in defining[name][0].uses if u in index and u != name}) for name in names]
    held_until = _held_until(inputs, first, last)

    points = sorted(set(_points(boundary, sorted(set(first.values())), during)) | set(extra_points))
    storage, storage_bytes = _storages(names, defining)
    storage_last = {}
    for v in range(len(names)):
        if v in last:
            storage_last[storage[v]] = max(storage_last.get(storage[v], -1), last[v])
    fixed = [during[p] - sum(b for sid, b in enumerate(storage_bytes) if storage_last.get(sid, -1) >= p)
             for p in points]

    def first_point(i):  # the first point at or after statement i
        return next((k for k, p in enumerate(points) if p >= i), None)

    def last_point(i):  # the last point at or before statement i
        return next((k for k in range(len(points) - 1, -1, -1) if points[k] <= i), None)

    problem = RecomputeProblem(
        seconds=[math.inf if name in kept else _recompute_seconds(defining[name], strategies) for name in names],
        inputs=inputs, storage=storage, storage_bytes=storage_bytes,
        first_use=[first_point(first[v]) if v in first else None for v in range(len(names))],
        last_use=[last_point(last[v]) if v in last else None for v in range(len(names))],
        hold_until=[last_point(held_until[v]) if held_until[v] >= 0 else None for v in range(len(names))],
        fixed=fixed, at=tuple(points), in_flight=in_flight)
    return problem, names


def _backward_reads(statements: list[Statement], boundary: int, index: dict) -> tuple[dict, dict]:
    """(value -> the first backward statement that reads it, value -> the last)."""
    reads: dict[int, list[int]] = {v: [] for v in index.values()}
    for i, s in enumerate(statements[boundary:], boundary):
        for u in s.uses:
            if u in index:
                reads[index[u]].append(i)
    return {v: min(r) for v, r in reads.items() if r}, {v: max(r) for v, r in reads.items() if r}


def _held_until(inputs: list[list[int]], first: dict, last: dict) -> dict:
    """value -> the last statement that needs it kept: its last backward read, or the latest a
    recomputation of a value computed from it can run. A recomputation of v runs at its first
    backward read at the latest, or, for a value backward does not read, at the latest such of
    the values computed from it (a kept input is held until then: a view or cast in between
    must not end its hold at forward's end)."""
    consumers: dict[int, list[int]] = {v: [] for v in range(len(inputs))}
    for v, ins in enumerate(inputs):
        for w in ins:
            consumers[w].append(v)
    latest_recompute = [-1] * len(inputs)
    for v in reversed(range(len(inputs))):  # consumers are defined after what they read
        latest_recompute[v] = first[v] if v in first else max([-1] + [latest_recompute[c] for c in consumers[v]])
    return {v: max([last.get(v, -1)] + [latest_recompute[c] for c in consumers[v]]) for v in range(len(inputs))}


def _storages(names: list[str], defining: dict) -> tuple[list[int], list[float]]:
    """(the storage each value lives in: a view shares its base's, its bytes per storage)."""
    storage, storage_bytes = [], []
    base_of: dict[str, int] = {}
    for name in names:
        s = defining[name][-1]
        if s.alias_of is not None and s.alias_of in base_of:
            base_of[name] = base_of[s.alias_of]
        else:
            base_of[name] = len(storage_bytes)
            storage_bytes.append(0.0 if s.alias_of is not None else s.nbytes)  # a view of a never-freed input
        storage.append(base_of[name])
    return storage, storage_bytes


def _plain_index(statements: list[Statement], during) -> int:
    """Where the peak of a program with recomputation falls in the program without: the statement
    it peaks at, or, at a recomputation, the statement the recomputation runs for."""
    peak = max(range(len(during)), key=lambda i: during[i])
    plain_before = sum(1 for s in statements[:peak] if not s.recomputed)
    return plain_before


def _points(boundary: int, recompute_sites: list[int], during) -> list[int]:
    """Statements of backward where the model checks memory: where backward starts, where it peaks
    without recomputation, and where recomputations would run (evenly thinned to a few dozen, the
    last kept: a value first read after the last point would have no first use in the model, which
    would then neither keep nor recompute it, and count its memory as freed for nothing)."""
    peak = max(range(boundary, len(during)), key=lambda i: during[i])
    sites = [i for i in recompute_sites if i not in (boundary, peak)]
    if len(sites) > _MAX_POINTS - 2:
        step = (len(sites) - 1) / (_MAX_POINTS - 3)
        sites = [sites[round(k * step)] for k in range(_MAX_POINTS - 2)]
    return sorted({boundary, peak, *sites})


def _recompute_seconds(statements: list[Statement], strategies: dict) -> float:
    s = statements[0]
    if s.kind == "constant" or (s.kind == "call" and any(word in s.node.target for word in _RANDOM)):
        return math.inf
    if s.kind == "move":
        return sum(st.redistribution.step_seconds[st.step] for st in statements)
    if s.kind == "getitem":
        return 0.0
    return strategies[s.node.name].compute_s
