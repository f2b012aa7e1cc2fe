"""Roofline compute time of one op on local shapes: max(flops/rate, bytes/bandwidth, floor),
where the rate falls for small kernels (Hardware.efficiency)."""
from __future__ import annotations

from autopar.cost_models.hardware import Hardware


def roofline_time(flops: float, nbytes: float, itemsize: int, hw: Hardware) -> float:
    compute = flops / (hw.efficiency(flops) * hw.flops_rate(itemsize)) if flops > 0 else 0.0
    memory = nbytes / (hw.memory_efficiency * hw.memory_bandwidth)
    return max(compute, memory, hw.kernel_floor_s)
