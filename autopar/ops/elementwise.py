"""Elementwise rules that depend on more than the op: casts (a cast down rounds each summand
of a partial sum), copy, and the rule every op PyTorch tags pointwise gets by default."""
from __future__ import annotations

import functools

import torch

from autopar.ops.kinds import LetterRule, Letters, OpCall, broadcast_letters, pointwise

aten = torch.ops.aten


def _narrows(source: str | None, target: str | None) -> bool:
    """Whether a cast from dtype ``source`` to ``target`` keeps fewer significant bits."""
    if source is None or target is None:
        return False
    src, dst = getattr(torch, source), getattr(torch, target)
    if not (src.is_floating_point and dst.is_floating_point):
        return False
    return torch.finfo(dst).eps > torch.finfo(src).eps


def _cast(call: OpCall) -> Letters:
    """_to_copy / clone: elementwise and linear, but a cast down (float32 to bfloat16) rounds
    each rank's summand before the sum, which the sum of the rounded whole does not: a partial
    sum passes only where the plan's precision accepts sums in the lower precision."""
    ins, out, fixed = broadcast_letters(call)
    narrows = bool(call.out_dtypes) and _narrows(call.in_dtypes[0] if call.in_dtypes else None, call.out_dtypes[0])
    partial = () if narrows and not call.low_precision_partials else (frozenset({0}),)
    return Letters(tuple(ins), (out,), fixed=fixed, partial_inputs=partial)


def _copy(call: OpCall) -> Letters:
    """copy(self, src): src's values broadcast to self's shape; self's values are not read, so
    a partial src gives a partial result whatever self holds."""
    ins, out, fixed = broadcast_letters(call)
    return Letters(tuple(ins), (out,), fixed=fixed, partial_inputs=(frozenset({1}), frozenset({0, 1})))


CAST = LetterRule(_cast, follower=True)
COPY = LetterRule(_copy)
TAGGED_POINTWISE = pointwise("none")  # no partial sum through an op nothing says is linear


@functools.cache
def is_tagged_pointwise(op) -> bool:
    """An op PyTorch tags pointwise that returns new tensors (not a bool: ``equal``) and draws no
    random numbers."""
    tags = getattr(op, "tags", ())
    schema = getattr(op, "_schema", None)
    return (torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags and schema is not None
            and not schema.is_mutable and bool(schema.returns)
            and all(str(r.type) == "Tensor" and not r.alias_info for r in schema.returns))
