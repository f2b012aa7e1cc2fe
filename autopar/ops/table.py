"""The sharding rule of every supported ATen op: one line per op.

An op missing here is not an error: it gets the Replicate fallback and the plan
lists it in ``Plan.fallback_ops``. ``register_rule`` adds or overrides an entry.
"""
from __future__ import annotations

import math
import string

import torch

from autopar.ops.kinds import (
    ExpandRule,
    FactoryRule,
    LetterRule,
    Letters,
    OpCall,
    PermuteRule,
    ReplicateOnly,
    Rule,
    RuleDoesNotApply,
    ViewRule,
    einsum,
    fixed_dim_rule,
    normalize,
    pointwise,
    reduction,
    unary,
)

aten = torch.ops.aten


def _layer_norm(call: OpCall) -> Letters:
    rank = len(call.in_shapes[0])
    n_norm = len(call.args[1])
    batch, norm = string.ascii_lowercase[: rank - n_norm], string.ascii_lowercase[rank - n_norm: rank]
    stat = batch + string.ascii_uppercase[:n_norm]  # mean/rstd keep size-1 normalised dims
    ins = (batch + norm,) + (norm,) * (len(call.in_shapes) - 1)
    return Letters(ins, (batch + norm, stat, stat), fixed=frozenset(norm + stat[len(batch):]))


def _layer_norm_backward(call: OpCall) -> Letters:
    rank = len(call.in_shapes[0])
    n_norm = len(call.args[2])
    batch, norm = string.ascii_lowercase[: rank - n_norm], string.ascii_lowercase[rank - n_norm: rank]
    stat = batch + string.ascii_uppercase[:n_norm]
    ins = (batch + norm, batch + norm, stat, stat) + (norm,) * (len(call.in_shapes) - 4)
    outs = tuple(None if s is None else (batch + norm if i == 0 else norm) for i, s in enumerate(call.out_shapes))
    # grad_weight and grad_bias sum over the batch letters, so they come out partial
    return Letters(ins, outs, fixed=frozenset(norm + stat[len(batch):]))


def _embedding(call: OpCall) -> Letters:
    idx = string.ascii_lowercase[: len(call.in_shapes[1])]
    # the vocabulary dim V stays whole: a vocab-sharded table would need masked lookups
    return Letters(("Vz", idx), (idx + "z",), fixed=frozenset("V"))


def _embedding_backward(call: OpCall) -> Letters:
    idx = string.ascii_lowercase[: len(call.in_shapes[1])]
    return Letters((idx + "z", idx), ("Vz",), fixed=frozenset("V"))


def _nll_loss_forward(call: OpCall) -> Letters:
    has_batch = len(call.in_shapes[0]) == 2
    n = "n" if has_batch else ""
    ins = (n + "C", n) + (("C",) if len(call.in_shapes) == 3 else ())
    reduction_kind = call.arg(3, "reduction")
    out = n if reduction_kind == 0 else ""
    # reduction="mean" divides by a global count, so its batch dim must stay whole;
    # capture rewrites mean into sum / total_weight so the batch can be sharded
    fixed = "C" + ("n" if reduction_kind == 1 else "")
    return Letters(ins, (out, ""), fixed=frozenset(fixed))


def _nll_loss_backward(call: OpCall) -> Letters:
    has_batch = len(call.in_shapes[1]) == 2
    n = "n" if has_batch else ""
    grad = n if call.arg(4, "reduction") == 0 else ""
    ins = (grad, n + "C", n) + (("C",) if len(call.in_shapes) == 5 else ()) + ("",)
    return Letters(ins, (n + "C",), fixed=frozenset("C"))


def _sdpa_letters(call: OpCall, head: tuple[str, ...], outs: tuple[str, ...]) -> Letters:
    """Attention is independent per (batch, head): only those dims shard."""
    ins = list(head)
    for shape in call.in_shapes[len(head):]:  # an attention mask, broadcast against (b, h, t, s)
        full = "bhts"[-len(shape):]
        ins.append("".join(c if n > 1 else c.upper() for c, n in zip(full, shape)))
    return Letters(tuple(ins), outs, fixed=frozenset("tsdTSBH"))


def _sdpa_flops(in_shapes, out_shapes):
    b, h, t, d = in_shapes[0]
    s = in_shapes[1][2]
    return 4.0 * b * h * t * s * d


def _sdpa_backward_flops(in_shapes, out_shapes):
    return 2.5 * _sdpa_flops(in_shapes[1:], out_shapes)


def _conv_letters(call: OpCall, backward: bool) -> Letters:
    """convolution over (n, c, *spatial): batch n and output channels o shard; a split input
    channel c gives a partial sum (the bias is added once). Spatial dims stay whole."""
    k = len(call.in_shapes[1 if not backward else 2]) - 2
    spatial_in, kernel, spatial_out = "HWD"[:k], "KLM"[:k], "PQR"[:k]
    if backward:  # grad_bias does not depend on c, so c cannot give it a partial sum: keep c whole
        ins = ("no" + spatial_out, "nc" + spatial_in, "oc" + kernel)
        outs = tuple(None if s is None else o for s, o in zip(call.out_shapes, ("nc" + spatial_in, "oc" + kernel, "o")))
        return Letters(ins, outs, fixed=frozenset(spatial_in + kernel + spatial_out + "c"))
    ins = ("nc" + spatial_in, "oc" + kernel) + (("o",) if len(call.in_shapes) == 3 else ())
    return Letters(ins, ("no" + spatial_out,), fixed=frozenset(spatial_in + kernel + spatial_out),
                   additive=frozenset({2}))


def _conv_flops(in_shapes, out_shapes):
    # each output element is a dot product over input channels x kernel window
    return 2.0 * math.prod(in_shapes[1][1:]) * math.prod(out_shapes[0])


def _conv_backward_flops(in_shapes, out_shapes):
    return 2 * _conv_flops((in_shapes[1], in_shapes[2]), (in_shapes[0],))


def _slice_backward(call: OpCall) -> Letters:
    """slice_backward / select_backward scatter a gradient into zeros of the input's size."""
    rank = len(call.out_shapes[0])
    letters = string.ascii_lowercase[:rank]
    d = call.args[2] % rank
    grad = letters if len(call.in_shapes[0]) == rank else letters[:d] + letters[d + 1:]
    return Letters((grad,), (letters,), fixed=frozenset(letters[d]), partial_inputs=(frozenset({0}),))


def _gather(call: OpCall) -> Letters:
    """gather(self, dim, index): the gathered dim stays whole; other dims shard where self and index agree."""
    src, idx = call.in_shapes
    rank = len(idx)
    d = call.args[1] % rank
    lower, upper = string.ascii_lowercase, string.ascii_uppercase
    out = "".join(lower[i] if i != d else "Y" for i in range(rank))
    self_letters = "".join("X" if i == d else (lower[i] if src[i] == idx[i] else upper[i]) for i in range(rank))
    return Letters((self_letters, out), (out,), fixed=frozenset(upper))


def _dropout(call: OpCall) -> Letters:
    letters = string.ascii_lowercase[: len(call.in_shapes[0])]
    return Letters((letters,), (letters, letters))


def _pad(call: OpCall) -> Letters:
    rank = len(call.in_shapes[0])
    letters = string.ascii_lowercase[:rank]
    pad = call.args[1]
    padded = {rank - 1 - i // 2 for i, p in enumerate(pad) if p}
    return Letters((letters,), (letters,), fixed=frozenset(letters[d] for d in padded))


def _along_dim(dim_arg: int, partial_ok=lambda call: False) -> LetterRule:
    """topk / sort / cumsum along one dim: that dim stays whole, the others shard.
    On a 1-D tensor (MoE routing sorts the flattened token-expert pairs) this leaves
    replication as the only layout, which is genuinely the only correct one per op."""

    def make(call: OpCall) -> Letters:
        rank = len(call.in_shapes[0])
        letters = string.ascii_lowercase[:rank]
        d = call.arg(dim_arg, "dim", -1) % rank if rank else 0
        outs = tuple(None if s is None else letters for s in call.out_shapes)
        return Letters((letters,), outs, fixed=frozenset(letters[d:d + 1]),
                       partial_inputs=(frozenset({0}),) if partial_ok(call) else ())

    return LetterRule(make, follower=True)


def _cumsum_is_linear(call: OpCall) -> bool:
    # a float -> int cast truncates each summand, so a partial sum would not survive it
    dtype = call.arg(2, "dtype")
    return dtype is None or dtype.is_floating_point


def _histc(call: OpCall) -> Letters:
    """Counts of a split input add up: any sharded input dim gives partial counts."""
    letters = string.ascii_lowercase[: len(call.in_shapes[0])]
    return Letters((letters,), ("Z",), fixed=frozenset("Z"))


def _advanced_index(call: OpCall, indices) -> tuple[int, int]:
    """(position, rank) of the single index tensor in ``x[..., idx, ...]``."""
    present = [i for i, t in enumerate(indices) if t is not None]
    if len(present) != 1:
        raise RuleDoesNotApply("only one index tensor is supported")
    return present[0], len(call.in_shapes[1])


def _index(call: OpCall) -> Letters:
    """x[idx] along dim p: the indexed dim stays whole; the other dims of x, or the
    dims of idx, shard. Gathering is linear in x, so a partial x gives a partial result."""
    p, q = _advanced_index(call, call.args[1])
    rank = len(call.in_shapes[0])
    own = string.ascii_lowercase[:rank]
    idx = string.ascii_uppercase[:q]
    return Letters((own, idx), (own[:p] + idx + own[p + 1:],), fixed=frozenset(own[p]),
                   partial_inputs=(frozenset({0}),))


def _index_put(call: OpCall) -> Letters:
    """x[idx] = v (or += v): dims of x other than p shard with v. With accumulate, a
    split idx makes each rank add its share of v, so x and the result are partial."""
    p, q = _advanced_index(call, call.args[1])
    rank = len(call.in_shapes[0])
    own = string.ascii_lowercase[:rank]
    idx = string.ascii_uppercase[:q]
    full = own[:p] + idx + own[p + 1:]
    values_shape = call.in_shapes[2]
    full_shape = call.in_shapes[0][:p] + call.in_shapes[1] + call.in_shapes[0][p + 1:]
    aligned = full[len(full) - len(values_shape):]
    values = "".join(c if n == full_shape[len(full) - len(values_shape) + i] else "Z"
                     for i, (c, n) in enumerate(zip(aligned, values_shape)))
    accumulate = bool(call.arg(3, "accumulate", False))
    fixed = {own[p], "Z"} | (set() if accumulate else set(idx))
    return Letters((own, idx, values), (own,), fixed=frozenset(fixed), additive=frozenset({0}),
                   partial_inputs=(frozenset({0, 2}),))


def _scatter(call: OpCall) -> Letters:
    """scatter(x, dim, idx, src): the scattered dim stays whole, rows shard where all
    three agree; linear in (x, src) together."""
    rank = len(call.in_shapes[0])
    d = call.args[1] % rank
    lower, upper = string.ascii_lowercase, string.ascii_uppercase
    own = "".join("X" if i == d else lower[i] for i in range(rank))
    idx = "".join("Y" if i == d else (lower[i] if n == call.in_shapes[0][i] else upper[i])
                  for i, n in enumerate(call.in_shapes[1]))
    return Letters((own, idx, idx), (own,), fixed=frozenset(upper), partial_inputs=(frozenset({0, 2}),))


def _grouped_mm(call: OpCall) -> Letters:
    """transformers' grouped_mm(input (S, k), weight (E, k, n), offs (E,)): rows S are
    cut into expert groups by global offsets, so S and E stay whole; k and n shard as in mm."""
    return Letters(("Sk", "Ekn", "E"), ("Sn",), fixed=frozenset("SE"),
                   partial_inputs=(frozenset({0}), frozenset({1})))


def _grouped_mm_backward(call: OpCall) -> Letters:
    return Letters(("Sk", "Ekn", "E", "Sn"), ("Sk", "Ekn"), fixed=frozenset("SE"), partial_inputs=(frozenset({3}),))


def _grouped_mm_flops(in_shapes, out_shapes):
    (rows, k), (_, _, n) = in_shapes[0], in_shapes[1]
    return 2.0 * rows * k * n  # each row meets one expert's weight


SDPA_FORWARD = LetterRule(lambda c: _sdpa_letters(c, ("bhtd", "bhsd", "bhsd"), ("bhtd", "bht")),
                          flop_fn=_sdpa_flops)
SDPA_BACKWARD = LetterRule(
    lambda c: _sdpa_letters(c, ("bhtd", "bhtd", "bhsd", "bhsd", "bhtd", "bht"), ("bhtd", "bhsd", "bhsd")),
    flop_fn=_sdpa_backward_flops)

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
    aten._log_softmax.default: normalize(1),
    aten._softmax_backward_data.default: normalize(2),
    aten._log_softmax_backward_data.default: normalize(2),
    aten.native_layer_norm.default: LetterRule(_layer_norm),
    aten.native_layer_norm_backward.default: LetterRule(_layer_norm_backward),
    aten.embedding.default: LetterRule(_embedding),
    aten.embedding_dense_backward.default: LetterRule(_embedding_backward),
    aten.nll_loss_forward.default: LetterRule(_nll_loss_forward),
    aten.nll_loss_backward.default: LetterRule(_nll_loss_backward),
    aten._scaled_dot_product_flash_attention_for_cpu.default: SDPA_FORWARD,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: SDPA_BACKWARD,
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
    aten.convolution.default: LetterRule(lambda c: _conv_letters(c, backward=False), flop_fn=_conv_flops),
    aten.convolution_backward.default: LetterRule(lambda c: _conv_letters(c, backward=True),
                                                  flop_fn=_conv_backward_flops),
    aten.slice_backward.default: LetterRule(_slice_backward, follower=True, shape_arg=1),
    aten.select_backward.default: LetterRule(_slice_backward, follower=True, shape_arg=1),
    aten.constant_pad_nd.default: LetterRule(_pad, follower=True),
    aten.gather.default: LetterRule(_gather),
    aten.index.Tensor: LetterRule(_index),
    aten.index_put.default: LetterRule(_index_put),
    aten.scatter.src: LetterRule(_scatter),
    aten.topk.default: _along_dim(2),
    aten.sort.default: _along_dim(1),
    aten.cumsum.default: _along_dim(1, partial_ok=_cumsum_is_linear),
    aten.histc.default: LetterRule(_histc),
    # the backend draws the mask for the global shape (same seed on every rank) and keeps its block
    aten.native_dropout.default: LetterRule(_dropout, follower=True),
    aten.full.default: FactoryRule(),
    aten.zeros.default: FactoryRule(),
    aten.ones.default: FactoryRule(),
    aten.empty.memory_format: FactoryRule(),
    aten.scalar_tensor.default: FactoryRule(shardable=False, shape_arg=None),  # arg 0 is the value
    aten.arange.default: ReplicateOnly(reason="values depend on global positions"),
    aten.arange.start: ReplicateOnly(reason="values depend on global positions"),
    aten.arange.start_step: ReplicateOnly(reason="values depend on global positions"),
}
RULES.update({_op(n): unary() for n in _UNARY})
RULES.update({_op(n): unary(linear=True) for n in _UNARY_LINEAR})
RULES.update({_op(n): unary(linear=True, free=True) for n in _ALIASES})
RULES.update({_op(n): unary() for n in _SCALAR})
RULES.update({_op(n): unary(linear=True) for n in _SCALAR_LINEAR})
RULES.update({_op(n): pointwise("none") for n in _BINARY})
RULES.update({_op(n): pointwise("first") for n in _GRAD_LINEAR})


# ops of libraries autopar does not import, by name (their OpOverloads exist only once imported)
NAMED_RULES: dict = {
    "transformers.grouped_mm_fallback.default": LetterRule(_grouped_mm, flop_fn=_grouped_mm_flops),
    "transformers.grouped_mm_fallback_backward.default": LetterRule(
        _grouped_mm_backward, flop_fn=lambda i, o: 2 * _grouped_mm_flops(i, o)),
}


def rule_for(target) -> Rule | None:
    return RULES.get(target) or NAMED_RULES.get(str(target))


def register_rule(op, rule: Rule) -> None:
    """Add or replace the sharding rule of ``op`` (an ``OpOverload``)."""
    if not isinstance(rule, Rule):
        raise TypeError(f"a rule must be an autopar Rule (einsum(...), pointwise(...), ...), got {type(rule).__name__}")
    RULES[op] = rule
