"""Offloaded parameters at run time: host chunks, and the moves the emitted programs call.

A ``ChunkStore`` holds one flat host buffer per chunk of the plan (autopar.ir.offload); each
offloaded parameter's block is a view of its chunk, so the DTensor the optimizer steps lives in
host memory and the host's copy is always the current one. The programs call ``fetch`` and
``evict`` where the plan put them and read a parameter with ``param``, a view of its chunk's
device copy. On a GPU a fetch is an asynchronous copy from pinned memory on a side stream, and
``param`` makes the compute stream wait for it; on CPU processes "device" and "host" are both
CPU memory and a fetch is a plain copy into a separate buffer, so the moves and their bytes are
real there too. Gradients go to the host when backward hands them over (``to_host``).

The store counts the bytes of chunks on the device (``device_bytes``, its ``peak``), which the
plan predicts per statement (``Offload.device_bytes``).
"""
from __future__ import annotations

import math
import weakref

import torch

from autopar.ir.offload import Offload


class ChunkStore:
    def __init__(self, offload: Offload, device: torch.device):
        self.offload, self.device = offload, device
        self.pinned = device.type == "cuda"  # copies from pinned memory run asynchronously
        self.host = {c.index: torch.zeros(c.capacity, dtype=getattr(torch, c.dtype), pin_memory=self.pinned)
                     for c in offload.chunks}
        self.slices = {name: (c.index, offset, numel) for c in offload.chunks
                       for name, offset, numel in zip(c.params, c.offsets, c.numels)}
        self.on_device: dict[int, torch.Tensor] = {}
        self.ready: dict[int, object] = {}  # chunk -> the CUDA event its copy records
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.device_bytes = self.peak = 0
        self.fetched_bytes = 0
        self.moved: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # the gradients to_host made

    def host_block(self, name: str, shape) -> "torch.Tensor | None":
        """The host view that holds parameter ``name``'s block of ``shape`` (None: not offloaded)."""
        if name not in self.slices:
            return None
        chunk, offset, numel = self.slices[name]
        if math.prod(shape) != numel:
            raise ValueError(f"parameter {name!r}: a block of shape {list(shape)}, the plan packed {numel} elements")
        return self.host[chunk][offset:offset + numel].view(shape)

    def begin_step(self) -> None:
        """Forward starts with no chunk on the device: the optimizer has stepped the host copies."""
        for chunk in list(self.on_device):
            self.evict(chunk)

    def fetch(self, chunk: int) -> None:
        source = self.host[chunk]
        if chunk in self.on_device:
            self.evict(chunk)
        copy = torch.empty(source.shape, dtype=source.dtype, device=self.device)
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the buffer's allocation
            with torch.cuda.stream(self.stream):
                copy.copy_(source, non_blocking=True)
                self.ready[chunk] = torch.cuda.Event()
                self.ready[chunk].record(self.stream)
        else:
            copy.copy_(source)
        self.on_device[chunk] = copy
        nbytes = copy.numel() * copy.element_size()
        self.device_bytes += nbytes
        self.fetched_bytes += nbytes
        self.peak = max(self.peak, self.device_bytes)

    def evict(self, chunk: int) -> None:
        """Drop the device copy (the host's is current: parameters do not change during a step)."""
        copy = self.on_device.pop(chunk, None)
        if copy is not None:
            self.device_bytes -= copy.numel() * copy.element_size()
        self.ready.pop(chunk, None)

    def param(self, name: str, shape) -> torch.Tensor:
        """Parameter ``name``'s block, a view of its chunk's device copy."""
        chunk, offset, numel = self.slices[name]
        copy = self.on_device.get(chunk)
        if copy is None:
            raise RuntimeError(f"parameter {name!r} is read while its chunk {chunk} is not on the device: the plan's "
                               f"moves and its program disagree (a program edited by hand?); re-emit the plan")
        event = self.ready.pop(chunk, None)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
        return copy[offset:offset + numel].view(shape)

    def on_host(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` as it is where the program moved it to host memory already, else its host copy."""
        return grad if self.moved.get(id(grad)) is grad else self.to_host(grad)

    def to_host(self, grad: torch.Tensor) -> torch.Tensor:
        """A gradient of an offloaded parameter, copied to host memory beside its parameter."""
        host = torch.empty(grad.shape, dtype=grad.dtype, pin_memory=self.pinned)
        host.copy_(grad)
        self.moved[id(host)] = host
        return host
