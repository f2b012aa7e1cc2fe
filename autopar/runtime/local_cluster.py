"""A pool of local worker processes joined in one gloo process group.

Starting a process and importing torch costs seconds on a small machine, so
pools are kept alive and reused (one per world size) until the parent exits.
Jobs are picklable functions ``fn(rank, world_size, *args)``; every rank runs
the job and the results come back as a list ordered by rank.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta

import torch.multiprocessing as mp

from autopar.errors import AutoparError

_PRELOADED_WHERE_USED = ("transformers",)


class WorkerError(AutoparError):
    """A job raised on a worker; the message carries the worker's traceback."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _next_job(tasks):
    """The next job from the parent; where the parent has died without closing the pool (a test
    process that ended with os._exit), nothing will come: the worker ends instead of idling in
    its gloo group's threads for good. (The pool's creator, not the fork server whose child
    this process is.)"""
    parent = mp.parent_process()
    while True:
        try:
            return tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                os._exit(0)


def _worker_main(rank: int, world_size: int, port: int, tasks, results, threads: int) -> None:
    import faulthandler

    import torch
    import torch.distributed as dist

    faulthandler.enable()  # a rank that crashes in native code (SIGSEGV) prints where, not just its exit code
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    results.put((rank, True, "ready"))
    while True:
        job = _next_job(tasks)
        if job is None:
            break
        fn, args = job
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        except BaseException:  # noqa: BLE001 - report everything to the parent
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class LocalCluster:
    def __init__(self, world_size: int, timeout_s: float = 600.0, peers_grace_s: float = 20.0):
        """``peers_grace_s``: how long the other ranks may still answer once one rank has failed."""
        ctx = mp.get_context("forkserver")
        # the workers fork from one server process that imported autopar (and torch) once, not
        # each importing them anew (seconds a process); like spawn, they start without the parent's
        # threads. Hugging Face's library, where the parent uses it, too: each worker would import
        # it again to unpickle a model of it (two to three seconds a worker). Dynamo too, which
        # `import autopar` leaves out: workers that compile or offload would each load it mid-run
        # (half a second a worker), as they did before it left autopar's import
        ctx.set_forkserver_preload(["autopar", "torch._dynamo"] + [m for m in _PRELOADED_WHERE_USED
                                                                   if m in sys.modules])
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.peers_grace_s = peers_grace_s
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        threads = max(1, (os.cpu_count() or 1) // world_size)
        port = _free_port()
        self.procs = [ctx.Process(target=_worker_main, args=(r, world_size, port, self.tasks[r], self.results,
                                                             threads), daemon=True)
                      for r in range(world_size)]
        for p in self.procs:
            p.start()
        self._collect()  # wait until every rank joined the group

    def run(self, fn, *args) -> list:
        for q in self.tasks:
            q.put((fn, args))
        return self._collect()

    def _collect(self) -> list:
        out: list = [None] * self.world_size
        errors = []
        deadline = time.monotonic() + self.timeout_s
        for _ in range(self.world_size):
            answer = self._next_result(deadline)
            if answer is None:
                if not errors:
                    raise WorkerError(f"local workers gave no answer within {self.timeout_s:.0f} s")
                # A rank that raised leaves its peers waiting in a collective for good: report
                # what the failed ranks said rather than waiting out the whole timeout.
                errors.append(f"the other ranks gave no answer within {self.peers_grace_s:.0f} s of that failure")
                break
            rank, ok, value = answer
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
                deadline = min(deadline, time.monotonic() + self.peers_grace_s)
        if errors:
            self.close()  # a failed collective can leave the group unusable: start afresh next time
            raise WorkerError("a job failed on the local workers:\n" + "\n".join(errors))
        return out

    def _next_result(self, deadline: float):
        """The next ``(rank, ok, value)``, or None once the deadline has passed (the pool is closed)."""
        while True:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                self.close()
                if dead:  # e.g. a spawned child re-imported a script that starts workers at import time
                    how = ", ".join(f"rank {r}: {_exit_status(self.procs[r].exitcode)}" for r in dead)
                    raise WorkerError(f"local worker rank(s) {dead} exited before answering ({how}); if a script "
                                      "calls autopar at import time, put that code under `if __name__ == "
                                      "'__main__':`; a rank killed by SIGKILL often ran out of memory; one killed by "
                                      "SIGSEGV or SIGABRT printed where it crashed (its Python stack) on stderr")
                return None

    @property
    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self) -> None:
        for q, p in zip(self.tasks, self.procs):
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):  # a queue the worker's death broke
                    q.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        if _POOLS.get(self.world_size) is self:
            del _POOLS[self.world_size]


def _exit_status(code: int | None) -> str:
    """A worker's exit code in words (multiprocessing gives -N for a process killed by signal N)."""
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


_POOLS: dict[int, LocalCluster] = {}


def get_cluster(world_size: int) -> LocalCluster:
    """A live pool of ``world_size`` workers, started on first use and then reused."""
    cluster = _POOLS.get(world_size)
    if cluster is None or not cluster.alive:
        cluster = LocalCluster(world_size)
        _POOLS[world_size] = cluster
    return cluster


@atexit.register
def _shutdown() -> None:
    for cluster in list(_POOLS.values()):
        cluster.close()
