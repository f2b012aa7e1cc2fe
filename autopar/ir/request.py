"""PlanRequest: every planning option, resolved once at the API edge.

``autopar.planning.request.resolve`` builds one from what a user passes (a mesh spec, a
preset name, "60GiB"); passes read its typed fields, and the plan cache keys on it. The
defaults below are the only place each default is written.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autopar.ir.hardware import Hardware
from autopar.ir.mesh import Mesh
from autopar.ir.precision import MixedPrecision

DEFAULT_HARDWARE = "h100-sxm"
DEFAULT_SOLVER = "lp-first"  # the LP relaxation, then SCIP on what it leaves open; "mip" or "cp-sat" on request
# per solve: the deterministic work limit (autopar.solvers.limits: about a simplex iteration each,
# ~1 min on the 70B shape's LP on 2 cores) binds; the wall-clock limit is a safety net only
DEFAULT_WORK_LIMIT = 100_000
DEFAULT_TIME_LIMIT_S = 600.0
DEFAULT_OPTIMIZER = "adam"
DEFAULT_RECOMPUTE = "auto"
DEFAULT_OFFLOAD = "auto"
OFFLOAD_MODES = ("auto", True, False)
DEFAULT_BUDGET_SHARE = 0.9  # of the device's memory, when no memory budget is given
SOLVERS = ("lp-first", "mip", "cp-sat")
PARTITIONS = ("balanced", "even")


@dataclass(frozen=True)
class PlanRequest:
    meshes: tuple[Mesh, ...]  # the candidates: one, or every mesh of a device count
    hardware: Hardware
    memory_budget_bytes: float  # per device
    optimizer: str = DEFAULT_OPTIMIZER
    recompute: str = DEFAULT_RECOMPUTE  # "auto" | "full" | "none"
    cluster_layers: bool = True
    pin: tuple[tuple[str, str], ...] = ()  # (parameter, module or glob; placements text such as "S(0),R")
    symbolic_dims: tuple[tuple[str, int], ...] | None = None  # (size name, dim index in the inputs)
    solver: str = DEFAULT_SOLVER
    solver_work_limit: int = DEFAULT_WORK_LIMIT
    solver_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    # on a 2-D mesh, run the full integer program after the axis-by-axis descent (mesh search
    # runs it only on its finalists)
    full_program: bool = True
    precision: MixedPrecision | None = None  # None: the model's own dtypes
    # on a mesh with a pp axis: the schedule (torch's class name without "Schedule") and the
    # micro-batch count; None: searched
    schedule: str | None = None
    microbatches: int | None = None
    # how layers are split into stages: "balanced" (the least predicted time under memory) or
    # "even" (equal runs of layers, as Megatron-LM splits them)
    partition: str = "balanced"
    # the stages pinned, each a run of unit names (autopar.ir.pipeline.Stage.units): a later plan
    # of a pipelined model in other modes runs on the stages its parameters already live on
    stages: tuple[tuple[str, ...], ...] | None = None
    # the share of a step's gradient syncs one run of the program pays in the sharding objective:
    # 1/m for a pipeline stage's micro-batch, whose gradients sync once per m micro-batches
    sync_share: float = 1.0
    # micro-batches whose saved activations a device holds at once: a pipeline stage keeps several
    # in flight (autopar.planning.pipelined), so its micro-batch's program is fitted to the budget
    # with the others' saved activations beside it
    activations_in_flight: int = 1
    # optimizer="kfac": the steps between curvature refreshes (its factors and inverses); None:
    # chosen by the planner (autopar.planning.bubbles._refresh_period)
    inv_every: int | None = None
    # parameters and optimizer state in host memory (autopar.passes.offload): "auto" where the
    # memory budget needs it, True always (every chunk), False never
    offload: str | bool = DEFAULT_OFFLOAD
    # mixture-of-experts routing: the busiest expert's tokens over the mean (autopar.ops.moe prices
    # an expert-parallel layer by its busiest rank); 1.0 assumes balanced routing
    moe_imbalance: float = 1.0

    @property
    def pins(self) -> dict[str, str]:
        return dict(self.pin)

    def on(self, mesh: Mesh, *, full_program: bool | None = None) -> PlanRequest:
        """This request for one of its meshes."""
        full = self.full_program if full_program is None else full_program
        return dataclasses.replace(self, meshes=(mesh,), full_program=full)

    def key(self) -> dict:
        """Plain data for the plan cache's key: every field, the hardware spec in full."""
        body = dataclasses.asdict(self)
        body["meshes"] = [m.to_json() for m in self.meshes]
        return body
