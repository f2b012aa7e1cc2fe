"""The graphs captured lately in this process, by model object and call, so that
``autopar.check`` of a plan need not capture the model again to know the plan is its.

Only check reads them: its comparison with eager backs the shortcut up (a model changed in
place since its capture, which the key cannot see, would fail that comparison, not pass it).
autoparallelize's given plans are always checked against a fresh capture (rank 0's, broadcast).
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from autopar.capture.export import program_inputs
from autopar.ir.call import flatten_call, module_modes
from autopar.ir.plan import Plan

# model -> {how it was called and captured: the graph's fingerprint}
_FINGERPRINTS: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def capture_key(plan: Plan, model: nn.Module, example_inputs, kwargs: dict | None, loss_fn) -> tuple:
    """What the capture of ``model`` that ``plan``'s graph comes from depends on besides the
    model's code and parameters: the call (its tensors' shapes and dtypes, its other values),
    loss_fn, the modules' train/eval modes, the micro-batches a pipeline captures one of, and
    the autocast dtype."""
    call = flatten_call(program_inputs(example_inputs), kwargs)
    others = tuple(repr(leaf) for leaf in call.leaves if not isinstance(leaf, torch.Tensor))
    return (call.signature, others, loss_fn, module_modes(model), plan.pipeline and plan.pipeline.microbatches,
            plan.graph.autocast)


def remember(model: nn.Module, key: tuple, fingerprint: str) -> None:
    _FINGERPRINTS.setdefault(model, {})[key] = fingerprint


def recalled(model: nn.Module, key: tuple) -> str | None:
    return _FINGERPRINTS.get(model, {}).get(key)
