"""The logical meshes worth trying for a device count: ``mesh=64`` or ``mesh="auto"``.

Devices fill nodes in mesh order with the last axis innermost (autopar.cost_models),
so a 2-D mesh ``(dp=n/t, tp=t)`` respects node boundaries when each ``tp`` group
lies inside one node (t divides the devices per node) or spans whole nodes (t is
a multiple of it). The candidates are the 1-D mesh and every such factorisation, and,
past one node, each of those under a pipeline axis ``pp`` whose stages hold whole nodes
(Megatron-LM's 3-D layouts: the pipeline crosses the slow links, with activations only).
"""
from __future__ import annotations

from autopar.cost_models.hardware import Hardware
from autopar.errors import MeshError
from autopar.ir.mesh import Mesh

PP = "pp"  # the pipeline axis


def candidate_meshes(spec, hardware: Hardware, *, pipelines: bool = True) -> list[Mesh]:
    """``spec`` as given (a Mesh, dict or "dp=2,tp=2") is the one candidate, a list of them the
    candidates; a device count or "auto" (the process group's size) gives every valid
    factorisation (with a pp axis too where ``pipelines``)."""
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise MeshError("mesh=[]: give at least one candidate mesh")
        return [Mesh.parse(m) for m in spec]
    if isinstance(spec, bool) or not (isinstance(spec, int) or spec == "auto"):
        return [Mesh.parse(spec)]
    devices = _world_size() if spec == "auto" else spec
    if devices < 1:
        raise MeshError(f"mesh={spec!r}: a device count must be positive")
    meshes = _sharded_meshes(devices, hardware.devices_per_node)
    for pp in range(2, devices + 1) if pipelines else ():
        if devices % pp == 0 and (devices // pp) % hardware.devices_per_node == 0:
            meshes += [Mesh(("pp",) + m.axis_names, (pp,) + m.shape)
                       for m in _sharded_meshes(devices // pp, hardware.devices_per_node)]
    return meshes


def _sharded_meshes(devices: int, per_node: int) -> list[Mesh]:
    """The 1-D mesh and every (dp, tp) whose tp groups respect node boundaries."""
    meshes = [Mesh.of(dp=devices)]
    for tp in range(2, devices):  # tp = devices is the 1-D mesh again under another name
        if devices % tp == 0 and (per_node % tp == 0 or tp % per_node == 0):
            meshes.append(Mesh.of(dp=devices // tp, tp=tp))
    return meshes


def _world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    raise MeshError("mesh='auto' takes the device count from the process group, and none is initialised; "
                    "pass the count instead (mesh=64) or launch under torchrun")


def split_mesh(mesh: Mesh) -> tuple[int, Mesh]:
    """(pp, the mesh of one stage's devices). pp must be the outermost axis: devices fill nodes
    with the last axis innermost, so each stage then holds a contiguous block of devices."""
    if mesh.axis_names[0] != PP:
        raise MeshError(f"mesh {mesh}: the pipeline axis 'pp' goes first (outermost), so that each stage's devices "
                        f"are neighbours; write it as pp={mesh.shape[mesh.axis_names.index(PP)]},...")
    inner = Mesh(mesh.axis_names[1:], mesh.shape[1:]) if mesh.ndim > 1 else Mesh.of(dp=1)
    return mesh.shape[0], inner


def has_pipeline(mesh: Mesh) -> bool:
    return PP in mesh.axis_names
