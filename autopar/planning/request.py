"""The API edge: what a user passes (a mesh spec, a hardware name, "60GiB") resolved once into
a PlanRequest, so that a bad option fails before any work and no pass re-reads raw options."""
from __future__ import annotations

from typing import Optional

from autopar.cost_models.hardware import get_hardware
from autopar.cost_models.pipeline_schedules import check_schedule
from autopar.errors import AutoparError
from autopar.ir.hardware import Hardware
from autopar.ir.precision import parse_precision
from autopar.ir.request import (
    DEFAULT_BUDGET_SHARE,
    DEFAULT_HARDWARE,
    DEFAULT_OFFLOAD,
    DEFAULT_OPTIMIZER,
    DEFAULT_RECOMPUTE,
    DEFAULT_SOLVER,
    DEFAULT_TIME_LIMIT_S,
    OFFLOAD_MODES,
    PARTITIONS,
    SOLVERS,
    PlanRequest,
)
from autopar.lowering.memory import optimizer_bytes_per_element
from autopar.passes.recompute import check_mode
from autopar.planning.meshes import candidate_meshes, has_pipeline, split_mesh
from autopar.units import parse_bytes


def resolve(mesh, hardware: "str | Hardware" = DEFAULT_HARDWARE, *, solver: str = DEFAULT_SOLVER,
            solver_time_limit_s: float = DEFAULT_TIME_LIMIT_S, pin: Optional[dict] = None,
            memory_budget: "str | float | None" = None, optimizer: str = DEFAULT_OPTIMIZER,
            recompute: str = DEFAULT_RECOMPUTE, symbolic_dims: Optional[dict[str, int]] = None,
            cluster_layers: bool = True, precision=None, schedule: Optional[str] = None,
            microbatches: Optional[int] = None, partition: str = "balanced", pipelines: bool = True,
            inv_every: Optional[int] = None, offload: "str | bool" = DEFAULT_OFFLOAD) -> PlanRequest:
    """The request autopar.plan's options stand for (see its docstring for each); ``pipelines``:
    whether a device count's candidates include meshes with a pp axis."""
    hw = get_hardware(hardware)
    meshes = tuple(candidate_meshes(mesh, hw, pipelines=pipelines))
    _check_pipeline_options(meshes, schedule, microbatches, partition)
    if solver not in SOLVERS:
        raise AutoparError(f"unknown solver {solver!r}; use one of {', '.join(map(repr, SOLVERS))}")
    optimizer_bytes_per_element(optimizer, 4)  # an unknown optimizer fails here
    _check_kfac_options(meshes, optimizer, inv_every)
    _check_offload(meshes, offload)
    budget = parse_bytes(memory_budget)
    mixed = parse_precision(precision)
    if mixed is not None and optimizer == "adam-mixed":
        raise AutoparError(f"optimizer='adam-mixed' counts a float32 master copy beside low-precision parameters; "
                           f"under precision={str(mixed)!r} the parameters are the float32 masters: use "
                           f"optimizer='adam'")
    return PlanRequest(
        meshes=meshes,
        hardware=hw,
        memory_budget_bytes=DEFAULT_BUDGET_SHARE * hw.memory_bytes if budget is None else float(budget),
        optimizer=optimizer,
        recompute=check_mode(recompute),
        cluster_layers=cluster_layers,
        pin=tuple((pin or {}).items()),
        symbolic_dims=None if symbolic_dims is None else tuple(symbolic_dims.items()),
        solver=solver,
        solver_time_limit_s=float(solver_time_limit_s),
        precision=mixed,
        schedule=schedule,
        microbatches=microbatches,
        partition=partition,
        inv_every=inv_every,
        offload=offload,
    )


def _check_offload(meshes, offload) -> None:
    if offload not in OFFLOAD_MODES or isinstance(offload, int) and not isinstance(offload, bool):
        raise AutoparError(f"offload={offload!r}: use 'auto' (offload when the memory budget needs it), True "
                           f"(always) or False (never)")
    if offload is True and any(has_pipeline(m) for m in meshes):
        raise AutoparError("offload=True on a mesh with 'pp': autopar does not offload a pipeline's stages yet; "
                           "leave offload='auto' (pipelines then hold their state on the device) or plan without 'pp'")


def _check_kfac_options(meshes, optimizer: str, inv_every) -> None:
    if optimizer == "kfac" and not all(has_pipeline(m) for m in meshes):
        raise AutoparError("optimizer='kfac' places K-FAC's curvature work in a pipeline's bubbles, and the mesh has "
                           "no 'pp' axis: plan it on a mesh with 'pp' first (mesh='pp=2,dp=2'), or use 'sgd' or "
                           "'adam'")
    if inv_every is not None and (optimizer != "kfac" or isinstance(inv_every, bool) or not isinstance(inv_every, int)
                                  or inv_every < 1):
        raise AutoparError(f"inv_every={inv_every!r}: K-FAC's refresh period, a positive whole number of steps, with "
                           f"optimizer='kfac'")


def _check_pipeline_options(meshes, schedule, microbatches, partition) -> None:
    for m in meshes:
        if has_pipeline(m):
            split_mesh(m)  # pp must go first
    if schedule is not None:
        check_schedule(schedule)
    if partition not in PARTITIONS:
        raise AutoparError(f"partition={partition!r}: use one of {', '.join(map(repr, PARTITIONS))}")
    if microbatches is not None and (isinstance(microbatches, bool) or not isinstance(microbatches, int)
                                     or microbatches < 1):
        raise AutoparError(f"microbatches={microbatches!r}: give a positive whole number of micro-batches")
    if (schedule is not None or microbatches is not None) and not any(has_pipeline(m) for m in meshes):
        raise AutoparError("schedule= and microbatches= set a pipeline's, and the mesh has no 'pp' axis: add one "
                           "(mesh='pp=2,dp=2') or leave them out")
