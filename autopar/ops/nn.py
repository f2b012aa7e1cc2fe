"""Sharding rules of neural-network ops: normalization, embedding, losses, attention, convolution, dropout."""
from __future__ import annotations

import math
import string

import torch

from autopar.ops.kinds import (
    LetterRule,
    Letters,
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


def _dropout(call: OpCall) -> Letters:
    letters = string.ascii_lowercase[: len(call.in_shapes[0])]
    return Letters((letters,), (letters, letters))


SDPA_FORWARD = LetterRule(lambda c: _sdpa_letters(c, ("bhtd", "bhsd", "bhsd"), ("bhtd", "bht")),
                          flop_fn=_sdpa_flops)
SDPA_BACKWARD = LetterRule(
    lambda c: _sdpa_letters(c, ("bhtd", "bhtd", "bhsd", "bhsd", "bhtd", "bht"), ("bhtd", "bhsd", "bhsd")),
    flop_fn=_sdpa_backward_flops)

NN_RULES: dict = {
    aten.native_layer_norm.default: LetterRule(_layer_norm),
    aten.native_layer_norm_backward.default: LetterRule(_layer_norm_backward),
    aten.embedding.default: LetterRule(_embedding),
    aten.embedding_dense_backward.default: LetterRule(_embedding_backward),
    aten.nll_loss_forward.default: LetterRule(_nll_loss_forward),
    aten.nll_loss_backward.default: LetterRule(_nll_loss_backward),
    aten._scaled_dot_product_flash_attention_for_cpu.default: SDPA_FORWARD,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: SDPA_BACKWARD,
    aten.convolution.default: LetterRule(lambda c: _conv_letters(c, backward=False), flop_fn=_conv_flops),
    aten.convolution_backward.default: LetterRule(lambda c: _conv_letters(c, backward=True),
                                                  flop_fn=_conv_backward_flops),
    # the backend draws the mask for the global shape (same seed on every rank) and keeps its block
    aten.native_dropout.default: LetterRule(_dropout, follower=True),
}
