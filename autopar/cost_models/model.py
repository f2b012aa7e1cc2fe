"""The cost model the passes consult: op compute time and resharding time."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from autopar.cost_models.collectives import axis_placement, collective_time
from autopar.cost_models.compute import roofline_time, smallest
from autopar.cost_models.hardware import Hardware
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Spec
from autopar.ir.program import TensorMeta
from autopar.ir.redistribute import ASYNC_KINDS, Step, plan_steps


@dataclass
class CostModel:
    mesh: Mesh
    hardware: Hardware
    moe_imbalance: float = 1.0  # PlanRequest.moe_imbalance
    _reshard_cache: dict = field(default_factory=dict)

    def op_time(self, flops: float, nbytes: float, itemsize: int) -> float:
        return roofline_time(flops, nbytes, itemsize, self.hardware)

    def step_times(self, meta: TensorMeta, src: Spec, dst: Spec,
                   bucketed: bool = False) -> list[tuple[Step, float, float]]:
        """Each step of src -> dst with its time and the bytes it moves (full message size).
        ``bucketed``: a gradient's sync, whose first step joins a bucket (see _bucket_share)."""
        out = []
        sharded = dict(src.sharded_dims())  # dim -> axis, tracked as steps change it
        for step in plan_steps(src, dst):
            local = meta.nbytes / math.prod(self.mesh.shape[a] for a in sharded.values()) if sharded else meta.nbytes
            p = self.mesh.shape[step.axis]
            message = local * p if step.kind == "all_gather" else local
            hw = self.hardware
            if step.kind == "shard":  # a local copy of this rank's block
                seconds, moved = 2 * local / p / (hw.memory_efficiency * hw.memory_bandwidth), 0.0
            elif step.kind == "zero_partial":  # a local fill with zeros
                seconds, moved = local / (hw.memory_efficiency * hw.memory_bandwidth), 0.0
            else:
                seconds = self.collective_seconds(step.kind, message, step.axis)
                if bucketed and not out and self._joins_bucket(step.kind):
                    fixed = self.collective_seconds(step.kind, 0.0, step.axis)
                    seconds -= fixed * (1.0 - smallest(1.0, message / hw.gradient_bucket_bytes))
                moved = message
            out.append((step, seconds, moved))
            if step.kind in ("all_gather", "all_to_all"):
                sharded.pop(step.src_dim if step.kind == "all_to_all" else step.dim, None)
            if step.kind in ("reduce_scatter", "shard", "all_to_all"):
                sharded[step.dim] = step.axis
        return out

    def collective_seconds(self, kind: str, message: float, axis: int) -> float:
        """One collective of ``kind`` over ``axis`` with a ``message`` of that many bytes (the
        whole gathered tensor for an all-gather, the input for the others): the transfer, and
        the launch every collective pays, like any kernel, and the library's own."""
        hw = self.hardware
        where = axis_placement(self.mesh, axis, hw)
        return collective_time(kind, message, where, hw) + hw.kernel_floor_s + hw.collective_launch_s

    def routed_exchange_time(self, nbytes: float, axis: int) -> float:
        """An uneven all-to-all (``all_to_all_single`` with split sizes, which every library runs
        itself, gloo included) of ``nbytes`` per rank over ``axis``, as a balanced one."""
        hw = self.hardware
        native = dataclasses.replace(hw, emulated_collectives=tuple(k for k in hw.emulated_collectives
                                                                    if k != "all_to_all"))
        where = axis_placement(self.mesh, axis, hw)
        return collective_time("all_to_all", nbytes, where, native) + hw.kernel_floor_s + hw.collective_launch_s

    def _joins_bucket(self, kind: str) -> bool:
        """The runtime buckets gradient all-reduces (and gloo's reduce-scatters, which are
        all-reduces): a bucket pays one call's fixed costs (latency, launch), which each of its
        gradients shares by its bytes."""
        return kind == "all_reduce" or (kind == "reduce_scatter" and kind in self.hardware.emulated_collectives)

    def async_time(self, meta: TensorMeta, src: Spec, dst: Spec) -> float:
        """Of a gradient's move into its parameter's layout, the part that can overlap backward:
        the first step, when it is an all-reduce or reduce-scatter (the emitted program starts it
        asynchronously, in a bucket)."""
        steps = self._cached_steps(meta, src, dst, bucketed=True)
        return steps[0][1] if steps and steps[0][0].kind in ASYNC_KINDS else 0.0

    def reshard_time(self, meta: TensorMeta, src: Spec, dst: Spec, bucketed: bool = False) -> float:
        return sum(t for _, t, _ in self._cached_steps(meta, src, dst, bucketed))

    def _cached_steps(self, meta: TensorMeta, src: Spec, dst: Spec, bucketed: bool = False) -> list:
        """step_times, kept: the solver asks for the same moves once per strategy pair."""
        if src == dst:
            return []
        key = (meta, src, dst, bucketed)
        hit = self._reshard_cache.get(key)
        if hit is None:
            hit = self._reshard_cache[key] = self.step_times(meta, src, dst, bucketed)
        return hit


