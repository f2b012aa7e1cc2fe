"""Sharding rules of neural-network ops: normalization, embedding, losses, convolution, dropout
(attention's are in autopar.ops.attention)."""
from __future__ import annotations

import math
import string

import torch

from autopar.ops.kinds import (
    LetterRule,
    Letters,
    LocalShapes,
    OpCall,
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
    """embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    rows of a split batch add into the table as partial sums, unless each row's gradient is
    divided by its index's frequency in the whole batch (``scale_grad_by_freq``): then the
    indices stay whole, and only the embedding dim z splits."""
    idx = string.ascii_lowercase[: len(call.in_shapes[1])]
    whole = "V" + (idx if call.arg(4, "scale_grad_by_freq", False) else "")
    return Letters((idx + "z", idx), ("Vz",), fixed=frozenset(whole))


def _embedding_bag(call: OpCall) -> Letters:
    """_embedding_bag(weight (V, z), indices, offsets, ...) -> (output (bags, z), offset2bag,
    bag_size, max_indices): each feature z of a bag sums, averages or maxes its rows alone, so
    z shards (and max_indices with it, where it is per feature); bags gather rows by global
    offsets, so everything else stays whole."""
    out_shape = call.out_shapes[0]
    ins = ("Vz",) + tuple("I" * len(s) for s in call.in_shapes[1:])
    outs = ("Bz",) + tuple(None if s is None else ("Bz" if tuple(s) == tuple(out_shape) else "O" * len(s))
                           for s in call.out_shapes[1:])
    return Letters(ins, outs, fixed=frozenset("VIBO"))


def _cdist(call: OpCall) -> Letters:
    """_cdist_forward(x1 (..., p, M), x2 (..., r, M)) -> (..., p, r): each distance reads
    whole rows, so the feature dim M stays whole; batch dims shard where both agree."""
    x1, x2 = call.in_shapes
    batch = len(x1) - 2
    shared = "".join(string.ascii_lowercase[i] if x1[i] == x2[i] else string.ascii_uppercase[i]
                     for i in range(batch))
    return Letters((shared + "pM", shared + "rM"), (shared + "pr",), fixed=frozenset(string.ascii_uppercase))


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


def _conv_letters(call: OpCall, backward: bool) -> Letters:
    """convolution over (n, channels, *spatial); the batch n shards, spatial dims stay whole.

    Without groups, output channels o shard, and a split input channel c gives a partial sum
    (the bias is added once). With groups, channel blocks belong to groups: only whole groups
    split (letter g: the input's channels, the weight's first dim and the output's channels
    together), and each rank runs its share of the groups (``_ConvRule.local_args``). A
    transposed convolution's weight is (in, out / groups, *kernel)."""
    k = len(call.in_shapes[1 if not backward else 2]) - 2
    spatial_in, kernel, spatial_out = "HWD"[:k], "KLM"[:k], "PQR"[:k]
    transposed = bool(call.arg(7 if backward else 6, "transposed", False))
    groups = call.arg(9 if backward else 8, "groups", 1)
    if groups > 1:
        c, o, weight = "g", "g", "gC" + kernel  # C: a group's own channels, never split
    else:
        c, o = "c", "o"
        weight = (c + o if transposed else o + c) + kernel
    whole = spatial_in + kernel + spatial_out + "C"
    if backward:
        ins = ("n" + o + spatial_out, "n" + c + spatial_in, weight)
        outs = tuple(None if s is None else t for s, t in zip(call.out_shapes, ("n" + c + spatial_in, weight, o)))
        # grad_bias does not depend on c: with c split each rank would compute all of it, not a partial sum
        grad_bias = len(call.out_shapes) > 2 and call.out_shapes[2] is not None
        return Letters(ins, outs, fixed=frozenset(whole + (c if grad_bias and c != o else "")))
    ins = ("n" + c + spatial_in, weight) + ((o,) if len(call.in_shapes) == 3 else ())
    return Letters(ins, ("n" + o + spatial_out,), fixed=frozenset(whole), additive=frozenset({2}))


class _ConvRule(LetterRule):
    """A grouped convolution's rank runs the groups of its block of channels."""

    def __init__(self, backward: bool, flop_fn):
        super().__init__(lambda c: _conv_letters(c, backward=backward), flop_fn=flop_fn)
        self.groups_arg = 9 if backward else 8
        self.input_index = 1 if backward else 0

    def local_args(self, call: OpCall, local: LocalShapes) -> list:
        args = super().local_args(call, local)
        groups = call.arg(self.groups_arg, "groups", 1)
        if groups > 1 and self.groups_arg < len(args):
            channels = call.in_shapes[self.input_index][1]
            args[self.groups_arg] = groups * local.inputs[self.input_index][1] // channels
        return args


def _conv_flops(in_shapes, out_shapes):
    # each output element is a dot product over input channels x kernel window
    return 2.0 * math.prod(in_shapes[1][1:]) * math.prod(out_shapes[0])


def _conv_backward_flops(in_shapes, out_shapes):
    return 2 * _conv_flops((in_shapes[1], in_shapes[2]), (in_shapes[0],))


def _dropout(call: OpCall) -> Letters:
    letters = string.ascii_lowercase[: len(call.in_shapes[0])]
    return Letters((letters,), (letters, letters))


NN_RULES: dict = {
    aten.native_layer_norm.default: LetterRule(_layer_norm),
    aten.native_layer_norm_backward.default: LetterRule(_layer_norm_backward),
    aten.embedding.default: LetterRule(_embedding),
    aten.embedding_dense_backward.default: LetterRule(_embedding_backward),
    aten._embedding_bag.default: LetterRule(_embedding_bag),
    aten._cdist_forward.default: LetterRule(_cdist),
    aten.nll_loss_forward.default: LetterRule(_nll_loss_forward),
    aten.nll_loss_backward.default: LetterRule(_nll_loss_backward),
    aten.convolution.default: _ConvRule(backward=False, flop_fn=_conv_flops),
    aten.convolution_backward.default: _ConvRule(backward=True, flop_fn=_conv_backward_flops),
    # the backend draws the mask for the global shape (same seed on every rank) and keeps its block
    aten.native_dropout.default: LetterRule(_dropout, follower=True),
}
