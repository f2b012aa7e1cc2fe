"""Roofline compute time of one op on local shapes: max(flops/rate, bytes/bandwidth, floor),
where the rate falls for small kernels (Hardware.efficiency). Sizes may be sympy
expressions (the plan's cost formula); then the max stays symbolic."""
from __future__ import annotations

import sympy

from autopar.cost_models.hardware import Hardware


def roofline_time(flops, nbytes, itemsize: int, hw: Hardware):
    compute = flops / (hw.efficiency(flops) * hw.flops_rate(itemsize)) if flops != 0 else 0.0
    memory = nbytes / (hw.memory_efficiency * hw.memory_bandwidth)
    return largest(compute, memory, hw.kernel_floor_s)


def largest(*values):
    if all(isinstance(v, (int, float)) for v in values):
        return max(values)
    return sympy.Max(*values)


def smallest(*values):
    if all(isinstance(v, (int, float)) for v in values):
        return min(values)
    return sympy.Min(*values)
