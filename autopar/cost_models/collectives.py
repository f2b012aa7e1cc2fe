"""α–β prices of collectives on one mesh axis, aware of where the axis lies.

Ring formulas on one link (Thakur et al. 2005; DESIGN.md), p ranks, n bytes:
all-reduce 2(p−1)α + 2(p−1)/p·n·β; all-gather and reduce-scatter
(p−1)α + (p−1)/p·n·β, with n the full (gathered / pre-reduction) buffer;
all-to-all (p−1)α + (p−1)/p·n·β with n one rank's buffer.

An axis whose group spans m devices in each of k nodes (p = m·k) runs
hierarchically: all-reduce = reduce-scatter inside (m) + all-reduce across
(k, on n/m bytes) + all-gather inside; reduce-scatter and all-gather are the
matching halves; all-to-all sends (m−1)/p of the buffer inside and (p−m)/p across.

Where the library lacks a collective (``Hardware.emulated_collectives``, e.g.
gloo), it is priced as the runtime runs it: reduce-scatter as an all-reduce,
all-to-all as an all-gather of every rank's whole buffer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.cost_models.hardware import Hardware, Link
from autopar.ir.mesh import Mesh


@dataclass(frozen=True)
class AxisPlacement:
    """How one group of a mesh axis sits on the cluster."""

    size: int  # ranks in the group
    per_node: int  # of those, how many share a node

    @property
    def nodes(self) -> int:
        return self.size // self.per_node


def axis_placement(mesh: Mesh, axis: int, hw: Hardware) -> AxisPlacement:
    """Devices are numbered row-major over the mesh and filled into nodes in order, so the
    last axis is innermost: the group of rank 0 on ``axis`` holds devices j·stride."""
    size = mesh.shape[axis]
    stride = math.prod(mesh.shape[axis + 1:])
    nodes = len({(j * stride) // hw.devices_per_node for j in range(size)})
    return AxisPlacement(size, size // nodes)


def ring_time(kind: str, nbytes: float, p: int, link: Link) -> float:
    if p <= 1:
        return 0.0
    alpha, beta = link.latency, 1.0 / link.bandwidth
    if kind == "all_reduce":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) * alpha + (p - 1) / p * nbytes * beta
    raise ValueError(f"unknown collective {kind!r}")


def as_run(kind: str, nbytes: float, p: int, emulated: tuple) -> tuple[str, float]:
    """The collective the runtime really issues for ``kind``, and its message size."""
    if kind in emulated:
        if kind == "reduce_scatter":
            return "all_reduce", nbytes
        if kind == "all_to_all":
            return "all_gather", nbytes * p
    return kind, nbytes


def collective_time(kind: str, nbytes: float, where: AxisPlacement, hw: Hardware) -> float:
    p, m, k = where.size, where.per_node, where.nodes
    if p <= 1 or kind in ("shard", "zero_partial"):
        return 0.0
    kind, nbytes = as_run(kind, nbytes, p, hw.emulated_collectives)
    if k == 1:
        return ring_time(kind, nbytes, p, hw.intra_node)
    if m == 1:
        return ring_time(kind, nbytes, p, hw.inter_node)
    inside, across = hw.intra_node, hw.inter_node
    if kind == "all_reduce":
        return (ring_time("reduce_scatter", nbytes, m, inside) + ring_time("all_reduce", nbytes / m, k, across)
                + ring_time("all_gather", nbytes, m, inside))
    if kind == "reduce_scatter":
        return ring_time("reduce_scatter", nbytes, m, inside) + ring_time("reduce_scatter", nbytes / m, k, across)
    if kind == "all_gather":
        return ring_time("all_gather", nbytes / m, k, across) + ring_time("all_gather", nbytes, m, inside)
    if kind == "all_to_all":
        return ((m - 1) * inside.latency + (m - 1) / p * nbytes / inside.bandwidth
                + (k - 1) * across.latency + (p - m) / p * nbytes / across.bandwidth)
    raise ValueError(f"unknown collective {kind!r}")
