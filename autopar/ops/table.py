"""The sharding rule of every supported ATen op: one line per op (neural-network ops in
autopar.ops.nn, indexing and routing ops in autopar.ops.indexing, mixture-of-experts layers in
autopar.ops.moe).

An op missing here is not an error: it gets the Replicate fallback and the plan
lists it in ``Plan.fallback_ops``. ``register_rule`` adds or overrides an entry.
"""
from __future__ import annotations

import torch

from autopar.ops.attention import ATTENTION_RULES
from autopar.ops.elementwise import CAST, COPY, TAGGED_POINTWISE, is_tagged_pointwise
from autopar.ops.indexing import INDEXING_RULES, NAMED_RULES
from autopar.ops.kinds import (
    ExpandRule,
    FactoryRule,
    NewFactoryRule,
    PermuteRule,
    ReplicateOnly,
    Rule,
    ViewRule,
    einsum,
    fixed_dim_rule,
    normalize,
    pointwise,
    reduction,
    unary,
)
from autopar.ops.moe import MOE_RULES
from autopar.ops.nn import NN_RULES
from autopar.ops.shapes import SHAPE_RULES
from autopar.ops.spatial import SPATIAL_RULES

aten = torch.ops.aten


# ops not tagged pointwise that act elementwise (the tagged ones get the pointwise rule from their tag)
_LIKE = ["fill.Scalar", "ones_like.default", "zeros_like.default", "full_like.default", "empty_like.default"]
_BINARY = ["masked_fill.Tensor", "floor_divide.default"]
# tagged pointwise, and linear: a partial sum passes through its first (or only) tensor
_UNARY_LINEAR = ["neg", "clone", "lift_fresh_copy", "mul.Scalar", "div.Scalar"]
_ALIASES = ["detach", "alias"]
# backward ops that are linear in their first argument, the incoming gradient
_GRAD_LINEAR = ["gelu_backward", "threshold_backward", "tanh_backward", "sigmoid_backward", "silu_backward",
                "native_dropout_backward"]
# ops whose only correct layout is replicated everywhere, and why
_REPLICATED = {
    "arange.default": "values depend on global positions",
    "arange.start": "values depend on global positions",
    "arange.start_step": "values depend on global positions",
    "nonzero.default": "its output's size depends on the values",
    "masked_scatter.default": "source values are consumed in mask order across the whole tensor",
    "_local_scalar_dense.default": "reads one value of the whole tensor into Python",
    "as_strided.default": "its sizes and strides address the whole tensor's memory",
    "_pdist_forward.default": "each output pairs two rows of the whole input",
    "rand.default": "random values: drawn whole on every rank from the same generator state",
    "randn.default": "random values: drawn whole on every rank from the same generator state",
    "randperm.default": "a random permutation of the whole range",
}


def _op(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


RULES: dict = {
    aten.mm.default: einsum("mk,kn->mn"),
    aten.addmm.default: einsum("mk,kn->mn", bias="n"),
    aten.bmm.default: einsum("bmk,bkn->bmn"),
    aten.add.Tensor: pointwise("all"),
    aten.sub.Tensor: pointwise("all"),
    aten.mul.Tensor: pointwise("one"),
    aten.div.Tensor: pointwise("first"),
    aten.sum.dim_IntList: reduction(1, 2, "sum"),
    aten.sum.default: reduction(None, None, "sum"),
    aten.mean.dim: reduction(1, 2, "mean"),
    aten.mean.default: reduction(None, None, "mean"),
    aten.amax.default: reduction(1, 2, "whole"),
    aten.amin.default: reduction(1, 2, "whole"),
    aten.any.default: reduction(None, None, "whole"),
    aten.any.dim: reduction(1, 2, "whole"),
    aten.any.dims: reduction(1, 2, "whole"),
    aten.argmax.default: reduction(1, 2, "whole"),
    aten.argmin.default: reduction(1, 2, "whole"),
    aten.max.dim: reduction(1, 2, "whole"),
    aten.min.dim: reduction(1, 2, "whole"),
    aten.prod.default: reduction(None, None, "whole"),
    aten.prod.dim_int: reduction(1, 2, "whole"),
    aten.var.dim: reduction(1, 3, "whole"),
    aten.var.correction: reduction(1, None, "whole"),
    aten._to_copy.default: CAST,
    aten.copy.default: COPY,
    aten._softmax.default: normalize(1),
    aten._safe_softmax.default: normalize(1),  # softmax whose fully masked rows are 0 (attention with dropout)
    aten._log_softmax.default: normalize(1),
    aten._softmax_backward_data.default: normalize(2),
    aten._log_softmax_backward_data.default: normalize(2),
    aten.view.default: ViewRule(),
    aten._unsafe_view.default: ViewRule(),
    aten.reshape.default: ViewRule(),
    aten.unsqueeze.default: ViewRule(shape_arg=None, reshape_locally=False),
    aten.squeeze.dim: ViewRule(shape_arg=None),
    aten.squeeze.dims: ViewRule(shape_arg=None),
    aten.squeeze.default: ViewRule(shape_arg=None),
    aten.expand.default: ExpandRule(),
    aten.permute.default: PermuteRule("permute"),
    aten.transpose.int: PermuteRule("transpose"),
    aten.t.default: PermuteRule("t"),
    aten.slice.Tensor: fixed_dim_rule(1, free=True),
    aten.select.int: fixed_dim_rule(1, free=True),
    aten.split.Tensor: fixed_dim_rule(2, free=True),
    aten.split_with_sizes.default: fixed_dim_rule(2, free=True),
    aten.cat.default: fixed_dim_rule(1),
    aten.full.default: FactoryRule(),
    aten.zeros.default: FactoryRule(),
    aten.ones.default: FactoryRule(),
    aten.empty.memory_format: FactoryRule(),
    aten.empty_strided.default: FactoryRule(stride_arg=1),
    aten.new_empty.default: NewFactoryRule(),
    aten.new_zeros.default: NewFactoryRule(),
    aten.new_ones.default: NewFactoryRule(),
    aten.new_full.default: NewFactoryRule(),
    aten.new_empty_strided.default: NewFactoryRule(stride_arg=2),
    aten.scalar_tensor.default: FactoryRule(shardable=False, shape_arg=None),  # arg 0 is the value
    **NN_RULES,
    **ATTENTION_RULES,
    **INDEXING_RULES,
    **SPATIAL_RULES,
    **SHAPE_RULES,
    **MOE_RULES,
}
RULES.update({_op(n): unary() for n in _LIKE})
RULES.update({_op(n): pointwise("none") for n in _BINARY})
RULES.update({_op(n): unary(linear=True) for n in _UNARY_LINEAR})
RULES.update({_op(n): unary(linear=True, free=True) for n in _ALIASES})
RULES.update({_op(n): pointwise("first") for n in _GRAD_LINEAR})
RULES.update({_op(n): ReplicateOnly(reason=why) for n, why in _REPLICATED.items()})


def rule_for(target) -> Rule | None:
    """The table's rule of ``target``; else, for an op PyTorch tags pointwise, the pointwise rule."""
    rule = RULES.get(target) or NAMED_RULES.get(str(target))
    if rule is None and is_tagged_pointwise(target):
        return TAGGED_POINTWISE
    return rule


def register_rule(op, rule: Rule) -> None:
    """Add or replace the sharding rule of ``op`` (an ``OpOverload``)."""
    if not isinstance(rule, Rule):
        raise TypeError(f"a rule must be an autopar Rule (einsum(...), pointwise(...), ...), got {type(rule).__name__}")
    RULES[op] = rule
