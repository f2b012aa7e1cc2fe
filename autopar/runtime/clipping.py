"""Gradient clipping by the whole model's norm, where the model is split over pipeline stages.

A rank of a pipelined model holds its stages' parameters alone (DTensors on its stage's mesh;
the others are dropped), so torch's ``clip_grad_norm_`` on
``model.parameters()`` would see one stage's gradients and return that stage's norm. The norm
eager computes is the whole model's: ``(Σ_stages ‖g_s‖_p^p)^(1/p)`` (the max for p = ∞), each
stage's own norm taken over its mesh first (DTensor's reductions), then combined over the
pipeline group, as torchtitan does for its pipelines. A tied weight's copies all carry the
summed gradient (autopar.runtime.stage_state.TiedCopies), so only the copy on the rank that holds
its first name counts.

``clip_grad_norm_`` takes torch's signature. Once a pipelined model exists, torch's own
``torch.nn.utils.clip_grad_norm_`` routes parameters of a pipelined model here, so a script
written for eager gets the whole model's norm too; a name imported from torch before autopar
built the pipelined model (``from torch.nn.utils import clip_grad_norm_`` at the top of a
script) is torch's own function and would not: call ``autopar.clip_grad_norm_`` there.
"""
from __future__ import annotations

import functools
import math
import weakref

import torch
import torch.distributed as dist

from autopar.errors import AutoparError

# id of a parameter -> the process group of its pipeline (the ranks holding the other stages);
# by id, as tensors compare elementwise, and dropped with the parameter
_PIPELINE_GROUPS: dict[int, object] = {}
# ids of the copies of a tied weight whose gradient another rank's copy counts
_COUNTED_ELSEWHERE: set[int] = set()
# ids of the parameters of a model whose .grad K-FAC preconditions in its step
_PRECONDITIONED: set[int] = set()


def register_pipelined(params, group, counted_elsewhere=(), preconditioned: bool = False) -> None:
    """Mark ``params`` as one rank's share of a pipelined model whose stages ``group`` joins;
    ``preconditioned``: its step leaves K-FAC's preconditioned gradients in ``.grad``."""
    for p in params:
        _PIPELINE_GROUPS[id(p)] = group
        weakref.finalize(p, _PIPELINE_GROUPS.pop, id(p), None)
        if preconditioned:
            _PRECONDITIONED.add(id(p))
            weakref.finalize(p, _PRECONDITIONED.discard, id(p))
    for p in counted_elsewhere:
        _COUNTED_ELSEWHERE.add(id(p))
        weakref.finalize(p, _COUNTED_ELSEWHERE.discard, id(p))
    _route_torch_clipping()


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_, with the whole model's norm where ``parameters`` are a
    pipelined model's: scales every gradient by ``min(1, max_norm / (norm + 1e-6))`` and returns
    the norm, the same on every rank (as torch's: a replicated DTensor where the parameters are
    DTensors, so ``norm.full_tensor()`` reads it as on the flat runtime)."""
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    if any(id(p) in _PRECONDITIONED for p in params):
        raise AutoparError("clip_grad_norm_ on a model trained by autopar.KFAC: its .grad holds K-FAC's "
                           "preconditioned gradients, whose step K-FAC bounds by its own KL clip, measured before "
                           "any clipping; bound the step with autopar.KFAC(kl_clip=...) instead")
    with_grad = [p for p in params if p.grad is not None]
    counted = [p.grad for p in with_grad if id(p) not in _COUNTED_ELSEWHERE]
    norm_type = float(norm_type)
    total = _whole(torch.nn.utils.get_total_norm(counted, norm_type, False, foreach))
    groups = {_PIPELINE_GROUPS.get(id(p)) for p in params} - {None}
    if len(groups) > 1:
        raise ValueError("clip_grad_norm_ was given parameters of several pipelined models: clip each model's alone")
    if groups:
        total = _across_stages(total, norm_type, groups.pop())
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, so it cannot be "
                           f"clipped; set error_if_nonfinite=False to clip anyway")
    torch.nn.utils.clip_grads_with_norm_(with_grad, max_norm, total, foreach)
    return _as_parameters_are(total, params)


def _whole(norm: torch.Tensor) -> torch.Tensor:
    """A stage's norm over its mesh: DTensor gradients give a DTensor, reduced here."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _as_parameters_are(norm: torch.Tensor, params: list) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Replicate

    mesh = next((p.device_mesh for p in params if isinstance(p, DTensor)), None)
    return norm if mesh is None else DTensor.from_local(norm, mesh, [Replicate()] * mesh.ndim, run_check=False)


def _across_stages(norm: torch.Tensor, norm_type: float, group) -> torch.Tensor:
    if math.isinf(norm_type):
        total = norm.clone()
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        return total
    total = norm.double() ** norm_type  # in float64: a sum of p-th powers over stages
    dist.all_reduce(total, group=group)
    return (total ** (1.0 / norm_type)).to(norm.dtype)


def _route_torch_clipping() -> None:
    """torch.nn.utils.clip_grad_norm_ (and its module's name for it) send a pipelined model's
    parameters to clip_grad_norm_; any other call is torch's own, unchanged."""
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_grad

    original = clip_grad.clip_grad_norm_
    if getattr(original, "_autopar_routed", False):
        return

    @functools.wraps(original)
    def routed(parameters, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if any(id(p) in _PIPELINE_GROUPS for p in params):
            return clip_grad_norm_(params, *args, **kwargs)
        return original(params, *args, **kwargs)

    routed._autopar_routed = True
    clip_grad.clip_grad_norm_ = nn_utils.clip_grad_norm_ = routed
