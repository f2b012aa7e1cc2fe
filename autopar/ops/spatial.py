"""Sharding rules of ops over the trailing spatial dims of (batch, channels, *spatial) tensors:
pooling, upsampling, padding, grid sampling, col2im, batch and group normalization.

Each window, sample point or pad reads only its own (batch, channel) plane, so the leading
dims shard and the spatial dims stay whole. The linear ones (average pooling, upsampling,
padding with zeros' reflections, and every backward in its gradient) pass a partial sum on.
"""
from __future__ import annotations

import math
import string

import torch

from autopar.ops.kinds import LetterRule, Letters, LocalShapes, OpCall

aten = torch.ops.aten

_SPATIAL_IN, _SPATIAL_OUT = "HWD", "PQR"


def _planar(spatial: int, backward: bool = False, linear: bool = True, pad_arg=None) -> LetterRule:
    """``spatial`` trailing dims whole, the rest shard. Forward: (x, ...) -> outputs over the
    output window; backward: (grad, x, ..., [indices]) -> grad_x. ``pad_arg``: the spatial
    dims are those the padding names (two sizes a dim)."""

    def make(call: OpCall) -> Letters:
        k = len(call.arg(pad_arg, "padding")) // 2 if pad_arg is not None else spatial
        rank = len(call.in_shapes[1 if backward else 0])
        lead = string.ascii_lowercase[:rank - k]
        x, window = lead + _SPATIAL_IN[:k], lead + _SPATIAL_OUT[:k]
        if backward:
            ins = (window, x) + (window,) * (len(call.in_shapes) - 2)  # max pooling's indices
            outs = (x,)
        else:
            ins = (x,)
            outs = tuple(None if s is None else window for s in call.out_shapes)
        partial = (frozenset({0}),) if linear else ()
        return Letters(ins, outs, fixed=frozenset(_SPATIAL_IN + _SPATIAL_OUT), partial_inputs=partial)

    return LetterRule(make)


def _grid_sampler(call: OpCall) -> Letters:
    """grid_sampler_2d(input (n, c, H, W), grid (n, h, w, 2)) -> (n, c, h, w): each output point
    reads its own grid entry and the whole input plane."""
    return Letters(("ncHW", "nhwK"), ("nchw",), fixed=frozenset("HWK"), partial_inputs=(frozenset({0}),))


def _col2im(call: OpCall) -> Letters:
    """col2im((n, c * kernel, L)) -> (n, c, H, W): a block of rows is a block of channels."""
    batch = "n" if len(call.in_shapes[0]) == 3 else ""
    return Letters((batch + "cL",), (batch + "cHW",), fixed=frozenset("LHW"), partial_inputs=(frozenset({0}),))


def _batch_norm(training_arg: int | None, name: str = "training", backward: bool = False) -> LetterRule:
    """Batch norm's channels shard; its statistics span the batch and spatial dims, which stay
    whole in training (SyncBatchNorm's numbers, not each rank's own). In evaluation (running
    statistics) every dim shards. Every 1-D tensor (weight, bias, running and saved statistics)
    is per channel; an output of another shape (the empty saved statistics of evaluation) stays
    whole. ``training_arg``: the position of the training flag (None: always evaluation). In
    evaluation, forward's statistics pass through (replicated where the batch splits), and
    backward's weight and bias gradients sum over the batch (partial)."""

    def make(call: OpCall) -> Letters:
        training = training_arg is not None and bool(call.arg(training_arg, name, True))
        planes = [i for i, s in enumerate(call.in_shapes) if len(s) > 1]  # input (and grad_output)
        rank = len(call.in_shapes[planes[0]])
        x = "nc" + "HWD"[:rank - 2]
        ins = tuple(x if i in planes else ("c" if s == (call.in_shapes[planes[0]][1],) else "Z")
                    for i, s in enumerate(call.in_shapes))
        channels = call.in_shapes[planes[0]][1]
        outs = tuple(None if s is None else x if len(s) == rank else "c" if tuple(s) == (channels,) else
                     "Y" * len(s) for s in call.out_shapes)
        whole = "ZY" + ("nHWD" if training else "")
        statistics = frozenset(range(1, len(outs))) if not training and not backward else frozenset()
        return Letters(ins, outs, fixed=frozenset(whole), unreduced=statistics)

    return LetterRule(make)


class _GroupNormRule(LetterRule):
    """group norm(input (N, C, *spatial), weight, bias, N, C, HxW, group, eps): statistics per
    (sample, group), so samples shard and whole groups of channels shard (letter c marks the
    channels and the groups of the statistics together); spatial dims stay whole. Its size
    arguments become the local block's. Backward: (grad, input, mean, rstd, weight, N, C, HxW,
    group, mask) -> grads; a split batch gives partial weight and bias gradients."""

    def __init__(self, backward: bool):
        super().__init__(self._letters)
        self.backward = backward
        self.first_size = 5 if backward else 3  # the position of N

    def _letters(self, call: OpCall) -> Letters:
        rank = len(call.in_shapes[0])
        x = "nc" + "HWD"[:rank - 2]
        if self.backward:
            ins = (x, x) + tuple("nc" if len(s) == 2 else "c" for s in call.in_shapes[2:])
            outs = tuple(None if s is None else t for s, t in zip(call.out_shapes, (x, "c", "c")))
        else:
            ins = (x,) + ("c",) * (len(call.in_shapes) - 1)
            outs = (x, "nc", "nc")
        return Letters(ins, outs, fixed=frozenset("HWD"))

    def local_args(self, call: OpCall, local: LocalShapes) -> list:
        args = super().local_args(call, local)
        x = local.inputs[0]
        groups = call.args[self.first_size + 3] * x[1] // call.in_shapes[0][1]
        args[self.first_size:self.first_size + 4] = [x[0], x[1], math.prod(x[2:]), groups]
        return args


SPATIAL_RULES: dict = {
    **{op: _planar(1) for op in (aten.avg_pool1d.default, aten.adaptive_avg_pool1d.default)},
    **{op: _planar(2) for op in (aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default,
                                 aten.upsample_bilinear2d.vec, aten.upsample_nearest2d.vec)},
    **{op: _planar(3) for op in (aten.avg_pool3d.default, aten._adaptive_avg_pool3d.default)},
    aten.avg_pool2d_backward.default: _planar(2, backward=True),
    aten._adaptive_avg_pool2d_backward.default: _planar(2, backward=True),
    aten.max_pool2d_with_indices.default: _planar(2, linear=False),
    aten.max_pool3d_with_indices.default: _planar(3, linear=False),
    aten.max_pool2d_with_indices_backward.default: _planar(2, backward=True),
    **{op: _planar(0, pad_arg=1) for op in (aten.reflection_pad1d.default, aten.reflection_pad2d.default,
                                           aten.reflection_pad3d.default, aten.replication_pad2d.default,
                                           aten.replication_pad3d.default)},
    aten.grid_sampler_2d.default: LetterRule(_grid_sampler),
    aten.col2im.default: LetterRule(_col2im),
    aten._native_batch_norm_legit_functional.default: _batch_norm(training_arg=5),
    aten._native_batch_norm_legit.default: _batch_norm(training_arg=5),
    aten._native_batch_norm_legit.no_stats: _batch_norm(training_arg=3),
    aten._native_batch_norm_legit_no_training.default: _batch_norm(training_arg=None),
    aten.native_batch_norm_backward.default: _batch_norm(training_arg=7, name="train", backward=True),
    aten.native_group_norm.default: _GroupNormRule(backward=False),
    aten.native_group_norm_backward.default: _GroupNormRule(backward=True),
}
