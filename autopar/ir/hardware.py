"""Hardware: the figures the cost model prices a plan with (presets and spec files in
autopar.cost_models.hardware).

A cluster is ``nodes x devices_per_node`` devices; devices in a node talk over
``intra_node`` links (NVLink), nodes over ``inter_node`` links (InfiniBand).
Bandwidths are per GPU per direction.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from autopar.errors import AutoparError

GB = 1e9


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s per direction
    latency: float  # seconds per step

    def seconds(self, nbytes: float) -> float:
        """One transfer of ``nbytes`` over the link (nothing for no bytes)."""
        return self.latency + nbytes / self.bandwidth if nbytes else 0.0


GRADIENT_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    intra_node: Link
    inter_node: Link
    devices_per_node: int = 8
    compute_efficiency: float = 0.7  # fraction of peak a large matmul reaches
    # FLOPs of a kernel that reaches half of compute_efficiency: small matmuls cannot fill the device
    half_efficiency_flops: float = 1e8
    memory_efficiency: float = 0.8
    kernel_floor_s: float = 2e-6  # launch overhead: no kernel is faster than this
    # host time of an op that launches no kernel (a view): 0 where the host runs ahead of an
    # asynchronous device (GPUs), but paid in full on a synchronous one (CPU processes)
    host_op_s: float = 0.0
    # fixed time per collective call on top of its ring steps and the kernel floor: 0 for NCCL
    # (its launch latency is in α), about a millisecond for gloo processes sharing cores, where
    # every rank of the group must be scheduled before the first step (autopar calibrate fits it)
    collective_launch_s: float = 0.0
    fp32_flops_ratio: float = 0.5  # fp32 runs on TF32 tensor cores at about half the bf16 rate
    # collectives the communication library lacks, which autopar's runtime composes (gloo:
    # reduce-scatter = all-reduce + slice, all-to-all = all-gather + slice)
    emulated_collectives: tuple = ()
    # the library the emitted program's collectives run on: it decides the buffers they hold
    # while they run (autopar.lowering.schedule); CPU processes run gloo
    collectives_library: str = "nccl"
    # fraction of the backward compute that a gradient's all-reduce / reduce-scatter can run
    # under (the emitted program starts it as soon as the gradient exists and waits at the end);
    # 0 on a device that cannot compute and communicate at once (CPU processes sharing cores)
    gradient_overlap: float = 0.0
    # gradient syncs go out in buckets of this many bytes (autopar.runtime.rank_mesh), so each
    # pays its share of one call's fixed costs
    gradient_bucket_bytes: float = GRADIENT_BUCKET_BYTES
    # offload (autopar.planning.offload): the link each device moves chunks to and from host
    # memory over (PCIe), per direction; the node's host memory and the parameter elements per
    # second its CPUs take through an Adam step, both shared by the node's devices
    host_link: Link = Link(25 * GB, 1e-5)
    host_memory_bytes: float = 1e12
    host_optimizer_rate: float = 1e9
    # whether a host copy runs beside compute (a GPU's copy engines): False where the copy and the
    # compute share the same cores (CPU processes)
    host_copies_overlap: bool = True

    def flops_rate(self, dtype_bytes: int) -> float:
        return self.peak_flops if dtype_bytes <= 2 else self.peak_flops * self.fp32_flops_ratio

    @property
    def host_memory_per_device(self) -> float:
        return self.host_memory_bytes / self.devices_per_node

    @property
    def host_optimizer_rate_per_device(self) -> float:
        return self.host_optimizer_rate / self.devices_per_node

    def efficiency(self, flops: float) -> float:
        """Fraction of peak a kernel of ``flops`` reaches (saturating: f / (f + f_half))."""
        return self.compute_efficiency * flops / (flops + self.half_efficiency_flops)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @staticmethod
    def from_dict(d: dict, source: str = "the hardware spec") -> Hardware:
        if not isinstance(d, dict):
            raise AutoparError(f"{source} must be a mapping of fields, got {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(Hardware)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise AutoparError(f"{source} has unknown field(s) {', '.join(unknown)}; "
                               f"known: {', '.join(sorted(fields))}")
        d = dict(d)
        try:
            for key in ("intra_node", "inter_node", "host_link"):
                if key in d:
                    d[key] = Link(**d[key])
            if "emulated_collectives" in d:
                d["emulated_collectives"] = tuple(d["emulated_collectives"])
            return Hardware(**d)
        except TypeError as exc:
            raise AutoparError(f"{source} is incomplete or malformed ({exc}); it needs name, peak_flops, "
                               f"memory_bytes, memory_bandwidth, intra_node and inter_node "
                               f"({{bandwidth, latency}})") from exc
