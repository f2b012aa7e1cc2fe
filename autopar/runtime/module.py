"""Run an emitted program as an ordinary module on every rank.

``ParallelModule(model, plan, rank_mesh, source)`` shards the model's parameters in
place (the same ``nn.Parameter`` objects now hold local blocks, so optimizers
made earlier still work) and runs the plan's programs (``source``: the plan emitted
for torch) as autograd does: calling the module runs the forward program and keeps
what it saved for backward; ``loss.backward()`` runs the backward program, seeded
with the loss's incoming gradient, its gradient collectives included (deferred under
``no_sync()``), and hands each parameter its gradient. Under ``torch.no_grad()``
nothing is kept.
"""
from __future__ import annotations

import contextlib
import types

import torch
from torch import nn

from autopar.errors import AutoparError, PlanMismatchError
from autopar.ir.plan import Plan
from autopar.runtime.rank_mesh import RankMesh, local_shard


def load_program(source: str, name: str = "autopar_generated") -> types.ModuleType:
    """The emitted torch program as a module with ``forward`` and ``backward``."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


class _Step(torch.autograd.Function):
    """The plan's forward program now, its backward program when autograd reaches the loss."""

    @staticmethod
    def forward(ctx, parallel: "ParallelModule", args: list, *params):
        loss, saved = parallel.program.forward(parallel.rt, *args)
        # as DDP: whether this step's backward syncs is decided when its forward runs
        ctx.parallel, ctx.args, ctx.saved, ctx.sync = parallel, args, saved, parallel.require_gradient_sync
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.saved is None:
            raise RuntimeError("autopar's backward program ran for this loss already, and it keeps nothing for a "
                               "second run (retain_graph is not supported): compute the loss again")
        saved, ctx.saved = ctx.saved, None  # the program frees each saved value after its last use
        parallel = ctx.parallel
        with torch.no_grad():
            grads = parallel.program.backward(parallel.rt, *ctx.args, saved, grad_loss, ctx.sync, parallel.unsynced)
        ctx.args = None
        if not ctx.sync:  # local gradients, before any collective: kept for the next synced backward
            for fqn, grad in grads.items():
                parallel.unsynced[fqn] = grad if fqn not in parallel.unsynced else parallel.unsynced[fqn] + grad
            return (None, None) + (None,) * len(parallel.grad_fqns)
        return (None, None) + tuple(grads.get(fqn) for fqn in parallel.grad_fqns)


class ParallelModule(nn.Module):
    def __init__(self, model: nn.Module, plan: Plan, rank_mesh: RankMesh, source: str):
        super().__init__()
        check_plan_matches(plan, model)
        self.model = model
        self.plan = plan
        self.rt = rank_mesh
        self.source = source
        self.program = load_program(self.source, f"autopar_plan_{plan.hash}")
        graph = plan.graph
        self.grad_fqns = tuple(dict.fromkeys(graph.grads.values()))  # the parameters backward gives gradients
        self.require_gradient_sync = True  # False inside no_sync()
        self.unsynced: dict = {}  # parameter -> local gradient summed over the micro-batches under no_sync()
        self._placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        with torch.no_grad():
            for ph, fqn in list(graph.params.items()) + list(graph.buffers.items()):
                tensor = model.get_parameter(fqn) if ph in graph.params else model.get_buffer(fqn)
                tensor.data = local_shard(tensor.data, plan.out_spec(ph), plan.mesh, rank_mesh.coords).to(
                    rank_mesh.device)

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

    def forward(self, *inputs):
        # autograd sees _Step alone (it runs the programs with grad mode off), whose inputs are the
        # parameters that get gradients
        args = self.arguments(inputs)
        return _Step.apply(self, args, *(self.model.get_parameter(fqn) for fqn in self.grad_fqns))

    def arguments(self, inputs) -> list:
        """The programs' arguments for a call with ``inputs``: parameters, buffers and this rank's
        block of each input, in the plan's placeholder order (refused where the plan does not fit)."""
        graph, plan = self.plan.graph, self.plan
        if len(inputs) != len(graph.inputs):
            raise TypeError(f"the plan was made for {len(graph.inputs)} inputs, got {len(inputs)}")
        _check_inputs_fit(plan, inputs)
        _check_mode(plan, self.model)
        user = dict(zip(graph.inputs, inputs))
        args = []
        for node in self._placeholders:
            if node.name in graph.params:
                args.append(self.model.get_parameter(graph.params[node.name]).detach())
            elif node.name in graph.buffers:
                args.append(self.model.get_buffer(graph.buffers[node.name]))
            else:
                value = user[node.name]
                if isinstance(value, torch.Tensor):
                    value = local_shard(value.to(self.rt.device), plan.out_spec(node.name), plan.mesh,
                                        self.rt.coords)
                args.append(value)
        return args


def _check_mode(plan: Plan, model: nn.Module) -> None:
    if model.training != plan.graph.training:
        mode = "training" if plan.graph.training else "evaluation"
        raise AutoparError(f"plan {plan.hash} was captured in {mode} mode and the model is now in "
                           f"{'training' if model.training else 'evaluation'} mode: autopar does not run "
                           f"an evaluation program yet (dropout and the like would run as in {mode}); set the "
                           f"mode back, or evaluate the eager model")


def _check_inputs_fit(plan: Plan, inputs) -> None:
    """Refuse inputs of other shapes or dtypes than the plan's: a plan fixes them (a loss's mean
    divides by the planned count, views reshape to the planned sizes), so running it on others
    would compute something else."""
    graph = plan.graph
    names = graph.input_names or tuple(f"input {i}" for i in range(len(graph.inputs)))
    for name, ph, value in zip(names, graph.inputs, inputs):
        planned = graph.node(ph).outputs[0]
        if not isinstance(value, torch.Tensor) or planned is None:
            continue
        given = (list(value.shape), str(value.dtype).removeprefix("torch."))
        if given != (list(planned.shape), planned.dtype):
            raise PlanMismatchError(
                f"input {name!r} has shape {given[0]} and dtype {given[1]}, but plan {plan.hash} was made for shape "
                f"{list(planned.shape)} and dtype {planned.dtype}: a plan fixes its inputs' shapes; plan again with "
                f"inputs of this shape (autopar.plan, or a new autoparallelize wrapper)")


def check_plan_matches(plan: Plan, model: nn.Module) -> None:
    """Refuse a plan made for another model: parameter names and global shapes must agree."""
    named = dict(model.named_parameters())
    named_buffers = dict(model.named_buffers())
    for ph, fqn in plan.graph.params.items():
        fqn_local = fqn
        shape = plan.graph.node(ph).outputs[0].shape
        p = named.get(fqn_local)
        if p is None or tuple(p.shape) != tuple(shape):
            raise PlanMismatchError(
                f"plan {plan.hash} (graph {plan.fingerprint}) expects parameter {fqn_local!r} of shape {list(shape)}, "
                f"but the model has {'none' if p is None else list(p.shape)}; re-plan this model with autopar.plan")
    for ph, fqn in plan.graph.buffers.items():
        if fqn not in named_buffers:
            raise PlanMismatchError(f"plan {plan.hash} expects buffer {fqn!r}, which the model lacks; re-plan it")
