"""Run the passes over a captured program for a PlanRequest: on its one mesh, or on each
candidate mesh with the fastest plan winning, and package the result as a Plan."""
from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from autopar.capture.export import program_inputs
from autopar.capture.module_paths import module_paths
from autopar.capture.symbolic_shapes import SizeSymbols, size_symbols
from autopar.errors import AutoparError, user_stacklevel
from autopar.ir.graph import to_ir
from autopar.ir.mesh import Mesh
from autopar.ir.plan import Plan
from autopar.ir.records import PassRecord, SolverStats
from autopar.ir.request import DEFAULT_HARDWARE, PlanRequest
from autopar.passes.base import Pass, PassContext, PassManager
from autopar.passes.constraints import from_options
from autopar.passes.cost_formula import CostFormulaPass, SymbolicShapesPass
from autopar.passes.registry import pipeline
from autopar.planning.meshes import has_pipeline
from autopar.planning.pipelined import plan_pipeline
from autopar.planning.request import resolve
from autopar.planning.state import planning_state, remember
from autopar.units import human_seconds

# A 2-D mesh's full integer program (after the axis-by-axis descent) is run only on the meshes
# whose descent plan is within this share of the best: on a large mesh the full program can take
# minutes per mesh, and it has improved the descent's plan by less than this (README, "Solving at
# scale").
FINALIST_MARGIN = 0.05


def plan_captured(program, model: nn.Module, example_inputs, *, mesh, hardware=DEFAULT_HARDWARE,
                  restrict: Callable | None = None, passes: Sequence[Pass] = (),
                  progress: Callable[[str], None] | None = None, kwargs: dict | None = None, **options) -> Plan:
    """autopar.plan for a step already captured (autopar.capture.capture), so that several plans
    of one model (baselines, meshes) share the capture; ``options`` as autopar.plan takes them.
    The program is not modified."""
    request = resolve(mesh, hardware, **options)
    return run(program, request, model, example_inputs, kwargs=kwargs, restrict=restrict, passes=passes,
               progress=progress)


def run(program, request: PlanRequest, model: nn.Module, example_inputs, *, kwargs=None, loss_fn=None, restrict=None,
        passes=(), progress=None) -> Plan:
    """Plan ``program`` for ``request``: on its mesh, or by searching its candidate meshes.
    ``model``, ``example_inputs``, ``kwargs`` and ``loss_fn``: what was captured, to capture at
    other sizes (``request.symbolic_dims``, a pipeline's micro-batch)."""
    pipeline(passes)  # a misplaced pass fails here, before any work
    if progress is not None:
        progress("naming each node's module ...")
    planner = _MeshPlanner(program, model, example_inputs, kwargs or {}, loss_fn, module_paths(program),
                           tuple(passes), restrict, progress, _sizes(request, example_inputs))
    if len(request.meshes) == 1:
        plan = planner.plan(request)
        warn_if_unproven(plan.mesh, plan.solver, request)
        return plan
    return _search_meshes(planner, request)


def _sizes(request: PlanRequest, example_inputs) -> SizeSymbols | None:
    if request.symbolic_dims is None:
        return None
    return size_symbols(program_inputs(example_inputs), dict(request.symbolic_dims))


@dataclass(frozen=True)
class _MeshPlanner:
    """What stays the same on every mesh of one planning call."""

    program: object  # the captured Program; each mesh plans a copy with empty side tables
    model: nn.Module
    example_inputs: object
    example_kwargs: dict
    loss_fn: Callable | None
    modules: dict  # call node -> module path (the same on every mesh)
    passes: tuple  # the user's passes for this plan
    restrict: Callable | None
    progress: Callable[[str], None] | None
    sizes: SizeSymbols | None
    # micro-batch size -> the step captured at it: a pipeline's candidate meshes share them
    microbatch_captures: dict = field(default_factory=dict, compare=False)

    def plan(self, request: PlanRequest) -> Plan:
        """Run the passes for ``request``'s one mesh (with a pipeline where it has a pp axis)."""
        if has_pipeline(request.meshes[0]):
            if self.sizes is not None:
                raise AutoparError("symbolic_dims prices one program's layout; a pipeline plans each stage's "
                                   "micro-batch: plan without symbolic_dims on a mesh with 'pp'")
            return plan_pipeline(self, request)
        plan, _ = self.plan_with(request)
        return plan

    def plan_with(self, request: PlanRequest, extra: Sequence[Pass] = ()) -> tuple[Plan, dict]:
        """The plan for ``request``'s one mesh, with ``extra`` passes after the others, and the
        side tables they all wrote."""
        program = dataclasses.replace(self.program, tables={})
        passes = pipeline(self.passes)
        if self.sizes is not None:
            passes += [SymbolicShapesPass(self.model, program_inputs(self.example_inputs), self.sizes, self.loss_fn),
                       CostFormulaPass(self.sizes)]
        ctx = PassContext(request, progress=self.progress,
                          constraints=from_options(request.pins, self.restrict))
        history = PassManager(passes + list(extra)).run(program, ctx)
        plan = self._package(program, ctx.mesh, request, tuple(history))
        remember(plan, lambda: (program, ctx))
        return plan, program.tables

    def _package(self, program, mesh: Mesh, request: PlanRequest, history: tuple) -> Plan:
        result = program.table("solver")
        fallback = program.table("fallback")
        return Plan(
            mesh=mesh,
            hardware=request.hardware.name,
            graph=to_ir(program),
            strategies=dict(program.table("choice")),
            redistributions=tuple(program.table("redistributions")),
            predicted=program.table("predicted"),
            recompute=program.table("recompute").variables,
            prefetch=program.table("recompute").prefetch,
            offload=program.table("recompute").offload,
            fallback_nodes=dict(fallback),
            fallback_modules={n: p for n, p in self.modules.items() if n in fallback},
            modules=self.modules,
            solver=SolverStats(result.backend, result.status, result.objective, result.bound, result.gap,
                               result.seconds, result.n_variables, result.timed_out),
            history=history,
            formula=program.tables.get("cost_formula"),
            moe_imbalance=request.moe_imbalance,
        )


def warn_if_unproven(mesh: Mesh, solver, request: PlanRequest) -> None:
    """Warn when a limit stopped the solver (``solver``: its result or SolverStats). Not for
    status "least-memory": the budget, not a limit, chose that layout."""
    if solver.status != "feasible":
        return
    # a gap of 100% is a bound of 0 (the full program did not run, being too large for its
    # limit, or found no bound in it): "within 100% of optimal" would misread it
    distance = "has no proven bound" if solver.gap >= 1.0 else f"is within {solver.gap:.1%} of optimal"
    if solver.timed_out:
        limit = (f"its safety time limit of {request.solver_time_limit_s:g} s per solve stopped it before its work "
                 f"limit: the plan depends on this machine's speed and load (lower solver_work_limit for a plan "
                 f"any machine repeats, or raise solver_time_limit_s)")
    else:
        limit = f"in its work limit of {request.solver_work_limit} per solve (raise solver_work_limit to close the gap)"
    warnings.warn(f"the sharding solver did not prove its plan optimal on mesh {mesh}; the plan {distance}: {limit}",
                  stacklevel=user_stacklevel())


def _search_meshes(planner: _MeshPlanner, request: PlanRequest) -> Plan:
    """Plan every candidate mesh (with the "mip" or "cp-sat" backends, 2-D ones by the axis-by-axis
    descent only, then the 2-D finalists again with the full integer program; "lp-first" solves
    each exactly at once); the least predicted step time wins. The
    winner's history starts with a ``mesh_search`` record listing each mesh's step time (or why
    it failed)."""
    report = planner.progress or (lambda msg: None)
    start = time.perf_counter()
    planned, tried = _sweep(planner, request, report)
    fastest = min(p.predicted.step_time_s for p in planned.values())
    for mesh, candidate in planned.items():
        # a pipeline's stage layout stays the descent's: its full program would run once per micro-batch count
        finalist = candidate.predicted.step_time_s <= fastest * (1 + FINALIST_MARGIN)
        if request.solver != "lp-first" and mesh.ndim > 1 and not has_pipeline(mesh) and finalist:
            report(f"mesh search: the full integer program on {mesh} ...")
            planned[mesh] = planner.plan(request.on(mesh, full_program=True))
            tried[mesh] = human_seconds(planned[mesh].predicted.step_time_s)
    best = min(planned.values(), key=lambda p: p.predicted.step_time_s)
    warn_if_unproven(best.mesh, best.solver, request)  # the winner's only
    record = PassRecord("mesh_search", time.perf_counter() - start, f"best {best.device_mesh} of {_listing(tried)}")
    searched = dataclasses.replace(best, history=(record,) + best.history)
    remember(searched, lambda: planning_state(best))
    return searched


def _sweep(planner: _MeshPlanner, request: PlanRequest, report) -> tuple[dict, dict]:
    """Every candidate mesh planned without the finalists' full program: (mesh -> plan, mesh ->
    outcome text)."""
    planned, tried = {}, {}
    for mesh in request.meshes:
        report(f"mesh search: planning {mesh} ...")
        try:
            planned[mesh] = planner.plan(request.on(mesh, full_program=False))
        except AutoparError as exc:  # e.g. no layout on this mesh fits the memory budget
            tried[mesh] = str(exc).split(':')[0]
            continue
        tried[mesh] = human_seconds(planned[mesh].predicted.step_time_s)
        report(f"mesh search: {mesh}: {tried[mesh]}")
    if not planned:
        raise AutoparError(f"no mesh of {request.meshes[0].size} devices gives a plan: {_listing(tried)}")
    return planned, tried


def _listing(tried: dict) -> str:
    return "; ".join(f"{mesh}: {outcome}" for mesh, outcome in tried.items())
