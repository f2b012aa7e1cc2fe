"""Roofline compute time of one op on local shapes: max(flops/rate, bytes/bandwidth, floor)."""
from __future__ import annotations

from autopar.cost_models.hardware import Hardware


def roofline_time(flops: float, nbytes: float, itemsize: int, hw: Hardware) -> float:
    compute = flops / (hw.compute_efficiency * hw.flops_rate(itemsize))
    memory = nbytes / (hw.memory_efficiency * hw.memory_bandwidth)
    return max(compute, memory, hw.kernel_floor_s)
