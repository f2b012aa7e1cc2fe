"""The API edge: what a user passes (a mesh spec, a hardware name, "60GiB") resolved once into
a PlanRequest, so that a bad option fails before any work and no pass re-reads raw options."""
from __future__ import annotations

import types

from autopar.cost_models.hardware import get_hardware
from autopar.cost_models.pipeline_schedules import check_schedule
from autopar.errors import AutoparError
from autopar.ir.hardware import Hardware
from autopar.ir.options import OPTIONS
from autopar.ir.precision import parse_precision
from autopar.ir.request import (
    DEFAULT_BUDGET_SHARE,
    DEFAULT_HARDWARE,
    OFFLOAD_MODES,
    PARTITIONS,
    SOLVERS,
    PlanRequest,
)
from autopar.lowering.memory import optimizer_bytes_per_element
from autopar.passes.recompute import check_mode
from autopar.planning.meshes import candidate_meshes, has_pipeline, split_mesh
from autopar.units import parse_bytes

PLANNING_DEFAULTS = {o.name: o.default for o in OPTIONS if o.planning}


def resolve(mesh, hardware: str | Hardware = DEFAULT_HARDWARE, **planning) -> PlanRequest:
    """The request that ``mesh``, ``hardware`` and the planning options (autopar.ir.options:
    those marked ``planning``; the rest keep their declared defaults) stand for."""
    unknown = sorted(set(planning) - set(PLANNING_DEFAULTS))
    if unknown:
        raise TypeError(f"resolve() got an unexpected planning option {unknown[0]!r}")
    o = types.SimpleNamespace(**{**PLANNING_DEFAULTS, **planning})
    hw = get_hardware(hardware)
    meshes = tuple(candidate_meshes(mesh, hw))
    _check_pipeline_options(meshes, o.schedule, o.microbatches, o.partition)
    if o.solver not in SOLVERS:
        raise AutoparError(f"unknown solver {o.solver!r}; use one of {', '.join(map(repr, SOLVERS))}")
    optimizer_bytes_per_element(o.optimizer, 4)  # an unknown optimizer fails here
    _check_kfac_options(meshes, o.optimizer, o.inv_every)
    _check_offload(o.offload, o.optimizer)
    budget = parse_bytes(o.memory_budget)
    mixed = parse_precision(o.precision)
    if mixed is not None and o.optimizer == "kfac":
        raise AutoparError(f"optimizer='kfac' with precision={str(mixed)!r}: K-FAC finds its layers as the matmuls "
                           f"that read a weight, and under mixed precision they read the weight's low-precision cast; "
                           f"K-FAC runs in float32 for now: plan it with precision=None")
    if mixed is not None and o.optimizer == "adam-mixed":
        raise AutoparError(f"optimizer='adam-mixed' counts a float32 master copy beside low-precision parameters; "
                           f"under precision={str(mixed)!r} the parameters are the float32 masters: use "
                           f"optimizer='adam'")
    return PlanRequest(
        meshes=meshes,
        hardware=hw,
        memory_budget_bytes=DEFAULT_BUDGET_SHARE * hw.memory_bytes if budget is None else float(budget),
        optimizer=o.optimizer,
        recompute=check_mode(o.recompute),
        cluster_layers=o.cluster_layers,
        pin=tuple((o.pin or {}).items()),
        symbolic_dims=None if o.symbolic_dims is None else tuple(o.symbolic_dims.items()),
        solver=o.solver,
        solver_work_limit=_positive_int("solver_work_limit", o.solver_work_limit),
        solver_time_limit_s=float(o.solver_time_limit_s),
        precision=mixed,
        schedule=o.schedule,
        microbatches=o.microbatches,
        partition=o.partition,
        inv_every=o.inv_every,
        offload=o.offload,
        moe_imbalance=_imbalance(o.moe_imbalance),
    )


def _imbalance(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1.0:
        raise AutoparError(f"moe_imbalance={value!r}: the busiest expert's tokens over the mean per expert, a number "
                           f"of at least 1.0 (1.0: balanced routing; measure it with autopar.routing_imbalance)")
    return float(value)


def _check_offload(offload, optimizer: str) -> None:
    if offload not in OFFLOAD_MODES or isinstance(offload, int) and not isinstance(offload, bool):
        raise AutoparError(f"offload={offload!r}: use 'auto' (offload when the memory budget needs it), True "
                           f"(always) or False (never)")
    if offload is True and optimizer == "kfac":
        raise AutoparError("offload=True with optimizer='kfac': K-FAC's curvature work reads each weight's "
                           "gradient operands and steps the weights on the device, and an offloaded pipeline "
                           "keeps them in host memory; use offload=False (or 'auto', which keeps a K-FAC pipeline "
                           "on the device), or a first-order optimizer")


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


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AutoparError(f"{name}={value!r}: give a positive whole number")
    return value
