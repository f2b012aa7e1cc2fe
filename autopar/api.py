"""autopar.plan: capture, run the passes (on each candidate mesh), and package the result as a Plan."""
from __future__ import annotations

import dataclasses
import functools
import sys
import time
import warnings
from typing import Callable, Optional, Sequence

from torch import nn

from autopar.capture import capture, program_inputs
from autopar.cost_models.hardware import Hardware, get_hardware
from autopar.cost_models.model import CostModel
from autopar.graph_ir import to_ir
from autopar.errors import AutoparError
from autopar.explain_state import state_from_program
from autopar.mesh import Mesh
from autopar.mesh_search import candidate_meshes
from autopar.module_paths import module_paths
from autopar import plan_cache
from autopar.constraints import from_options
from autopar.pass_registry import pipeline
from autopar.passes.base import Pass, PassContext, PassManager, PassRecord
from autopar.passes.cost_formula import CostFormulaPass, SymbolicShapesPass
from autopar.passes.memory import optimizer_bytes_per_element
from autopar.passes.recompute import check_mode
from autopar.plan import Plan, SolverStats
from autopar.symbolic_shapes import size_symbols
from autopar.units import human_seconds, parse_bytes


def plan(model: nn.Module, example_inputs, *, mesh, hardware: "str | Hardware" = "h100-sxm",
         solver: str = "mip", solver_time_limit_s: float = 60.0, pin: Optional[dict] = None,
         memory_budget: "str | float | None" = None, optimizer: str = "adam", recompute: str = "auto",
         symbolic_dims: Optional[dict[str, int]] = None, cluster_layers: bool = True,
         restrict: Optional[Callable] = None, passes: Sequence[Pass] = (), cache: bool = True,
         cache_dir: Optional[str] = None, progress: Optional[Callable[[str], None]] = None,
         verbose: bool = False) -> Plan:
    """Plan ``model`` (its ``forward(*example_inputs)`` returns the loss) over ``mesh``.

    Runs in one process on fake tensors: no process group and no real memory, so
    models built on the meta device plan too. ``mesh`` is a mesh ({"dp": 8, "tp": 8} or
    "dp=8,tp=8"), or a device count (64) or "auto" (the process group's size): then every
    1-D and 2-D mesh that respects node boundaries is planned and the fastest plan wins.
    ``solver`` is "mip" (SCIP) or "cp-sat"; ``solver_time_limit_s`` bounds each integer
    program, which then returns the best plan found with its proven gap (``plan.solver``).
    ``pin`` fixes parameter layouts, e.g. ``{"fc1.weight": "S(0),R"}`` (one placement per
    mesh axis); the solver lays out everything else around them. ``restrict(node, strategy)``
    returning False rules a strategy out (autopar.baselines uses it). ``passes`` are extra
    passes for this plan (see autopar.register_pass for every plan): each goes before
    cluster_layers unless its ``before``/``after`` names another pass, and may add solver
    constraints through ``ctx.constraints`` (autopar.constraints).
    ``symbolic_dims`` names input sizes, e.g. ``{"batch": 0, "seq": 1}`` (the dim index in
    every tensor input that has it); the plan then carries its cost as a formula of them
    (``plan.cost_formula()``, ``plan.evaluate(batch=..., seq=...)``), at the price of
    capturing the step again at other sizes.
    ``memory_budget`` (bytes, or text such as "60GiB"; default 90% of the device's memory)
    bounds the predicted per-device peak, which counts ``optimizer`` state ("sgd", "adam",
    "adam-mixed"); a budget no plan meets is an AutoparError naming the smallest peak found.
    ``cluster_layers``: identical repeated layers share the solver's variables (their interior
    layers take one template layer's layouts), which keeps deep models fast to solve.
    ``recompute``: "auto" recomputes forward values in backward only when the budget needs it,
    choosing what adds the least time; "full" recomputes for the least memory; "none" never.
    ``cache``: a plan of the same graph, meshes, hardware spec, options and autopar code is
    loaded from ``cache_dir`` (default $AUTOPAR_CACHE_DIR or ~/.cache/autopar/plans) instead
    of solved; plans with ``restrict`` or custom passes are not cached (autopar.plan_cache).
    """
    if progress is None and verbose:
        progress = lambda msg: print(f"[autopar] {msg}", file=sys.stderr)  # noqa: E731
    optimizer_bytes_per_element(optimizer, 4)  # an unknown optimizer fails here, before any work
    candidate_meshes(mesh, get_hardware(hardware))  # so does a bad mesh or hardware
    pipeline(passes)  # and a pass placed next to one that does not exist
    if progress is not None:
        progress("capturing the training step ...")
    program = capture(model, example_inputs)
    if progress is not None and program.expanded_from:
        progress(f"captured: {program.expanded_from}")
    key = None
    if cache and plan_cache.cacheable(restrict, passes):
        options = _options(solver, solver_time_limit_s, pin, memory_budget, optimizer, recompute, cluster_layers)
        key = plan_cache.plan_key(program, mesh, get_hardware(hardware), {**options, "symbolic_dims": symbolic_dims})
        cached = plan_cache.load(key, cache_dir)
        if cached is not None:
            return _from_cache(cached, program, get_hardware(hardware), options, progress)
    result = plan_captured(program, model, example_inputs, mesh=mesh, hardware=hardware, solver=solver,
                           solver_time_limit_s=solver_time_limit_s, pin=pin, memory_budget=memory_budget,
                           optimizer=optimizer, recompute=recompute, symbolic_dims=symbolic_dims,
                           cluster_layers=cluster_layers, restrict=restrict, passes=passes, progress=progress)
    if key is not None:
        plan_cache.store(key, result, cache_dir)
    return result


def plan_captured(program, model: nn.Module, example_inputs, *, mesh, hardware="h100-sxm", solver="mip",
                  solver_time_limit_s=60.0, pin=None, memory_budget=None, optimizer="adam", recompute="auto",
                  symbolic_dims=None, cluster_layers=True, restrict=None, passes=(), progress=None) -> Plan:
    """``plan`` for a step already captured (autopar.capture.capture), so that several plans of
    one model (baselines, meshes) share the capture. The program is not modified."""
    hw = get_hardware(hardware)
    meshes = candidate_meshes(mesh, hw)
    options = {**_options(solver, solver_time_limit_s, pin, memory_budget, optimizer, recompute, cluster_layers),
               "restrict": restrict, "passes": tuple(passes)}
    pipeline(options["passes"])  # a misplaced pass fails here, before any work
    sizes = size_symbols(program_inputs(example_inputs), symbolic_dims) if symbolic_dims is not None else None
    if progress is not None:
        progress("naming each node's module ...")
    modules = module_paths(program)  # the same on every mesh
    if len(meshes) == 1:
        return _plan_on(program, meshes[0], hw, options, sizes, model, example_inputs, modules, progress)
    return _search_meshes(program, meshes, hw, options, sizes, model, example_inputs, modules, progress)


def _options(solver, solver_time_limit_s, pin, memory_budget, optimizer, recompute, cluster_layers) -> dict:
    """The planning options that are data (what the plan cache keys on); the passes read them."""
    return {"solver": solver, "solver_time_limit_s": solver_time_limit_s, "pin": dict(pin or {}),
            "memory_budget": parse_bytes(memory_budget), "optimizer": optimizer,
            "recompute": check_mode(recompute), "cluster_layers": cluster_layers}


def _from_cache(cached: Plan, program, hw: Hardware, options: dict, progress) -> Plan:
    """A cache hit, told like a plan just made; explain rebuilds the strategies from ``program``."""
    if progress is not None:
        progress(cached.history[-1].note)
    # as when it was solved: the user should still know
    _warn_if_unproven(cached.mesh, cached.solver, options["solver_time_limit_s"], stacklevel=3)
    return dataclasses.replace(cached, planning_state=functools.cache(
        lambda: state_from_program(cached, program, hw, options["pin"])))


def _plan_on(program, mesh: Mesh, hw: Hardware, options: dict, sizes, model, example_inputs, modules,
             progress, warn: bool = True) -> Plan:
    """Run the passes on ``program`` (its side tables start empty) for one mesh."""
    program = dataclasses.replace(program, tables={})
    passes = pipeline(options["passes"])
    if sizes is not None:
        passes += [SymbolicShapesPass(model, program_inputs(example_inputs), sizes), CostFormulaPass(sizes)]
    ctx = PassContext(mesh=mesh, cost=CostModel(mesh, hw), options=options, progress=progress,
                      constraints=from_options(options["pin"], options["restrict"]))
    history = PassManager(passes).run(program, ctx)
    result = program.table("solver")
    if warn:
        _warn_if_unproven(mesh, result, options["solver_time_limit_s"], stacklevel=3)
    fallback = program.table("fallback")
    return Plan(
        mesh=mesh,
        hardware=hw.name,
        graph=to_ir(program),
        strategies=dict(program.table("choice")),
        redistributions=tuple(program.table("redistributions")),
        predicted=program.table("predicted"),
        recompute=program.table("recompute").variables,
        fallback_nodes=dict(fallback),
        fallback_modules={n: p for n, p in modules.items() if n in fallback},
        modules=modules,
        solver=SolverStats(result.backend, result.status, result.objective, result.bound, result.gap,
                           result.seconds, result.n_variables),
        history=tuple(history),
        formula=program.tables.get("cost_formula"),
        planning_state=lambda: (program, ctx),
    )


def _warn_if_unproven(mesh: Mesh, solver, time_limit_s: float, stacklevel: int) -> None:
    """Warn when the time limit stopped the solver (``solver``: its result or SolverStats). Not for
    status "least-memory": the budget, not the time limit, chose that layout."""
    if solver.status != "feasible":
        return
    gap = solver.gap
    # a gap of 100% is a bound of 0 (the full program did not run, being too large for its
    # limit, or found no bound in it): "within 100% of optimal" would misread it
    distance = "has no proven bound" if gap >= 1.0 else f"is within {gap:.1%} of optimal"
    warnings.warn(f"the sharding solver did not prove its plan optimal on mesh {mesh} in its {time_limit_s:g} s "
                  f"limit per integer program; the plan {distance} (raise solver_time_limit_s to close the gap)",
                  stacklevel=stacklevel + 1)


# A 2-D mesh's full integer program (after the axis-by-axis descent) is run only on the meshes
# whose descent plan is within this share of the best: on Llama-shaped models on 64 GPUs it has
# about 210k booleans and takes 40-95 s on a 2-core machine, and it improved the descent's plan
# by at most 3.7% (Llama-70B, batch 128, (dp=32, tp=2)); running it on all five 2-D meshes cost
# minutes for meshes that lose anyway.
_FINALIST_MARGIN = 0.05


def _search_meshes(program, meshes, hw, options, sizes, model, example_inputs, modules, progress) -> Plan:
    """Plan every candidate mesh (2-D ones by the axis-by-axis descent only), then the 2-D
    finalists again with the full integer program; the least predicted step time wins. The
    winner's history starts with a ``mesh_search`` record listing each mesh's step time (or why
    it failed)."""
    report = progress or (lambda msg: None)
    start = time.perf_counter()
    sweep = {**options, "full_program": False}
    planned, tried = {}, {}
    for mesh in meshes:
        report(f"mesh search: planning {mesh} ...")
        try:
            planned[mesh] = _plan_on(program, mesh, hw, sweep, sizes, model, example_inputs, modules, progress,
                                     warn=False)
        except AutoparError as exc:  # e.g. no layout on this mesh fits the memory budget
            tried[mesh] = str(exc).split(':')[0]
            continue
        tried[mesh] = human_seconds(planned[mesh].predicted.step_time_s)
        report(f"mesh search: {mesh}: {tried[mesh]}")
    if not planned:
        raise AutoparError(f"no mesh of {meshes[0].size} devices gives a plan: {_listing(tried)}")
    fastest = min(p.predicted.step_time_s for p in planned.values())
    for mesh, candidate in planned.items():
        if mesh.ndim > 1 and candidate.predicted.step_time_s <= fastest * (1 + _FINALIST_MARGIN):
            report(f"mesh search: the full integer program on {mesh} ...")
            planned[mesh] = _plan_on(program, mesh, hw, options, sizes, model, example_inputs, modules, progress,
                                     warn=False)
            tried[mesh] = human_seconds(planned[mesh].predicted.step_time_s)
    best = min(planned.values(), key=lambda p: p.predicted.step_time_s)
    _warn_if_unproven(best.mesh, best.solver, options["solver_time_limit_s"], stacklevel=4)  # the winner's only
    record = PassRecord("mesh_search", time.perf_counter() - start, f"best {best.mesh} of {_listing(tried)}")
    return dataclasses.replace(best, history=(record,) + best.history)


def _listing(tried: dict) -> str:
    return "; ".join(f"{mesh}: {outcome}" for mesh, outcome in tried.items())
