"""What a compiled program calls instead of RankMesh: the same collectives as functional ones.

``torch.compile`` cannot trace ``torch.distributed``'s in-place, work-handle collectives, so a
program calling them would break its graph at every collective. Functional collectives
(``torch.distributed._functional_collectives``) return new tensors, which Dynamo traces into
the graph as ``_c10d_functional`` ops with a wait before the first use of each result:
Inductor sees the whole forward (or backward), communication included, and may schedule
compute between a collective and its wait.

A gradient sync's start is the collective itself and its wait is where the result is first
read, so syncs still overlap the rest of backward. They run on the sync process groups, as
RankMesh's do; Inductor's own bucketing passes coalesce them (autopar.runtime.program), where
RankMesh fills buckets from Python between kernels. Counting bytes is left to RankMesh: a
compiled graph runs no Python per call.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._C._distributed_c10d import _register_process_group, _resolve_process_group, _unregister_process_group

from autopar.runtime.graph_breaks import methods_between_graphs
from autopar.runtime.rank_mesh import RankMesh


class TracedCollectives:
    """The ``rt`` of a compiled program: RankMesh's programs' interface, each collective functional."""

    def __init__(self, rank_mesh: RankMesh):
        self.rank_mesh = rank_mesh
        self.device = rank_mesh.device
        self._sizes = dict(zip(rank_mesh.mesh.axis_names, rank_mesh.mesh.shape))
        self._coords = {axis: torch.tensor(c, device=self.device)
                        for axis, c in zip(rank_mesh.mesh.axis_names, rank_mesh.coords)}
        layout = ",".join(f"{n}{s}" for n, s in zip(rank_mesh.whole.axis_names, rank_mesh.whole.shape))
        prefix = f"autopar[{self.device.type}:{layout}]"
        self._groups = {axis: _alias(f"{prefix}:{axis}", group) for axis, group in rank_mesh.groups.items()}
        self._sync_groups = {axis: _alias(f"{prefix}:{axis}:sync", group)
                             for axis, group in rank_mesh.sync_groups.items()}
        # native_dropout draws a global mask and keeps this rank's block: Python the graph breaks around
        methods_between_graphs(TracedCollectives, "native_dropout")
        # torch 2.13's functional all-gather corrupts gloo's heap when several are in flight, as a
        # compiled graph issues them ahead of their waits (eight ranks issuing six at a time
        # crashed in every run of 1,500 rounds; all_to_all_single, all_reduce and RankMesh's
        # work-handle all-gather never did): on gloo the gather is an all-to-all, which costs
        # only host memory
        self._gathers_by_all_to_all = {axis for axis, group in rank_mesh.groups.items()
                                       if dist.get_backend(group) == dist.Backend.GLOO}

    # ``last_read`` (RankMesh's: reduce in the input's memory) has nothing to do here: Inductor
    # plans a compiled graph's buffers
    def all_reduce(self, x: torch.Tensor, axis: str, last_read: bool = False) -> torch.Tensor:
        return funcol.all_reduce(x, "sum", self._groups[axis])

    def all_gather(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        if axis in self._gathers_by_all_to_all:
            return self._all_gather_by_all_to_all(x, axis, dim)
        return funcol.all_gather_tensor(x.contiguous(), dim, self._groups[axis])

    def _all_gather_by_all_to_all(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        """Every rank's ``x`` joined along ``dim``: each rank sends its whole block to every rank."""
        p = self._sizes[axis]
        copies = x.unsqueeze(0).expand(p, *x.shape).reshape(p, -1).contiguous()  # row i for rank i
        received = funcol.all_to_all_single(copies, None, None, self._groups[axis])
        return _joined(received, (p, *x.shape), dim)

    def reduce_scatter(self, x: torch.Tensor, axis: str, dim: int, last_read: bool = False) -> torch.Tensor:
        return self._reduce_scatter(x, axis, dim, self._groups[axis])

    def all_to_all(self, x: torch.Tensor, axis: str, src_dim: int, dst_dim: int) -> torch.Tensor:
        """Split ``x`` along ``dst_dim``, send block i to rank i, join what comes back along
        ``src_dim`` (one all_to_all_single on the blocks laid out along dim 0)."""
        p = self._sizes[axis]
        blocks = torch.stack(x.chunk(p, dst_dim))  # [p, *block]: block i for rank i
        received = funcol.all_to_all_single(blocks.reshape(p, -1).contiguous(), None, None,
                                            self._groups[axis])
        return _joined(received, blocks.shape, src_dim)

    def start_all_gather(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        return self.all_gather(x, axis, dim)

    def start_all_reduce(self, x: torch.Tensor, axis: str) -> torch.Tensor:
        return funcol.all_reduce(x, "sum", self._sync_groups[axis])

    def start_reduce_scatter(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        return self._reduce_scatter(x, axis, dim, self._sync_groups[axis])

    @staticmethod
    def wait(x: torch.Tensor) -> torch.Tensor:
        """A functional collective's result is waited for where it is first read."""
        return x

    def _reduce_scatter(self, x: torch.Tensor, axis: str, dim: int, group) -> torch.Tensor:
        # reduce_scatter_tensor splits along dim 0: bring ``dim`` there and back
        out = funcol.reduce_scatter_tensor(x.movedim(dim, 0).contiguous(), "sum", 0, group)
        return out.movedim(0, dim).contiguous()

    # shard and zero_partial read this rank's coordinate from a tensor, which Dynamo makes a graph
    # input, where RankMesh's Python int would be baked into each rank's graph
    def shard(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        p = self._sizes[axis]
        if x.shape[dim] % p:
            return self.rank_mesh.shard(x, axis, dim)  # uneven blocks: each rank's shape is its own anyway
        size = x.shape[dim] // p
        return x.index_select(dim, self._coords[axis] * size + torch.arange(size, device=x.device))

    def zero_partial(self, x: torch.Tensor, axis: str) -> torch.Tensor:
        return torch.where(self._coords[axis] == 0, x, torch.zeros_like(x))

    def native_dropout(self, x: torch.Tensor, p: float, train, global_shape, spec: str):
        return self.rank_mesh.native_dropout(x, p, train, global_shape, spec)


def _joined(received: torch.Tensor, blocks_shape, dim: int) -> torch.Tensor:
    """An all-to-all's ``received`` rows (rank i's block in row i) as ``blocks_shape``'s blocks
    joined along ``dim`` in rank order."""
    return torch.cat(received.reshape(blocks_shape).unbind(0), dim=dim)


def _alias(name: str, group) -> str:
    """Register ``group`` under ``name`` in c10d's registry, where functional collectives look
    their group up: the name a compiled graph holds is then the same on every rank (each rank's
    own group of an axis), so ranks' graphs agree and one compile serves them all
    (autopar.runtime.compiling)."""
    try:
        if _resolve_process_group(name) is group:
            return name
        _unregister_process_group(name)  # a group of an earlier process group (the world was made anew)
    except RuntimeError:
        pass  # not registered yet
    _register_process_group(name, group)
    return name
