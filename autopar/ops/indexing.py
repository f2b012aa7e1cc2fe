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


def _aligned(shapes, dim: int) -> list[str]:
    """Letters of operands that are indexed alike (gather's source, index and output;
    scatter's target, index and source): a dim other than ``dim`` shares its letter, and
    shards, only where every operand has the same size there, since the index addresses
    rows by their global position; elsewhere each operand's dim stays whole."""
    rank = len(shapes[0])
    own = [""] * len(shapes)
    for i in range(rank):
        agree = i != dim and len({s[i] for s in shapes}) == 1
        for j in range(len(shapes)):
            own[j] += string.ascii_lowercase[i] if agree else _WHOLE[j][i]
    return own


_WHOLE = ("ABCDEFGH", "IJKLMNOP", "QRSTUVWX")  # per operand, per dim: letters that never shard


def _gather(call: OpCall) -> Letters:
    """gather(self, dim, index) -> index's shape; linear in self."""
    src, idx = _aligned(call.in_shapes, call.args[1] % max(len(call.in_shapes[1]), 1))
    return Letters((src, idx), (idx,), fixed=frozenset("".join(_WHOLE)), partial_inputs=(frozenset({0}),))


def _scatter(linear: bool):
    """scatter(x, dim, index, src), scatter_add, scatter_reduce (sum, mean): the result is x
    with src's values put (or added) at index; with ``linear``, jointly linear in (x, src).
    scatter.value (x, dim, index, value) has no src."""

    def make(call: OpCall) -> Letters:
        letters = _aligned(call.in_shapes, call.args[1] % max(len(call.in_shapes[0]), 1))
        partial = (frozenset({0, 2} if len(letters) == 3 else {0}),) if linear else ()
        return Letters(tuple(letters), (letters[0],), fixed=frozenset("".join(_WHOLE)), partial_inputs=partial)

    return make


def _scatter_reduce(call: OpCall) -> Letters:
    return _scatter(linear=call.arg(4, "reduce") in ("sum", "mean"))(call)


def _index_select(call: OpCall) -> Letters:
    """index_select(self, dim, index): the selected dim of self stays whole; the index (a list of
    global positions) shards, and with it that dim of the output; linear in self."""
    rank = len(call.in_shapes[0])
    d = call.args[1] % rank if rank else 0
    own = string.ascii_lowercase[:rank]
    return Letters((own[:d] + "X" + own[d + 1:], "y"), (own[:d] + "y" + own[d + 1:],), fixed=frozenset("X"),
                   partial_inputs=(frozenset({0}),))


def _into_slice(select: bool):
    """slice_scatter(self, src, dim, start, end, step) / select_scatter(self, src, dim, index):
    src written into a slice of self's dim, which stays whole; jointly linear in (self, src)."""

    def make(call: OpCall) -> Letters:
        rank = len(call.in_shapes[0])
        d = call.arg(2, "dim", 0) % rank
        own = string.ascii_lowercase[:rank]
        src = own[:d] + ("" if select else "Y") + own[d + 1:]
        return Letters((own[:d] + "X" + own[d + 1:], src), (own[:d] + "X" + own[d + 1:],), fixed=frozenset("XY"),
                       partial_inputs=(frozenset({0, 1}),))

    return make


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
    """Counts of a split input add up: any sharded input dim gives partial counts, where the
    bins are fixed (min < max). With min == max the range is the data's own minimum and
    maximum, which each rank would take from its block alone: then the input stays whole."""
    letters = string.ascii_lowercase[: len(call.in_shapes[0])]
    data_range = call.arg(2, "min", 0) == call.arg(3, "max", 0)
    return Letters((letters,), ("Z",), fixed=frozenset("Z" + (letters if data_range else "")))


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
    aten.index_select.default: LetterRule(_index_select),
    aten.scatter.value: LetterRule(_scatter(linear=False)),
    aten.scatter_add.default: LetterRule(_scatter(linear=True)),
    aten.scatter_reduce.two: LetterRule(_scatter_reduce),
    aten.slice_scatter.default: LetterRule(_into_slice(select=False)),
    aten.select_scatter.default: LetterRule(_into_slice(select=True)),
    aten.index.Tensor: LetterRule(_index),
    aten.index_put.default: LetterRule(_index_put),
    aten.scatter.src: LetterRule(_scatter(linear=True)),
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
