"""The ranks of a mesh as threads of one process, for validating strategies whose local op
communicates (a runtime kernel such as expert parallelism's all-to-all).

Each thread runs the kernel as a rank of the emitted program does, with a stand-in for the
runtime's RankMesh that offers what those kernels call (``mesh``, ``exchange_rows``); its
collectives meet the other threads' at a barrier. So the kernel validated is the one the
programs run, not a second implementation of it.
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
    """What the threads post for an all-to-all, read by their peers between two barriers."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.barrier = threading.Barrier(mesh.size, timeout=_TIMEOUT_S)
        self.posted: dict[tuple, list[torch.Tensor]] = {}

    def rows(self, coords: tuple, x: torch.Tensor, axis: int, send: list[int]) -> torch.Tensor:
        self.posted[coords] = list(x.split(send))
        self.barrier.wait()
        peers = [coords[:axis] + (j,) + coords[axis + 1:] for j in range(self.mesh.shape[axis])]
        out = torch.cat([self.posted[peer][coords[axis]] for peer in peers])
        self.barrier.wait()  # every peer has read this round before the next one posts
        return out


class SimulatedRank:
    """One thread's stand-in for autopar.runtime.rank_mesh.RankMesh."""

    def __init__(self, mesh: Mesh, coords: tuple, exchange: _Exchange):
        self.mesh, self.coords, self._exchange = mesh, coords, exchange

    def exchange_rows(self, x: torch.Tensor, axis: str, send: list[int], receive: list[int]) -> torch.Tensor:
        out = self._exchange.rows(self.coords, x, self.mesh.axis_names.index(axis), send)
        if out.shape[0] != sum(receive):
            raise RuntimeError(f"rank {self.coords} expected {sum(receive)} rows over {axis}, got {out.shape[0]}")
        return out


def run_on_threads(kernel, axis: str, mesh: Mesh, args_of: dict[tuple, tuple]) -> dict[tuple, object]:
    """``kernel(rank, axis, *args_of[coords])`` on one thread per rank: each rank's result, or
    raises the first rank's exception."""
    exchange = _Exchange(mesh)
    results, errors = {}, {}

    def run(coords):
        try:
            results[coords] = kernel(SimulatedRank(mesh, coords, exchange), axis, *args_of[coords])
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
