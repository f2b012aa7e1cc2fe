"""Hardware presets (per GPU, per direction), from DESIGN.md's table."""
from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError

GB = 1e9


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s per direction
    latency: float  # seconds per step


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
    memory_efficiency: float = 0.8
    kernel_floor_s: float = 2e-6  # launch overhead: no kernel is faster than this

    def flops_rate(self, dtype_bytes: int) -> float:
        # fp32 runs on TF32 tensor cores at about half the bf16 rate
        return self.peak_flops if dtype_bytes <= 2 else self.peak_flops / 2


PRESETS = {
    "a100-sxm-80g": Hardware("a100-sxm-80g", 312e12, 80 * GB, 2.04e12, Link(300 * GB, 1e-6), Link(25 * GB, 2e-6)),
    "h100-sxm": Hardware("h100-sxm", 989e12, 80 * GB, 3.35e12, Link(450 * GB, 1e-6), Link(50 * GB, 2e-6)),
    "h200-sxm": Hardware("h200-sxm", 989e12, 141 * GB, 4.8e12, Link(450 * GB, 1e-6), Link(50 * GB, 2e-6)),
}


def get_hardware(hardware: "str | Hardware") -> Hardware:
    if isinstance(hardware, Hardware):
        return hardware
    if hardware in PRESETS:
        return PRESETS[hardware]
    raise AutoparError(f"unknown hardware {hardware!r}; choose one of {', '.join(sorted(PRESETS))}")
