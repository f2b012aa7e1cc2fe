"""Sharding rules of indexing and routing ops: slices, gathers, padding, sorting, scatter, grouped matmuls."""
from __future__ import annotations

import string

import torch

from autopar.ops.kinds import (
    LetterRule,
    Letters,
    OpCall,
    RuleDoesNotApply,
)

aten = torch.ops.aten


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


INDEXING_RULES: dict = {
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
}


# ops of libraries autopar does not import, by name (their OpOverloads exist only once imported)
NAMED_RULES: dict = {
    "transformers.grouped_mm_fallback.default": LetterRule(_grouped_mm, flop_fn=_grouped_mm_flops),
    "transformers.grouped_mm_fallback_backward.default": LetterRule(
        _grouped_mm_backward, flop_fn=lambda i, o: 2 * _grouped_mm_flops(i, o)),
}
