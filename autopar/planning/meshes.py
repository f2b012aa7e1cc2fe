"""The logical meshes worth trying for a device count: ``mesh=64`` or ``mesh="auto"``.

Devices fill nodes in mesh order with the last axis innermost (autopar.cost_models),
so a 2-D mesh ``(dp=n/t, tp=t)`` respects node boundaries when each ``tp`` group
lies inside one node (t divides the devices per node) or spans whole nodes (t is
a multiple of it). The candidates are the 1-D mesh and every such factorisation.
"""
from __future__ import annotations

from autopar.cost_models.hardware import Hardware
from autopar.errors import MeshError
from autopar.ir.mesh import Mesh


def candidate_meshes(spec, hardware: Hardware) -> list[Mesh]:
    """``spec`` as given (a Mesh, dict or "dp=2,tp=2") is the one candidate; a device count or
    "auto" (the process group's size) gives every valid factorisation."""
    if isinstance(spec, bool) or not (isinstance(spec, int) or spec == "auto"):
        return [Mesh.parse(spec)]
    devices = _world_size() if spec == "auto" else spec
    if devices < 1:
        raise MeshError(f"mesh={spec!r}: a device count must be positive")
    per_node = hardware.devices_per_node
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
