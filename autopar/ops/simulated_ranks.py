"""The ranks of a mesh as threads of one process, for validating strategies whose local op
communicates (a runtime kernel such as expert parallelism's all-to-all).

Each thread runs the kernel as a rank of the emitted program does, with a stand-in for the
runtime's RankMesh that offers what those kernels call (``mesh``, ``coords``, ``exchange_rows``,
``all_gather``, ``reduce_scatter``); its collectives meet the other threads' at a barrier. So
the kernel validated is the one the programs run, not a second implementation of it.
"""
from __future__ import annotations

import importlib
import threading

import torch

from autopar.ir.mesh import Mesh

_TIMEOUT_S = 60.0


def runtime_kernel(name: str):
    """The function of autopar.runtime that a kernel name ("moe.experts_all_to_all") names."""
    module, _, function = name.rpartition(".")
    return getattr(importlib.import_module(f"autopar.runtime.{module}"), function)


class _Exchange:
    """What the threads post for a collective, read by their peers between two barriers."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.barrier = threading.Barrier(mesh.size, timeout=_TIMEOUT_S)
        self.posted: dict[tuple, list[torch.Tensor]] = {}

    def swap(self, coords: tuple, parts: list[torch.Tensor], axis: int) -> list[torch.Tensor]:
        """Rank ``coords`` sends ``parts[j]`` to the j-th rank along ``axis``: what each of those
        ranks sent it, in their order."""
        self.posted[coords] = parts
        self.barrier.wait()
        peers = [coords[:axis] + (j,) + coords[axis + 1:] for j in range(self.mesh.shape[axis])]
        out = [self.posted[peer][coords[axis]] for peer in peers]
        self.barrier.wait()  # every peer has read this round before the next one posts
        return out


class SimulatedRank:
    """One thread's stand-in for autopar.runtime.rank_mesh.RankMesh."""

    def __init__(self, mesh: Mesh, coords: tuple, exchange: _Exchange):
        self.mesh, self.coords, self._exchange = mesh, coords, exchange

    def _swap(self, parts: list[torch.Tensor], axis: str) -> list[torch.Tensor]:
        return self._exchange.swap(self.coords, parts, self.mesh.axis_names.index(axis))

    def exchange_rows(self, x: torch.Tensor, axis: str, send: list[int], receive: list[int]) -> torch.Tensor:
        out = torch.cat(self._swap(list(x.split(send)), axis))
        if out.shape[0] != sum(receive):
            raise RuntimeError(f"rank {self.coords} expected {sum(receive)} rows over {axis}, got {out.shape[0]}")
        return out

    def all_gather(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        ranks = self.mesh.shape[self.mesh.axis_names.index(axis)]
        return torch.cat(self._swap([x] * ranks, axis), dim=dim)

    def reduce_scatter(self, x: torch.Tensor, axis: str, dim: int) -> torch.Tensor:
        ranks = self.mesh.shape[self.mesh.axis_names.index(axis)]
        return sum(self._swap(list(x.chunk(ranks, dim)), axis))


def run_on_threads(kernel, axis: str, mesh: Mesh, args_of: dict[tuple, tuple],
                   kwargs_of: dict[tuple, dict] | None = None) -> dict[tuple, object]:
    """``kernel(rank, axis, *args_of[coords], **kwargs_of[coords])`` on one thread per rank:
    each rank's result, or raises the first rank's exception."""
    exchange = _Exchange(mesh)
    results, errors = {}, {}

    def run(coords):
        try:
            kwargs = (kwargs_of or {}).get(coords, {})
            results[coords] = kernel(SimulatedRank(mesh, coords, exchange), axis, *args_of[coords], **kwargs)
        except BaseException as exc:  # noqa: BLE001  (re-raised below, in the caller's thread)
            errors[coords] = exc
            exchange.barrier.abort()  # the peers waiting for this rank stop too

    threads = [threading.Thread(target=run, args=(c,)) for c in args_of]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first_failure = next((e for e in errors.values() if not isinstance(e, threading.BrokenBarrierError)),
                         next(iter(errors.values()), None))
    if first_failure is not None:
        raise first_failure
    return results
