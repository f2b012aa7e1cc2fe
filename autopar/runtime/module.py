"""Run an emitted program as an ordinary module on every rank.

``ParallelModule(model, plan, rank_mesh, source)`` shards the model's parameters in
place (the same ``nn.Parameter`` objects now hold local blocks, so optimizers
made earlier still work) and runs the plan's step (``source``: the plan emitted for torch) on each call.

The emitted program is the joint forward+backward graph, so the call computes
the loss and the local gradients together; ``loss.backward()`` then hands those
gradients to autograd, scaled by the incoming gradient. (Splitting the joint
graph into a forward and a backward half, with saved activations, belongs to the
recomputation work.)
"""
from __future__ import annotations

import types

import torch
from torch import nn

from autopar.errors import PlanMismatchError
from autopar.ir.plan import Plan
from autopar.runtime.rank_mesh import RankMesh, local_shard


def load_step(source: str, name: str = "autopar_generated"):
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module.step


class _LossWithGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss, grads, *params):
        ctx.grads = grads
        return loss.detach().clone()

    @staticmethod
    def backward(ctx, grad_loss):
        return (None, None) + tuple(None if g is None else g * grad_loss for g in ctx.grads)


class ParallelModule(nn.Module):
    def __init__(self, model: nn.Module, plan: Plan, rank_mesh: RankMesh, source: str):
        super().__init__()
        check_plan_matches(plan, model)
        self.model = model
        self.plan = plan
        self.rt = rank_mesh
        self.source = source
        self._step = load_step(self.source, f"autopar_plan_{plan.hash}")
        graph = plan.graph
        self._placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        with torch.no_grad():
            for ph, fqn in list(graph.params.items()) + list(graph.buffers.items()):
                tensor = model.get_parameter(fqn) if ph in graph.params else model.get_buffer(fqn)
                tensor.data = local_shard(tensor.data, plan.out_spec(ph), plan.mesh, rank_mesh.coords).to(
                    rank_mesh.device)

    def forward(self, *inputs):
        graph, plan = self.plan.graph, self.plan
        if len(inputs) != len(graph.inputs):
            raise TypeError(f"the plan was made for {len(graph.inputs)} inputs, got {len(inputs)}")
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
        with torch.no_grad():
            loss, grads = self._step(self.rt, *args)
        params = [self.model.get_parameter(fqn) for fqn in grads]
        return _LossWithGradients.apply(loss, tuple(grads.values()), *params)


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
