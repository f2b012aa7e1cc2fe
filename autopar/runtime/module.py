"""Run emitted programs as an ordinary module on every rank.

``ParallelModule(model, plan, rank_mesh, source)`` makes the model's parameters and buffers
DTensors in the plan's layouts (autopar.runtime.state: build the optimizer afterwards), and
runs the plan's programs (``source``: the plan emitted for torch) as the model would run:

- a call with gradients enabled runs a training step's forward program and keeps what it
  saved for backward; ``loss.backward()`` runs the backward program, seeded with the loss's
  incoming gradient, its gradient collectives included (deferred under ``no_sync()``), and
  hands each parameter its gradient;
- a call under ``torch.no_grad()`` runs a forward program alone, which keeps nothing (without
  a planner to make one, the training step's forward serves, dropping what it saved).

Each program was captured with the model's modules in the modes they are in now (train or
eval, submodule by submodule) and the same parameters frozen. A mixed-precision program holds
its casts and runs with autocast off (autopar.runtime.precision). Every call returns what the model
returns (autopar.runtime.program) and writes the buffers forward updates (BatchNorm's running
statistics) back. A call the loaded programs do not fit (other modes, input shapes or
structure) gets a program from ``planner``, planned with the parameters' layouts pinned;
without a planner it is refused.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from autopar.errors import AutoparError, NoLossError, PlanMismatchError
from autopar.ir.call import FlatCall, flatten_call
from autopar.ir.plan import Plan
from autopar.ir.program import FORWARD, STEP
from autopar.runtime.offload import ChunkStore, step_on_device
from autopar.runtime.precision import agree_on_overflow, autocast_off, check_autocast
from autopar.runtime.program import (
    RankProgram,
    batch_blocks,
    check_call_fits,
    check_local_batches,
    global_call,
    load_program,
    model_state,
    program_identity,
    program_key,
)
from autopar.runtime.rank_mesh import RankMesh
from autopar.runtime.replaced import adopt_replacements
from autopar.runtime.state import as_gradient, distribute

__all__ = ["ParallelModule", "load_program"]

# (kind, model, call, layouts) -> (plan, source): a new program for a call the loaded ones do not
# fit, with the parameters and buffers in ``layouts`` (name -> placements text)
Planner = Callable[[str, nn.Module, FlatCall, dict], tuple[Plan, str]]


class _Step(torch.autograd.Function):
    """A training step's forward program now, its backward program when autograd reaches the loss."""

    @staticmethod
    def forward(ctx, parallel: ParallelModule, program: RankProgram, args: list, results: dict, *params):
        # ``params``: the parameters that get gradients, in program.grad_fqns' order
        # autograd sees the loss alone; the other values and the buffers' new values, which need no
        # gradient, come back through ``results``
        with autocast_off(parallel.rt.device):
            loss, saved, results["values"], results["updates"] = program.forward(args)
        # as DDP: whether this step's backward syncs is decided when its forward runs
        ctx.parallel, ctx.program, ctx.args, ctx.saved, ctx.params = parallel, program, args, saved, params
        ctx.sync = parallel.require_gradient_sync
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.saved is None:
            raise RuntimeError("autopar's backward program ran for this loss already, and it keeps nothing for a "
                               "second run (retain_graph is not supported): compute the loss again")
        saved, ctx.saved = ctx.saved, None  # the program frees each saved value after its last use
        parallel, program = ctx.parallel, ctx.program
        unsynced = parallel.unsynced_for(program, ctx.sync)
        with torch.no_grad(), autocast_off(parallel.rt.device):
            grads = program.backward(ctx.args, saved, grad_loss, ctx.sync, unsynced)
            if ctx.sync and program.plan.graph.autocast == "float16":
                agree_on_overflow(list(grads.values()), parallel.rt.device)
        params, ctx.args, ctx.params = ctx.params, None, None
        if program.chunks is not None and ctx.sync:  # an offloaded parameter's gradient lives beside it
            grads = {fqn: program.chunks.on_host(g) if fqn in program.chunks.slices else g for fqn, g in grads.items()}
        none = (None,) * 4
        if not ctx.sync:  # local gradients, before any collective: kept for the next synced backward
            for fqn, grad in grads.items():
                unsynced[fqn] = grad if fqn not in unsynced else unsynced[fqn] + grad
            return none + (None,) * len(program.grad_fqns)
        return none + tuple(None if fqn not in grads else as_gradient(p, grads[fqn])
                            for fqn, p in zip(program.grad_fqns, params))


class ParallelModule(nn.Module):
    def __init__(self, model: nn.Module, plan: Plan, rank_mesh: RankMesh, source: str, *,
                 planner: Planner | None = None, replan: bool = True, local_inputs: bool = False,
                 init: Callable[[nn.Module], None] | None = None, compile: bool = False):
        """``local_inputs``: each rank passes its block of the batch (dim 0, split over the mesh's
        "dp" axes: autopar.ir.mesh.Mesh.data_parallel), not the whole batch. ``init``: how rank
        0 initializes a module of a model on the meta device (autopar.runtime.state.distribute).
        ``compile``: run every program through torch.compile (autopar.runtime.program.RankProgram)."""
        super().__init__()
        check_plan_matches(plan, model)
        agree_on_plan(rank_mesh, plan)
        self.model = model
        self.rt = rank_mesh
        self.planner, self.replan = planner, replan
        self.given = batch_blocks(plan.mesh) if local_inputs else None  # the layout of the call's tensors
        self.compile = compile
        # an offloading plan's parameters live in host chunks, their blocks views of them
        self.chunks = ChunkStore(plan.offload, rank_mesh.device) if plan.offload is not None else None
        first = RankProgram(plan, source, rank_mesh, compile, self.chunks)
        self.programs: dict[tuple, RankProgram] = {first.key: first}
        self.first = first
        graph = plan.graph
        params = {fqn: plan.out_spec(ph) for ph, fqn in graph.params.items()}
        buffers = {fqn: plan.out_spec(ph) for ph, fqn in graph.buffers.items()}
        # every later program is planned with the parameters and buffers where the first put them
        self.layouts = {fqn: spec.to_json() for fqn, spec in {**params, **buffers}.items()}
        self.require_gradient_sync = True  # False inside no_sync()
        self._lossless: set = set()  # step keys whose calls hold no loss: their forward programs serve them
        self.unsynced: dict = {}  # parameter -> local gradient summed over the micro-batches under no_sync()
        self._unsynced_program: tuple | None = None  # the program whose layouts those gradients are in
        distribute(model, params, buffers, plan.mesh, rank_mesh, init,
                   host=self.chunks.host_block if self.chunks is not None else None)
        adopt_replacements()  # an optimizer built before: the new parameters in place of the old
        if self.chunks is not None and plan.offload.optimizer.place == "device":
            step_on_device(self.chunks, model)

    @property
    def plan(self) -> Plan:
        """The first plan: the one that set the parameters' layouts."""
        return self.first.plan

    @contextlib.contextmanager
    def no_sync(self):
        """DDP's ``no_sync``: backward passes of steps whose forward runs inside keep their local
        gradients and run no gradient collective; the first backward outside syncs their sum
        once (``param.grad`` then holds the gradient of every micro-batch's loss). Until then
        the module holds them, not ``param.grad``: ``zero_grad()`` does not drop them."""
        before, self.require_gradient_sync = self.require_gradient_sync, False
        try:
            yield
        finally:
            self.require_gradient_sync = before

    def forward(self, *args, **kwargs):
        check_autocast(self.plan.graph.autocast, self.rt.device)
        call = flatten_call(args, kwargs)
        if self.given is not None:
            check_local_batches(call, self.rt)
        program = self.program_for(call if self.given is None else global_call(call, self.plan.mesh))
        if not program.agreed:  # the first run of a program: every rank must run the same one
            self.rt.agree("the plan and program they run", program_identity(program.plan, program.key))
            program.agreed = True
        if self.chunks is not None:
            self.chunks.check_parameters(self.model)
        params = dict(self.model.named_parameters())  # one walk of the modules, not one per parameter
        arguments = program.arguments(self.model, params, call, self.given)
        if program.is_step and torch.is_grad_enabled():
            # autograd sees _Step alone (it runs the programs with grad mode off), whose inputs are the
            # parameters that get gradients
            results: dict = {}
            loss = _Step.apply(self, program, arguments, results, *(params[fqn] for fqn in program.grad_fqns))
            values, updates = results["values"], results["updates"]
        else:
            with torch.no_grad(), autocast_off(self.rt.device):
                loss, _, values, updates = program.forward(arguments)
        program.write_buffers(self.model, updates)
        return program.output(loss, values)

    def program_for(self, call: FlatCall) -> RankProgram:
        """The program for this call: a training step's when gradients are enabled (a forward's
        where the call's output holds no loss), a forward's under no_grad; planned now where
        none is loaded."""
        state = model_state(self.model)
        step_key = program_key(STEP, state, call)
        if torch.is_grad_enabled() and step_key not in self._lossless:
            found = self.programs.get(step_key)
            if found is not None:
                return found
            try:
                return self._new_program(STEP, call)
            except NoLossError:  # as in eager: nothing to differentiate, the forward serves
                self._lossless.add(step_key)
        found = self.programs.get(program_key(FORWARD, state, call))
        if found is None and (self.planner is None or self.chunks is not None):
            found = self.programs.get(step_key)  # its forward, dropping what it saves for backward
        return found if found is not None else self._new_program(FORWARD, call)

    def _new_program(self, kind: str, call: FlatCall) -> RankProgram:
        known = {key[-1] for key in self.programs}
        if self.chunks is not None:
            check_call_fits(self.plan, call)
            raise PlanMismatchError(f"plan {self.plan.hash} offloads parameters to host memory, and autopar does not "
                                    f"plan a second program over the same chunks yet: call the model as the plan was "
                                    f"made (same modes, frozen parameters and input shapes)")
        if self.planner is None or (not self.replan and call.signature not in known):
            check_call_fits(self.plan, call)  # names the shape or structure that differs
            raise PlanMismatchError(self._no_program_message(kind))
        plan, source = self.planner(kind, self.model, call, dict(self.layouts))
        program = RankProgram(plan, source, self.rt, self.compile)
        self.programs[program.key] = program
        return program

    def _no_program_message(self, kind: str) -> str:
        wanted = "a training step" if kind == STEP else "a forward program"
        return (f"this call needs {wanted} for the model's current modes (train/eval, per module) and frozen "
                f"parameters, which plan {self.plan.hash} was not made for; run the model through "
                f"autopar.autoparallelize, which plans one, or call it as the plan was made")

    def unsynced_for(self, program: RankProgram, sync: bool) -> dict:
        """The gradients no_sync() left for ``program``'s backward: a program of other layouts
        cannot add them to its own."""
        if self.unsynced and self._unsynced_program != program.key:
            raise AutoparError("the micro-batches under no_sync() ran another program (other input shapes, or "
                               "another mode) than this backward's: their local gradients lie in other layouts; "
                               "accumulate micro-batches of one shape, or sync each one")
        if not sync:
            self._unsynced_program = program.key
        return self.unsynced


def agree_on_plan(rank_mesh: RankMesh, plan: Plan) -> None:
    """Every rank holds ``plan``, checked before placing the model's state: ranks holding
    different plans would place it with collectives that do not match, and the ones left
    unanswered would leave the process group unusable for whatever runs next."""
    rank_mesh.agree("the plan they load", f"plan {plan.hash}")


def check_plan_matches(plan: Plan, model: nn.Module) -> None:
    """Refuse a plan made for another model: parameter names and global shapes must agree."""
    named = dict(model.named_parameters(remove_duplicate=False))  # a pipeline's plan names each tied copy
    named_buffers = dict(model.named_buffers())
    for ph, fqn in plan.graph.params.items():
        shape = plan.graph.node(ph).outputs[0].shape
        p = named.get(fqn)
        if p is None or tuple(p.shape) != tuple(shape):
            raise PlanMismatchError(
                f"plan {plan.hash} (graph {plan.fingerprint}) expects parameter {fqn!r} of shape {list(shape)}, "
                f"but the model has {'none' if p is None else list(p.shape)}; re-plan this model with autopar.plan")
    for fqn in plan.graph.buffers.values():
        if fqn not in named_buffers:
            raise PlanMismatchError(f"plan {plan.hash} expects buffer {fqn!r}, which the model lacks; re-plan it")
