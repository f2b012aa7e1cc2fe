"""α–β prices of collectives on one mesh axis (ring algorithms).

Formulas (DESIGN.md): all-reduce 2(p−1)α + 2(p−1)/p·n/B; all-gather and
reduce-scatter (p−1)α + (p−1)/p·n/B; all-to-all the same; n is the full
(unsharded) message size in bytes.
"""
from __future__ import annotations

import math

from autopar.cost_models.hardware import Hardware, Link
from autopar.mesh import Mesh


def axis_link(mesh: Mesh, axis: int, hw: Hardware) -> Link:
    """Axes are laid innermost-first onto a node: an axis stays on NVLink while the
    devices it spans (it and the axes inside it) fit in one node."""
    span = math.prod(mesh.shape[axis:])
    return hw.intra_node if span <= hw.devices_per_node else hw.inter_node


def collective_time(kind: str, nbytes: float, p: int, link: Link) -> float:
    if p <= 1 or kind in ("shard", "zero_partial"):
        return 0.0
    alpha, beta = link.latency, 1.0 / link.bandwidth
    if kind == "all_reduce":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) * alpha + (p - 1) / p * nbytes * beta
    raise ValueError(f"unknown collective {kind!r}")
