"""A model call as the programs take it: its tensors in order, and the structure around them;
and the state of the model that, with the call, selects a program (modes, frozen parameters).

``model(x, y)``, ``model(input_ids=..., labels=...)`` and ``model({"x": x}, mask=None)`` all
flatten (torch's pytree) into a list of tensors and a structure: the tree of tuples, lists
and dicts around them, with the value of every leaf that is not a tensor. A program is
planned for one structure and one set of tensor shapes and dtypes (its ``signature``): a
call with another structure or another shape is another program.
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

# leaves other than tensors that a call may carry: their values are part of the program
PLAIN_LEAVES = (bool, int, float, str, type(None), torch.dtype, torch.device)


@dataclass(frozen=True)
class FlatCall:
    tensors: tuple[torch.Tensor, ...]  # the tensor leaves of (args, kwargs), in order
    paths: tuple[tuple, ...]  # each tensor's key path from (args, kwargs): ((0 or "kw"), index or key, ...)
    structure: str  # the tree around the tensors and every other leaf's value
    spec: pytree.TreeSpec
    leaves: tuple  # every leaf of (args, kwargs), tensors included, in order

    @functools.cached_property
    def signature(self) -> tuple:
        """What a program is planned for: the structure and each tensor's shape and dtype."""
        return call_signature(self.structure, [(t.shape, str(t.dtype).removeprefix("torch.")) for t in self.tensors])

    def rebuild(self, tensors) -> tuple[tuple, dict]:
        """(args, kwargs) with ``tensors`` in place of this call's tensors."""
        replacement = iter(tensors)
        leaves = [next(replacement) if isinstance(leaf, torch.Tensor) else leaf for leaf in self.leaves]
        return pytree.tree_unflatten(leaves, self.spec)


def call_signature(structure: str, tensors) -> tuple:
    """A call's structure and its tensors' (shape, dtype name) pairs, as one key."""
    return (structure,) + tuple((tuple(int(d) for d in shape), dtype) for shape, dtype in tensors)


def module_modes(model) -> str:
    """Each module's training flag, in ``model.modules()`` order ("1": training): a frozen
    BatchNorm in eval mode inside a training model makes another program."""
    return "".join("1" if m.training else "0" for m in model.modules())


def frozen_parameters(model) -> tuple[str, ...]:
    """The parameters that take no gradient (requires_grad False): unfreezing one changes the step."""
    return tuple(name for name, p in model.named_parameters() if not p.requires_grad)


def flatten_call(args: tuple, kwargs: dict | None = None) -> FlatCall:
    """``args`` and ``kwargs`` (keywords sorted by name: their order does not matter) flattened."""
    kwargs = dict(sorted((kwargs or {}).items()))
    with_paths, spec = pytree.tree_flatten_with_path((tuple(args), kwargs))
    leaves = tuple(leaf for _, leaf in with_paths)
    tensors, paths, described = [], [], []
    for path, leaf in with_paths:
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
            paths.append(tuple(key_name(k) for k in path))
            described.append("<tensor>")
        else:
            described.append(_describe(leaf))
    structure = f"{spec} | {', '.join(described)}"
    return FlatCall(tuple(tensors), tuple(paths), structure, spec, leaves)


def batch_size(tensors) -> int | None:
    """The batch a pipeline splits into micro-batches: the dim-0 size most of a call's tensors
    share (on a tie, the larger). A tensor of another dim-0 size (position ids of shape [1, S],
    a table) carries no batch dim and goes whole to every micro-batch; a tensor of that size is
    taken to carry the batch in dim 0. None where no tensor has a dim."""
    sizes = Counter(int(t.shape[0]) for t in tensors if t.dim())
    return max(sizes, key=lambda size: (sizes[size], size)) if sizes else None


def first_microbatch(call: FlatCall, microbatches: int) -> tuple[tuple, dict]:
    """(args, kwargs) of the first of ``microbatches`` micro-batches of ``call``: the first rows
    of each tensor that carries the batch (autopar.ir.call.batch_size), every other leaf whole."""
    batch = batch_size(call.tensors)
    size = (batch or 0) // microbatches
    return call.rebuild(t.narrow(0, 0, size) if t.dim() and t.shape[0] == batch else t for t in call.tensors)


def unsupported_leaves(call: FlatCall) -> list[str]:
    """Leaves of a call that are neither tensors nor plain values, named by type."""
    return sorted({type(leaf).__name__ for leaf in call.leaves
                   if not isinstance(leaf, (torch.Tensor,) + PLAIN_LEAVES)})


def _describe(leaf: Any) -> str:
    if isinstance(leaf, PLAIN_LEAVES):
        return f"{type(leaf).__name__}:{leaf!r}"
    return f"<{type(leaf).__name__}>"  # capture refuses these: no program is planned for one


def key_name(entry) -> Any:
    """A pytree key as plain data: a position or a dict key or attribute name."""
    for attribute in ("idx", "key", "name"):
        if hasattr(entry, attribute):
            return getattr(entry, attribute)
    return str(entry)
