"""autoparallelize: the one-line API for training scripts launched by torchrun.

    @autopar.autoparallelize(mesh={"dp": 2, "tp": 2})
    class MyModel(nn.Module): ...

    model = MyModel()                      # same init on every rank (or rank 0's is broadcast)
    opt = torch.optim.AdamW(model.parameters())
    loss = model(x, y)                     # first call: rank 0 plans, all ranks shard and run
    loss.backward(); opt.step()

Every rank passes the same global batch; each takes its own block of it.
"""
from __future__ import annotations

import contextlib
import os
import weakref
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from autopar.capture.export import capture
from autopar.errors import AutoparError, MeshError, PlanMismatchError
from autopar.ir.graph import fingerprint_of
from autopar.ir.mesh import Mesh
from autopar.ir.plan import Plan
from autopar.ir.request import DEFAULT_HARDWARE
from autopar.passes.registry import pipeline


class _Runner:
    """Plans on the first call, then runs the emitted program on every call."""

    def __init__(self, mesh, hardware: str, plan: Optional[Plan], device: Optional[str], passes: tuple):
        self.mesh = Mesh.parse(mesh)
        self.passes = passes
        self.hardware = hardware
        self.plan = plan
        self.device = device
        self.parallel = None
        self.sync = True  # False inside no_sync()

    def __call__(self, model: nn.Module, *inputs):
        if self.parallel is None:
            self.parallel = self._start(model, inputs)
        self.parallel.require_gradient_sync = self.sync
        return self.parallel(*inputs)

    @contextlib.contextmanager
    def no_sync(self):
        """See ParallelModule.no_sync: calls inside defer their gradient collectives."""
        before, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = before

    def _start(self, model: nn.Module, inputs):
        from autopar.api import plan as make_plan
        from autopar.runtime.module import ParallelModule
        from autopar.runtime.rank_mesh import RankMesh

        _ensure_process_group()
        self.mesh.check_world_size(dist.get_world_size())  # before any planning or communication
        plan = self.plan
        if plan is None:
            text = [make_plan(model, inputs, mesh=self.mesh, hardware=self.hardware, passes=self.passes).to_json()
                    if dist.get_rank() == 0 else None]
            dist.broadcast_object_list(text, src=0)
            plan = Plan.from_json(text[0])
        elif plan.mesh != self.mesh:
            raise MeshError(f"the given plan is for mesh {plan.mesh}, not {self.mesh}")
        else:  # on every rank, so that all of them raise
            check_plan_is_for(plan, model, inputs)
        device = self.device or ("cuda" if dist.get_backend() == "nccl" else "cpu")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
            device = f"cuda:{torch.cuda.current_device()}"
        with torch.no_grad():  # identical weights on every rank before each takes its block
            for tensor in list(model.parameters()) + list(model.buffers()):
                moved = tensor.data.to(device)
                dist.broadcast(moved, src=0)
                tensor.data = moved
        self.plan = plan
        return ParallelModule(model, plan, RankMesh(self.mesh, device=device), plan.emit("torch"))


def check_plan_is_for(plan: Plan, model: nn.Module, inputs) -> None:
    """Refuse a plan of another computation before it runs: one made for another forward, or
    for inputs of other shapes, has the same parameters but would compute something else."""
    fingerprint = fingerprint_of(capture(model, inputs))
    if fingerprint != plan.fingerprint:
        raise PlanMismatchError(
            f"plan {plan.hash} was made for graph {plan.fingerprint}, but this model and these inputs capture as "
            f"graph {fingerprint} (another forward, or inputs of other shapes or dtypes); plan this model with "
            f"these inputs with autopar.plan and use that plan")


_RUNNERS: "weakref.WeakKeyDictionary[nn.Module, _Runner]" = weakref.WeakKeyDictionary()


class AutoParallel(nn.Module):
    """Wraps a model instance: ``autopar.autoparallelize(model, mesh=...)``."""

    def __init__(self, model: nn.Module, runner: _Runner):
        super().__init__()
        self.model = model
        self._runner = runner

    def forward(self, *inputs):
        return self._runner(self.model, *inputs)

    def no_sync(self):
        """DDP's ``no_sync``: backward passes of calls inside keep local gradients; the first
        backward outside syncs their sum once."""
        return self._runner.no_sync()

    @property
    def plan(self) -> Optional[Plan]:
        return self._runner.plan


def autoparallelize(model=None, *, mesh, hardware: str = DEFAULT_HARDWARE, plan: Optional[Plan] = None,
                    device: Optional[str] = None, passes: Sequence = ()):
    """Use on an instance (returns a wrapper module) or as a class decorator. ``passes``: extra
    passes for the plan (autopar.plan's ``passes``)."""
    Mesh.parse(mesh)  # a malformed mesh fails here, at decoration time
    pipeline(passes)  # so does a misplaced pass

    def runner() -> _Runner:
        return _Runner(mesh, hardware, plan, device, tuple(passes))

    if model is None:
        return lambda cls: _decorate_class(cls, runner)
    if isinstance(model, type):
        return _decorate_class(model, runner)
    if not isinstance(model, nn.Module):
        raise TypeError(f"autoparallelize takes an nn.Module instance or class, got {type(model).__name__}")
    return AutoParallel(model, runner())


def _decorate_class(cls, make_runner):
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"@autoparallelize decorates nn.Module subclasses, got {cls!r}")

    def runner(self) -> _Runner:
        if self not in _RUNNERS:
            _RUNNERS[self] = make_runner()
        return _RUNNERS[self]

    def __call__(self, *inputs):
        return runner(self)(self, *inputs)

    def no_sync(self):
        """DDP's ``no_sync``: backward passes of calls inside keep local gradients; the first
        backward outside syncs their sum once."""
        return runner(self).no_sync()

    # capture calls forward() directly, so only __call__ routes through the runner
    return type(cls.__name__, (cls,), {"__call__": __call__, "no_sync": no_sync, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


def plan_of(model: nn.Module) -> Optional[Plan]:
    """The plan an autoparallelized model is running (None before its first call)."""
    if isinstance(model, AutoParallel):
        return model.plan
    runner = _RUNNERS.get(model)
    return runner.plan if runner else None


def _ensure_process_group() -> None:
    if dist.is_initialized():
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return
    raise AutoparError("an autoparallelized model runs inside a process group: launch the script with "
                       "`torchrun --nproc-per-node=N script.py`; to try a plan in one process use autopar.check")
