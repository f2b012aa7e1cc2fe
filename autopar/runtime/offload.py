"""Offloaded parameters at run time: host chunks, and the moves the emitted programs call.

A ``ChunkStore`` holds one flat host buffer per chunk of the plan (autopar.ir.offload); each
offloaded parameter's block is a view of its chunk, so the DTensor the optimizer steps lives in
host memory and the host's copy is always the current one. The programs call ``fetch`` and
``evict`` where the plan put them and read a parameter with ``param``, a view of its chunk's
device copy. On a GPU a fetch is an asynchronous copy from pinned memory on a side stream, and
``param`` makes the compute stream wait for it; on CPU processes "device" and "host" are both
CPU memory and a fetch is a plain copy into a separate buffer, so the moves and their bytes are
real there too. Gradients go to the host when backward hands them over (``to_host``).
Under ``compile=True`` each fetch and eviction is a graph break (the statements between them
compile, the moves run as written); reading a parameter from its chunk and a gradient's copy to
the host are operations of the graphs. Where the plan steps the offloaded state on the device,
``step_on_device`` streams it through the device chunk by chunk at the optimizer's step.

The store counts the bytes of chunks on the device (``device_bytes``, its ``peak``), which the
plan predicts per statement (``Offload.device_bytes``).
"""
from __future__ import annotations

import math
import warnings
import weakref

import torch
from torch.optim.adam import adam
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from autopar.errors import AutoparError
from autopar.ir.offload import Offload
from autopar.runtime.graph_breaks import methods_between_graphs
from autopar.runtime.state import local

# the moves the programs call: under compile=True, graph breaks, so the statements between the
# moves compile and the moves run as Python (their streams, events and byte counts)
_MOVES = ("begin_step", "fetch", "evict", "_wait_for")


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
        self.stepped: dict[int, str] = {}  # id of a parameter stepped on the device -> its name
        self.device_steps = 0  # chunks stepped on the device so far
        methods_between_graphs(ChunkStore, *_MOVES)

    def host_block(self, name: str, shape) -> torch.Tensor | None:
        """The host view that holds parameter ``name``'s block of ``shape`` (None: not offloaded)."""
        if name not in self.slices:
            return None
        chunk, offset, numel = self.slices[name]
        if math.prod(shape) != numel:
            raise ValueError(f"parameter {name!r}: a block of shape {list(shape)}, the plan packed {numel} elements")
        return self.host[chunk][offset:offset + numel].view(shape)

    def check_parameters(self, model) -> None:
        """Refuse a model whose offloaded parameters no longer live in their chunks (replaced, as
        ``load_state_dict(assign=True)`` or ``param.data = ...`` do): the programs read the chunks,
        and would compute with the old values."""
        for name, (chunk, _, _) in self.slices.items():
            block = local(model.get_parameter(name))
            if block.untyped_storage().data_ptr() != self.host[chunk].untyped_storage().data_ptr():
                raise AutoparError(f"parameter {name!r} is no longer the block autopar keeps in host memory (it was "
                                   f"replaced, e.g. by load_state_dict(assign=True) or by assigning .data), and the "
                                   f"plan's programs read it from there: load values in place (model.load_state_dict"
                                   f"(state_dict), torch.distributed.checkpoint) or copy_ into the parameter")

    def begin_step(self) -> None:
        """Forward starts with no chunk on the device: the optimizer has stepped the host copies."""
        for chunk in list(self.on_device):
            self.evict(chunk)

    def fetch(self, chunk: int) -> None:
        source = self.host[chunk]
        if chunk in self.on_device:
            self.evict(chunk)
        if self.stream is not None:
            copy = torch.empty(source.shape, dtype=source.dtype, device=self.device)
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the buffer's allocation
            with torch.cuda.stream(self.stream):
                copy.copy_(source, non_blocking=True)
                self.ready[chunk] = torch.cuda.Event()
                self.ready[chunk].record(self.stream)
        else:
            copy = _up(source, self.device)
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
        if chunk in self.ready:  # only on a GPU: a graph break at a chunk's first read, in a compiled program
            self._wait_for(chunk)
        return copy[offset:offset + numel].view(shape)

    def _wait_for(self, chunk: int) -> None:
        """The compute stream waits for chunk's copy to the device."""
        torch.cuda.current_stream(self.device).wait_event(self.ready.pop(chunk))

    def on_host(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` as it is where the program moved it to host memory already, else its host copy."""
        moved = self.moved.get(id(grad)) is grad or (grad.device.type == "cpu" and self.device.type != "cpu")
        return grad if moved else self.to_host(grad)

    def to_host(self, grad: torch.Tensor) -> torch.Tensor:
        """A gradient of an offloaded parameter, copied to host memory beside its parameter. In a
        compiled program, a copy the graph holds (so no graph break per gradient), into unpinned
        memory: on CPU processes ``on_host`` then copies it once more."""
        if torch.compiler.is_compiling():
            return grad.to("cpu", copy=True)
        host = torch.empty(grad.shape, dtype=grad.dtype, pin_memory=self.pinned)
        host.copy_(grad)
        self.moved[id(host)] = host
        return host


# ---- the optimizer step of offloaded state, streamed through the device ---------------------
# Where the plan steps offloaded state on the device (OptimizerChoice.place "device"), a hook on
# every optimizer's step runs torch's functional Adam over each chunk's parameters on the device
# (parameters, gradients and state copied up, stepped, copied back), then hides those
# parameters' gradients from the optimizer's own step, which so skips them, and gives them back
# after it. Other optimizers step the host copies themselves (correct, at the host's speed).
_DEVICE_STEPPED: weakref.WeakSet[ChunkStore] = weakref.WeakSet()
_HIDDEN: dict[int, list] = {}  # id(optimizer) -> (parameter, gradient) hidden during its step
_WARNED: set[int] = set()


def step_on_device(store: ChunkStore, model) -> None:
    """Have ``store``'s parameters (``model``'s, by name) stepped on the device."""
    store.stepped = {id(p): name for name, p in model.named_parameters() if name in store.slices}
    _DEVICE_STEPPED.add(store)


def _before_step(optimizer, args, kwargs) -> None:
    for store in list(_DEVICE_STEPPED):
        mine = [(group, p) for group in optimizer.param_groups for p in group["params"]
                if id(p) in store.stepped and p.grad is not None]
        if not mine:
            continue
        refusal = _unsupported(optimizer)
        if refusal is not None:
            _warn_once(optimizer, refusal)
            continue
        chunk_of = {id(p): store.slices[store.stepped[id(p)]][0] for _, p in mine}
        for chunk in sorted(set(chunk_of.values())):
            _step_chunk(store, optimizer, chunk, [(g, p) for g, p in mine if chunk_of[id(p)] == chunk])
        _HIDDEN.setdefault(id(optimizer), []).extend((p, p.grad) for _, p in mine)
        for _, p in mine:
            p.grad = None


def _after_step(optimizer, args, kwargs) -> None:
    for p, grad in _HIDDEN.pop(id(optimizer), ()):
        p.grad = grad


def _step_chunk(store: ChunkStore, optimizer, chunk: int, members: list) -> None:
    """One chunk's parameters stepped on the device, and the results copied back to the host."""
    params = _up(store.host[chunk], store.device)
    for group in {id(g): g for g, _ in members}.values():
        mine = [p for g, p in members if g is group]
        views, grads, avgs, squares, steps = [], [], [], [], []
        for p in mine:
            _, offset, numel = store.slices[store.stepped[id(p)]]
            views.append(params[offset:offset + numel].view(local(p).shape))
            state = _adam_state(optimizer, p)
            grads.append(_up(local(p.grad), store.device))
            avgs.append(_up(local(state["exp_avg"]), store.device))
            squares.append(_up(local(state["exp_avg_sq"]), store.device))
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        adam(views, grads, avgs, squares, [], steps, foreach=False, amsgrad=False, beta1=beta1,
                              beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                              maximize=False, decoupled_weight_decay=isinstance(optimizer, torch.optim.AdamW))
        for p, avg, square in zip(mine, avgs, squares):
            state = optimizer.state[p]
            local(state["exp_avg"]).copy_(avg)
            local(state["exp_avg_sq"]).copy_(square)
    store.host[chunk].copy_(params)
    store.device_steps += 1


def _adam_state(optimizer, p) -> dict:
    """``p``'s Adam state, made as torch's Adam makes it at a parameter's first step."""
    state = optimizer.state[p]
    if not state:
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return state


def _up(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of ``tensor`` in a fresh buffer on ``device`` (a real copy even where it is the CPU)."""
    copy = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
    copy.copy_(tensor)
    return copy


def _unsupported(optimizer) -> str | None:
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"{type(optimizer).__name__} is not torch's Adam or AdamW"
    for group in optimizer.param_groups:
        for option in ("amsgrad", "maximize", "capturable", "differentiable", "fused"):
            if group.get(option):
                return f"its {option}=True"
    return None


def _warn_once(optimizer, why: str) -> None:
    if id(optimizer) not in _WARNED:
        _WARNED.add(id(optimizer))
        warnings.warn(f"the plan steps offloaded parameters on the device, which autopar runs for torch's Adam and "
                      f"AdamW without amsgrad, maximize, capturable, differentiable or fused; {why}, so it steps "
                      f"them on the host (the same result, at the host's speed)", stacklevel=3)


register_optimizer_step_pre_hook(_before_step)
register_optimizer_step_post_hook(_after_step)
