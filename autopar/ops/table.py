"""The sharding rule of every supported ATen op: one line per op (neural-network ops in
autopar.ops.nn, indexing and routing ops in autopar.ops.indexing).

An op missing here is not an error: it gets the Replicate fallback and the plan
lists it in ``Plan.fallback_ops``. ``register_rule`` adds or overrides an entry.
"""
from __future__ import annotations

import torch

from autopar.ops.indexing import INDEXING_RULES, NAMED_RULES
from autopar.ops.kinds import (
    ExpandRule,
    FactoryRule,
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
from autopar.ops.nn import NN_RULES

aten = torch.ops.aten


_UNARY = ["relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt", "erf", "sin", "cos", "abs",
          "reciprocal", "logical_not", "bitwise_not", "sign"]
_UNARY_LINEAR = ["neg", "clone", "_to_copy", "lift_fresh_copy"]
_ALIASES = ["detach", "alias"]
_SCALAR = ["add.Scalar", "sub.Scalar", "rsub.Scalar", "pow.Tensor_Scalar", "eq.Scalar", "ne.Scalar", "gt.Scalar",
           "lt.Scalar", "ge.Scalar", "le.Scalar", "clamp.default", "fill.Scalar", "ones_like.default",
           "zeros_like.default", "full_like.default", "empty_like.default", "masked_fill.Scalar"]
_SCALAR_LINEAR = ["mul.Scalar", "div.Scalar"]
_BINARY = ["maximum", "minimum", "eq.Tensor", "ne.Tensor", "gt.Tensor", "lt.Tensor", "ge.Tensor", "le.Tensor",
           "logical_and", "logical_or", "pow.Tensor_Tensor", "where.self", "masked_fill.Tensor",
           "bitwise_and.Tensor", "bitwise_or.Tensor", "floor_divide.default"]
# backward ops that are linear in their first argument, the incoming gradient
_GRAD_LINEAR = ["gelu_backward", "threshold_backward", "tanh_backward", "sigmoid_backward", "silu_backward",
                "native_dropout_backward"]


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
    aten.amax.default: reduction(1, 2, "max"),
    aten._softmax.default: normalize(1),
    aten._safe_softmax.default: normalize(1),  # softmax whose fully masked rows are 0 (attention with dropout)
    aten._log_softmax.default: normalize(1),
    aten._softmax_backward_data.default: normalize(2),
    aten._log_softmax_backward_data.default: normalize(2),
    aten.view.default: ViewRule(),
    aten._unsafe_view.default: ViewRule(),
    aten.reshape.default: ViewRule(),
    aten.unsqueeze.default: ViewRule(shape_arg=None),
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
    aten.scalar_tensor.default: FactoryRule(shardable=False, shape_arg=None),  # arg 0 is the value
    aten.arange.default: ReplicateOnly(reason="values depend on global positions"),
    aten.arange.start: ReplicateOnly(reason="values depend on global positions"),
    aten.arange.start_step: ReplicateOnly(reason="values depend on global positions"),
    **NN_RULES,
    **INDEXING_RULES,
}
RULES.update({_op(n): unary() for n in _UNARY})
RULES.update({_op(n): unary(linear=True) for n in _UNARY_LINEAR})
RULES.update({_op(n): unary(linear=True, free=True) for n in _ALIASES})
RULES.update({_op(n): unary() for n in _SCALAR})
RULES.update({_op(n): unary(linear=True) for n in _SCALAR_LINEAR})
RULES.update({_op(n): pointwise("none") for n in _BINARY})
RULES.update({_op(n): pointwise("first") for n in _GRAD_LINEAR})


def rule_for(target) -> Rule | None:
    return RULES.get(target) or NAMED_RULES.get(str(target))


def register_rule(op, rule: Rule) -> None:
    """Add or replace the sharding rule of ``op`` (an ``OpOverload``)."""
    if not isinstance(rule, Rule):
        raise TypeError(f"a rule must be an autopar Rule (einsum(...), pointwise(...), ...), got {type(rule).__name__}")
    RULES[op] = rule
