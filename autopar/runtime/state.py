"""The model's training state as DTensors, as FSDP2 and tensor parallelism hold it.

``distribute`` replaces every parameter with an ``nn.Parameter`` holding a DTensor in its
plan's placements on the rank mesh's DeviceMesh (and every buffer with a DTensor), so torch's
optimizers keep sharded state, ``clip_grad_norm_`` returns the global norm, and state dicts
and ``torch.distributed.checkpoint`` see each tensor's layout. The emitted programs compute on
the local blocks (``local``); their gradients come back as DTensors (``as_gradient``).

The parameters are new objects: an optimizer built on the model before ``distribute`` would
step the old ones, which no longer receive gradients. Such an optimizer is refused at its
first step, naming the parameters.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook

from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Spec
from autopar.runtime.rank_mesh import RankMesh, local_shard

# id -> parameter autopar replaced by its DTensor (the value confirms the id is still that object)
_REPLACED: "weakref.WeakValueDictionary[int, nn.Parameter]" = weakref.WeakValueDictionary()
_REPLACED_NAMES: dict[int, str] = {}


def distribute(model: nn.Module, params: dict, buffers: dict, mesh: Mesh, rank_mesh: RankMesh) -> None:
    """Each parameter (``params``: name -> Spec) and buffer (``buffers``: name -> Spec) of
    ``model``, now a whole tensor, becomes a DTensor holding this rank's block. A parameter
    shared under several names (tied weights) stays shared."""
    with torch.no_grad():
        for fqn, spec in params.items():
            old = model.get_parameter(fqn)
            new = nn.Parameter(_distributed(old.detach(), spec, mesh, rank_mesh), requires_grad=old.requires_grad)
            for owner, name in _places_of(model, old):
                setattr(owner, name, new)
            _REPLACED[id(old)] = old
            _REPLACED_NAMES[id(old)] = fqn
        for fqn, spec in buffers.items():
            owner, _, name = fqn.rpartition(".")
            module = model.get_submodule(owner)
            module._buffers[name] = _distributed(module._buffers[name], spec, mesh, rank_mesh)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's block of a DTensor (sharing its storage); another tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def as_gradient(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """This rank's block of ``param``'s gradient as the DTensor autograd accumulates into ``.grad``."""
    if not isinstance(param, DTensor):
        return grad
    return DTensor.from_local(grad, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank calls it); another tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _distributed(full: torch.Tensor, spec: Spec, mesh: Mesh, rank_mesh: RankMesh) -> DTensor:
    block = local_shard(full, spec, mesh, rank_mesh.coords).to(rank_mesh.device)
    return DTensor.from_local(block, rank_mesh.device_mesh, spec.to_dtensor(), run_check=False, shape=full.shape,
                              stride=contiguous_strides(full.shape))


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _places_of(model: nn.Module, param: nn.Parameter) -> list[tuple[nn.Module, str]]:
    """Every (module, attribute) that holds ``param``."""
    return [(module, name) for module in model.modules() for name, p in module._parameters.items() if p is param]


def _refuse_replaced_parameters(optimizer, args, kwargs) -> None:
    if not _REPLACED:
        return
    stale = [_REPLACED_NAMES[id(p)] for group in optimizer.param_groups for p in group["params"]
             if _REPLACED.get(id(p)) is p]
    if stale:
        raise AutoparError(f"this {type(optimizer).__name__} was built on parameters that autopar has since replaced "
                           f"by their sharded DTensors ({', '.join(stale[:4])}{', ...' if len(stale) > 4 else ''}), "
                           f"so it would step tensors that get no gradient: build the optimizer after the model's "
                           f"first call, or shard it first with autopar.prepare(model, *example_inputs) (or "
                           f"autoparallelize(..., example_inputs=...))")


register_optimizer_step_pre_hook(_refuse_replaced_parameters)
