"""Optimizers built before autopar replaced the model's parameters.

Sharding makes every parameter a new ``nn.Parameter`` holding a DTensor (autopar.runtime.state);
a pipeline rank drops the parameters of the stages it does not hold. A training script builds
its optimizer right after wrapping the model, before the first call shards it (as PyTorch's
tutorials, nanoGPT and Hugging Face do), so that optimizer holds the old parameters, which no
longer receive gradients. Once a model is sharded, ``adopt_replacements`` puts the new
parameters in their place in every optimizer's parameter groups, in place: the groups and
their options (weight decay, learning rate) stay, and so do learning-rate schedulers, which
read the same group dicts. An optimizer that already holds state for an old parameter (it
stepped before the model was sharded) would pair that state with another tensor: it is left
as it is and refused at its next step, naming the parameters.
"""
from __future__ import annotations

import gc
import weakref

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from autopar.errors import AutoparError

# id of a parameter autopar replaced -> (a weak reference to it, its name, a weak reference to
# the parameter in its place), while it lives
_REPLACED: dict[int, tuple[weakref.ref, str, weakref.ref]] = {}


def remember_replaced(original: nn.Parameter, fqn: str, new: nn.Parameter | None) -> None:
    """``new`` holds ``original``'s place; None: the model holds none on this rank (another
    pipeline stage's). A tied weight replaced under several names keeps the replacement this
    rank holds."""
    known = _replaced(original)
    if known is not None and known[2] is not None and new is None:
        return
    _REPLACED[id(original)] = (weakref.ref(original), fqn, None if new is None else weakref.ref(new))
    weakref.finalize(original, _REPLACED.pop, id(original), None)


def adopt_replacements() -> None:
    """Every live optimizer without state for a replaced parameter holds its replacement instead.
    Optimizers are found among the interpreter's objects: there is no registry of them, and a
    GradScaler unscales the gradients of the parameters an optimizer holds before its step
    hooks run, so the swap cannot wait for the first step."""
    if not _REPLACED:
        return
    for optimizer in _live_optimizers():
        if not any(_replaced(p) is not None for p in optimizer.state):
            for group in optimizer.param_groups:
                group["params"][:] = [new for new in map(_replacement, group["params"]) if new is not None]


def _live_optimizers() -> list:
    """Every optimizer object in the interpreter. An instance of a Python class refers to its class,
    so the collector's referrers of the optimizer classes are their instances: one pass in C over
    the heap, where testing the type of each object in Python took five times as long (a worker
    that has run many plans holds millions of objects: 0.2 s against 1.1 s on 3 million)."""
    classes = _subclasses(torch.optim.Optimizer)
    # by type, not isinstance: isinstance reads __class__, which some objects compute (and warn)
    return [o for o in gc.get_referrers(*classes) if type(o) in classes]


def _subclasses(cls: type) -> set[type]:
    found, unvisited = {cls}, [cls]
    while unvisited:
        for sub in unvisited.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                unvisited.append(sub)
    return found


def _replaced(p) -> tuple | None:
    entry = _REPLACED.get(id(p))
    return entry if entry is not None and entry[0]() is p else None


def _replacement(p):
    """What holds ``p``'s place now: itself where nothing replaced it; None where nothing does."""
    entry = _replaced(p)
    if entry is None:
        return p
    return None if entry[2] is None else entry[2]()


def _refuse_stale_parameters(optimizer, args, kwargs) -> None:
    if not _REPLACED:
        return
    stale = [_replaced(p)[1] for group in optimizer.param_groups for p in group["params"] if _replaced(p) is not None]
    if stale:
        named = ", ".join(stale[:4]) + (", ..." if len(stale) > 4 else "")
        raise AutoparError(f"this {type(optimizer).__name__} holds state for parameters that autopar has since "
                           f"replaced by their sharded DTensors ({named}): it stepped, or loaded a state dict (a "
                           f"checkpoint), before the model was sharded, and its state belongs to the old tensors. "
                           f"Shard the model first (autopar.prepare(model, *example_inputs), or example_inputs= on "
                           f"autoparallelize), then load the checkpoint into it and its optimizer; or build the "
                           f"optimizer again after the model's first call")


register_optimizer_step_pre_hook(_refuse_stale_parameters)
