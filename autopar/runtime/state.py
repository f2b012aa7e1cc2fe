"""The model's training state as DTensors, as FSDP2 and tensor parallelism hold it.

``distribute`` replaces every parameter with an ``nn.Parameter`` holding a DTensor in its
plan's placements on the rank mesh's DeviceMesh (and every buffer with a DTensor), so torch's
optimizers keep sharded state, ``clip_grad_norm_`` returns the global norm, and state dicts
and ``torch.distributed.checkpoint`` see each tensor's layout. The emitted programs compute on
the local blocks (``local``); their gradients come back as DTensors (``as_gradient``).

The parameters are new objects: the caller, once the model is sharded, has an optimizer built
before take them in place of the old ones (autopar.runtime.replaced.adopt_replacements).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Spec
from autopar.runtime.rank_mesh import RankMesh, local_shard
from autopar.runtime.replaced import remember_replaced


def distribute(model: nn.Module, params: dict, buffers: dict, mesh: Mesh, rank_mesh: RankMesh,
               init: Callable[[nn.Module], None] | None = None, own_copy: bool = False,
               host: Callable[[str, tuple], torch.Tensor] | None = None,
               holders: dict[str, frozenset[int]] | None = None) -> None:
    """Each parameter (``params``: name -> Spec) and buffer (``buffers``: name -> Spec) of
    ``model`` becomes a DTensor holding this rank's block, module by module. The values are
    rank 0's, as its model holds them: rank 0 sends each rank its block alone (a replicated
    tensor is broadcast), so no other rank receives a whole tensor, and the other ranks may
    hold the model on the meta device. Where rank 0's model is on the meta device too, every
    rank allocates its blocks and rank 0 fills them by running ``init`` on one module at a
    time made whole on it (so at most one module's tensors are ever whole, on rank 0 alone);
    without ``init`` the blocks are left uninitialized, for a state dict to be loaded into
    (torch's set_model_state_dict). A parameter shared under several names (tied weights) stays
    shared, and keeps its attributes. Every rank then takes rank 0's random states (CPU, and the
    device's): dropout masks are drawn alike on every rank. ``own_copy``: every rank takes its
    blocks from its own model, which holds the values (a pipeline's ranks each hold other
    tensors, so rank 0 sends none). ``host(name, shape)``: the host memory that holds an
    offloaded parameter's block (autopar.runtime.offload.ChunkStore.host_block), for the names
    it knows. ``holders``: the global ranks that hold each name (a pipeline's: the ranks of the
    stages that read it); the others take no block of it and leave it as it is. None: every rank
    holds every name."""
    source = "own" if own_copy else _rank0_source(model, init, rank_mesh)
    specs = {**params, **buffers}
    owners = _owners(model)
    done: set[int] = set()
    for path, module in model.named_modules():
        entries = [(name, t) for name, t in list(module._parameters.items()) + list(module._buffers.items())
                   if t is not None and _join(path, name) in specs and id(t) not in done]
        if not entries:
            continue
        if source == "init":
            _initialize_on_rank0(module, init, rank_mesh)
        for name, original in entries:
            done.add(id(original))
            fqn = _join(path, name)
            values = _tensor(module, name) if source != "none" else None
            block = _block(values, original, specs[fqn], mesh, rank_mesh, own=source == "own",
                           holders=None if holders is None else holders[fqn])
            if block is None:  # another stage's: rank 0's whole values (init's) are freed
                (module._buffers if name in module._buffers else module._parameters)[name] = original
                continue
            if host is not None:
                block = _in_host_memory(block, host(fqn, tuple(block._local_tensor.shape)))
            if name in module._buffers:
                module._buffers[name] = block
                continue
            new = nn.Parameter(block, requires_grad=original.requires_grad)
            done.add(id(new))  # under a tied weight's other names (a pipeline's copies), it is done too
            new.__dict__.update(original.__dict__)  # attributes users group parameters by
            for owner, attribute in owners[id(original)]:
                setattr(owner, attribute, new)
            remember_replaced(original, fqn, new)
    _share_random_state(rank_mesh)


def _rank0_source(model: nn.Module, init, rank_mesh: RankMesh) -> str:
    """Where the values come from, as rank 0 decides it for every rank: "values" (rank 0's
    model holds them), "init" (rank 0 runs ``init``) or "none" (uninitialized); a model that
    cannot be initialized so is refused on every rank before any allocates anything."""
    decision = [None]
    if rank_mesh.rank == 0:
        on_meta = any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
        source = "none" if on_meta and init is None else "init" if on_meta else "values"
        refusal = getattr(init, "refusal", lambda m: None)(model) if source == "init" else \
            _unloadable_buffers(model) if source == "none" else None
        decision = [(source, refusal)]
    dist.broadcast_object_list(decision, src=0)
    source, refusal = decision[0]
    if refusal is not None:
        raise AutoparError(refusal)
    return source


def _unloadable_buffers(model: nn.Module) -> str | None:
    """A meta model left uninitialized takes its values from a state dict, which holds no
    non-persistent buffer (a rotary embedding's inv_freq): those would stay garbage."""
    missing = [_join(path, name) for path, m in model.named_modules() for name in m._non_persistent_buffers_set
               if m._buffers.get(name) is not None and m._buffers[name].is_meta]
    if not missing:
        return None
    return (f"init=None leaves the meta model's tensors for a state dict to fill, and no state dict holds its "
            f"non-persistent buffers {', '.join(missing[:4])}: pass an init (the model's own, e.g. "
            f"model._init_weights) and load the state dict after it")


def _initialize_on_rank0(module: nn.Module, init, rank_mesh: RankMesh) -> None:
    """Rank 0 makes ``module``'s own tensors on the meta device whole and runs ``init`` on it;
    every rank learns whether that worked, so none waits for blocks that will not come."""
    failure = None
    own = [t for t in list(module._parameters.values()) + list(module._buffers.values()) if t is not None]
    if rank_mesh.rank == 0 and any(t.is_meta for t in own):
        try:
            module.to_empty(device=rank_mesh.device, recurse=False)
            init(module)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it before raising
            failure = f"{type(exc).__name__}: {exc}"
    status = [failure]
    dist.broadcast_object_list(status, src=0)
    if status[0] is not None:
        raise AutoparError(f"initializing {type(module).__name__} on rank 0 failed: {status[0]}")


def _owners(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """id of each parameter -> every (module, attribute) that holds it (tied weights: several)."""
    found: dict[int, list] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                found.setdefault(id(p), []).append((module, name))
    return found


def _tensor(module: nn.Module, name: str) -> torch.Tensor:
    return module._parameters[name] if name in module._parameters else module._buffers[name]


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _block(values: torch.Tensor | None, like: torch.Tensor, spec: Spec, mesh: Mesh, rank_mesh: RankMesh,
           own: bool = False, holders: frozenset[int] | None = None) -> DTensor | None:
    """The DTensor of this rank's block of a tensor shaped as ``like``, with the values of rank
    0's ``values`` (None on every rank: left uninitialized); None where this rank is not among
    ``holders`` (None: every rank holds it)."""
    mine = holders is None or rank_mesh.rank in holders
    block = torch.empty(spec.local_shape(like.shape, mesh), dtype=like.dtype, device=rank_mesh.device) \
        if mine else None
    if own:
        block.copy_(local_shard(values.detach(), spec, mesh, rank_mesh.coords))
    elif values is None:
        pass
    elif holders is None and spec.is_replicated():  # every rank's block is the whole tensor
        if rank_mesh.rank == 0:
            block.copy_(values.detach())
        dist.broadcast(block, src=0)
    elif rank_mesh.rank != 0:
        if mine:
            dist.recv(block, src=0)
    else:
        others = range(1, mesh.size) if holders is None else sorted(holders - {0})
        for rank in others:  # one block at a time: rank 0 holds the tensor and one block more
            dist.send(local_shard(values.detach(), spec, mesh, rank_mesh.coords_of(rank)).to(rank_mesh.device),
                      dst=rank)
        if mine:
            block.copy_(local_shard(values.detach(), spec, mesh, rank_mesh.coords))
    return None if block is None else as_dtensor(block, rank_mesh.device_mesh, spec.to_dtensor(), like.shape)


def _in_host_memory(block: DTensor, where: torch.Tensor | None) -> DTensor:
    """``block``'s DTensor with its values in the host memory ``where`` (None: as it is)."""
    if where is None:
        return block
    where.copy_(block._local_tensor)
    return DTensor(where, block._spec, requires_grad=False)


def _share_random_state(rank_mesh: RankMesh) -> None:
    """Rank 0's CPU random state, and its device's, on every rank (this overrides per-rank seeds)."""
    device = rank_mesh.device
    states = [(torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)
              if rank_mesh.rank == 0 else None]
    dist.broadcast_object_list(states, src=0)
    cpu, on_device = states[0]
    torch.set_rng_state(cpu)
    if on_device is not None:
        torch.cuda.set_rng_state(on_device, device)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's block of a DTensor (its own local tensor: ``to_local()`` without the autograd
    function around it, which costs more than the rest of reading a parameter for a call); another
    tensor as it is. Programs read it with autograd off."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def as_gradient(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """This rank's block of ``param``'s gradient as the DTensor autograd accumulates into ``.grad``."""
    if not isinstance(param, DTensor):
        return grad
    if grad.dtype == param.dtype and grad.is_contiguous():
        # the parameter's own spec (mesh, placements, global shape, contiguous strides as
        # as_dtensor made them, dtype): building the
        # DTensor directly, as FSDP2 does for its gradients, skips from_local's autograd function
        # and its checks, a tenth of a millisecond per parameter per step
        return DTensor(grad, param._spec, requires_grad=False)
    return as_dtensor(grad, param.device_mesh, param.placements, param.shape)


def as_dtensor(block: torch.Tensor, device_mesh, placements, shape) -> DTensor:
    """The DTensor of a contiguous tensor of ``shape`` of which ``block`` is this rank's block."""
    return DTensor.from_local(block, device_mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=_contiguous_strides(shape))


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank calls it); another tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
