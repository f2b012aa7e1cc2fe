"""A pipeline's stage state in host memory at run time (autopar.ir.pipeline.StageOffload).

Every parameter a rank holds is a DTensor whose block lives in host memory (pinned on a GPU),
so its gradient and the optimizer's state are made there too and the optimizer steps the host
copies. The stage runner (autopar.runtime.stage_runner) brings the parameters an action reads
up with ``up`` and gives them back with ``release`` when the action ends; gradients go down with
``down`` as each W makes them. The copies are blocking, on the compute stream: the planner
prices them inside the actions (autopar.planning.stage_offload). On CPU processes "device" and
"host" are both CPU memory and every move is still a real copy, so the bytes the plan predicts
are the bytes moved.

A value forward saves for backward may view a parameter's device copy (a transposed weight that
the input gradient reads): kept as it is, it would hold that copy from F to I. ``detach_views``
swaps each such value for how it views its parameter, and ``reattach`` makes the same view of
the copy the next action brings up (a fresh contiguous copy of the same block: same layout).
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class _View(NamedTuple):
    """A saved value that viewed the device copy of the action's ``param``-th parameter."""
    param: int
    size: tuple
    stride: tuple
    offset: int


class HostStageState:
    def __init__(self, device: torch.device):
        self.device = device
        self.pinned = device.type == "cuda"  # page-locked: the copies up run at the link's speed
        self.device_bytes = self.peak_bytes = 0  # parameter copies (and gradient sums) up now, and at most
        self.up_bytes = self.down_bytes = 0  # moved since the last reset_counters

    def host_block(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """Host memory for a parameter's block."""
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=self.pinned)

    def up(self, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
        """A device copy of each host block, in a fresh buffer."""
        copies = [_copy(b, self.device) for b in blocks]
        moved = _nbytes(copies)
        self.device_bytes += moved
        self.up_bytes += moved
        self.peak_bytes = max(self.peak_bytes, self.device_bytes)
        return copies

    def release(self, copies: list[torch.Tensor]) -> None:
        """The action that read ``copies`` ended: nothing of autopar's holds them now."""
        self.device_bytes -= _nbytes(copies)

    def down(self, gradients: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each gradient, copied to host memory."""
        moved = {name: _copy(g, torch.device("cpu"), self.pinned) for name, g in gradients.items()}
        self.down_bytes += _nbytes(list(moved.values()))
        return moved

    def reset_counters(self) -> None:
        self.peak_bytes = self.device_bytes
        self.up_bytes = self.down_bytes = 0


def detach_views(values: list, copies: list[torch.Tensor]) -> list:
    """``values`` with each tensor that views one of ``copies`` replaced by how it views it."""
    owner = {c.untyped_storage().data_ptr(): k for k, c in enumerate(copies)}
    out = []
    for v in values:
        k = owner.get(v.untyped_storage().data_ptr()) if isinstance(v, torch.Tensor) else None
        out.append(v if k is None else _View(k, tuple(v.shape), v.stride(), v.storage_offset()))
    return out


def reattach(values: list, copies: list[torch.Tensor]) -> list:
    """``values``, in place (a program frees each value it clears from the list), with each view
    ``detach_views`` recorded made again, of ``copies``."""
    for i, v in enumerate(values):
        if isinstance(v, _View):
            values[i] = copies[v.param].as_strided(v.size, v.stride, v.offset)
    return values


def _copy(tensor: torch.Tensor, device: torch.device, pinned: bool = False) -> torch.Tensor:
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device=device, pin_memory=pinned)
    out.copy_(tensor)
    return out


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
