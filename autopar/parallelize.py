"""autoparallelize: the one-line API for training scripts launched by torchrun.

    @autopar.autoparallelize(mesh={"dp": 2, "tp": 2})
    class MyModel(nn.Module): ...

    model = MyModel()                      # same init on every rank (or rank 0's is broadcast)
    opt = torch.optim.AdamW(model.parameters())
    loss = model(x, y)                     # first call: rank 0 plans, all ranks shard and run
    loss.backward(); opt.step()

Every rank passes the same global batch; each takes its own block of it. The model is called
as it is (positional and keyword arguments, nested batches) and returns what it returns.

The first call plans the training step (with the model in training mode, whatever its mode),
which fixes where every parameter lives. A later call the programs so far do not fit (another
input shape, other train/eval modes, a call under no_grad, which runs a forward program) is
planned then, with the parameters where the first plan put them, and kept for the next such
call; ``replan=False`` refuses another input shape instead.
"""
from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from autopar import errors
from autopar.capture.export import capture
from autopar.errors import AutoparError, MeshError, NoLossError, PlanMismatchError, user_stacklevel
from autopar.ir.call import FlatCall, flatten_call
from autopar.ir.graph import fingerprint_of
from autopar.ir.mesh import Mesh
from autopar.ir.plan import Plan
from autopar.ir.program import FORWARD, STEP
from autopar.ir.request import DEFAULT_HARDWARE
from autopar.passes.registry import pipeline


class _Runner:
    """Plans on the first call, then runs the emitted programs on every call."""

    def __init__(self, mesh, hardware: str, plan: Optional[Plan], device: Optional[str], passes: tuple,
                 loss_fn: Optional[Callable], replan: bool):
        self.mesh = Mesh.parse(mesh)
        self.passes = passes
        self.hardware = hardware
        self.plan = plan
        self.device = device
        self.loss_fn = loss_fn
        self.replan = replan
        self.parallel = None
        self.sync = True  # False inside no_sync()

    def __call__(self, model: nn.Module, *args, **kwargs):
        if self.parallel is None:
            self.parallel = self._start(model, flatten_call(args, kwargs))
        self.parallel.require_gradient_sync = self.sync
        return self.parallel(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """See ParallelModule.no_sync: calls inside defer their gradient collectives."""
        before, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = before

    def _start(self, model: nn.Module, call: FlatCall):
        from autopar.runtime.module import ParallelModule
        from autopar.runtime.rank_mesh import RankMesh

        _ensure_process_group()
        self.mesh.check_world_size(dist.get_world_size())  # before any planning or communication
        plan = self.plan
        if plan is None:
            plan = _planned_on_rank0(lambda: self._first_plan(model, call))
        elif plan.mesh != self.mesh:
            raise MeshError(f"the given plan is for mesh {plan.mesh}, not {self.mesh}")
        else:  # on every rank, so that all of them raise
            args, kwargs = call.rebuild(call.tensors)
            check_plan_is_for(plan, model, *args, loss_fn=self.loss_fn, **kwargs)
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
        return ParallelModule(model, plan, RankMesh(self.mesh, device=device), plan.emit("torch"),
                              planner=self._planner, replan=self.replan)

    def _first_plan(self, model: nn.Module, call: FlatCall) -> Plan:
        """The training step of the first call, in training mode whatever the model's mode: its
        layouts are the ones training runs in. A call without a loss gets its forward program."""
        with _in_training_mode(model):
            try:
                return self._plan(model, call, STEP, {}, {})
            except NoLossError:
                pass
        warnings.warn("the first call's output holds no loss, so the parameters' layouts are chosen for its forward "
                      "program alone; training steps are planned around them (make the first call a training "
                      "call to lay the parameters out for training)", stacklevel=user_stacklevel())
        return self._plan(model, call, FORWARD, {}, {})

    def _planner(self, kind: str, model: nn.Module, call: FlatCall, pins: dict, shapes: dict) -> tuple[Plan, str]:
        """ParallelModule's planner: every rank asks, rank 0 plans, every rank gets the plan."""
        plan = _planned_on_rank0(lambda: self._plan(model, call, kind, pins, shapes))
        return plan, plan.emit("torch")

    def _plan(self, model: nn.Module, call: FlatCall, kind: str, pins: dict, shapes: dict) -> Plan:
        from autopar.api import plan_program
        from autopar.planning.request import resolve

        args, kwargs = call.rebuild(call.tensors)
        program = capture(model, args, kwargs=kwargs, loss_fn=self.loss_fn, training_step=kind == STEP,
                          global_shapes=shapes)
        request = resolve(self.mesh, self.hardware, pin=pins)
        return plan_program(program, request, model, args, loss_fn=self.loss_fn, passes=self.passes)


def _planned_on_rank0(make_plan: Callable[[], Plan]) -> Plan:
    """Rank 0's plan on every rank; where planning fails, every rank raises its error."""
    message: list = [None]
    if dist.get_rank() == 0:
        try:
            message = [("plan", make_plan().to_json())]
        except Exception as exc:
            dist.broadcast_object_list([("error", type(exc).__name__, str(exc))], src=0)
            raise
    dist.broadcast_object_list(message, src=0)
    if message[0][0] == "error":
        _, kind, text = message[0]
        error = getattr(errors, kind, None)
        raise (error if isinstance(error, type) and issubclass(error, AutoparError) else AutoparError)(
            f"planning failed on rank 0: {text}")
    return Plan.from_json(message[0][1])


@contextlib.contextmanager
def _in_training_mode(model: nn.Module):
    """The model as ``model.train()`` leaves it, where it is in evaluation mode; each module's
    own mode afterwards (a model in training mode is left as it is: a submodule kept in eval
    mode, a frozen BatchNorm, stays so)."""
    if model.training:
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def check_plan_is_for(plan: Plan, model: nn.Module, *args, loss_fn: Optional[Callable] = None, **kwargs) -> None:
    """Refuse a plan of another computation before it runs: one made for another forward, or
    for inputs of other shapes, has the same parameters but would compute something else."""
    program = capture(model, args, kwargs=kwargs, loss_fn=loss_fn, training_step=plan.graph.kind == STEP)
    fingerprint = fingerprint_of(program)
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

    def forward(self, *args, **kwargs):
        return self._runner(self.model, *args, **kwargs)

    def no_sync(self):
        """DDP's ``no_sync``: backward passes of calls inside keep local gradients; the first
        backward outside syncs their sum once."""
        return self._runner.no_sync()

    @property
    def plan(self) -> Optional[Plan]:
        return self._runner.plan


def autoparallelize(model=None, *, mesh, hardware: str = DEFAULT_HARDWARE, plan: Optional[Plan] = None,
                    device: Optional[str] = None, passes: Sequence = (), loss_fn: Optional[Callable] = None,
                    replan: bool = True):
    """Use on an instance (returns a wrapper module) or as a class decorator. ``passes``: extra
    passes for the plans (autopar.plan's ``passes``); ``loss_fn(output)``: picks the loss out of
    the model's output where autopar would not find it (autopar.plan); ``replan=False``: a call
    with other input shapes or arguments than the first is refused, not planned."""
    Mesh.parse(mesh)  # a malformed mesh fails here, at decoration time
    pipeline(passes)  # so does a misplaced pass

    def runner() -> _Runner:
        return _Runner(mesh, hardware, plan, device, tuple(passes), loss_fn, replan)

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

    def __call__(self, *args, **kwargs):
        return runner(self)(self, *args, **kwargs)

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
