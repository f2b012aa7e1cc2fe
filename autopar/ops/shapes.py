"""Sharding rules of ops that rearrange a tensor's elements along some dims: flip, diagonal,
repeat, Fourier transforms. Each is linear, so a partial sum passes through (where its dtypes
allow one); the dims it works along stay whole."""
from __future__ import annotations

import string

import torch

from autopar.ops.kinds import LetterRule, Letters, OpCall

aten = torch.ops.aten


def _flip(call: OpCall) -> Letters:
    """flip(self, dims): the flipped dims stay whole (a block's mirror is another block's)."""
    rank = len(call.in_shapes[0])
    letters = string.ascii_lowercase[:rank]
    flipped = {d % rank for d in call.args[1]} if rank else set()
    return Letters((letters,), (letters,), fixed=frozenset(letters[d] for d in flipped),
                   partial_inputs=(frozenset({0}),))


def _diagonal(call: OpCall) -> Letters:
    """diagonal(self, offset, dim1, dim2): the two dims it walks stay whole; the diagonal
    becomes the output's last dim."""
    rank = len(call.in_shapes[0])
    letters = string.ascii_lowercase[:rank]
    d1, d2 = call.arg(2, "dim1", 0) % rank, call.arg(3, "dim2", 1) % rank
    rest = "".join(c for i, c in enumerate(letters) if i not in (d1, d2))
    return Letters((letters,), (rest + "Z",), fixed=frozenset(letters[d1] + letters[d2] + "Z"),
                   partial_inputs=(frozenset({0}),))


def _repeat(call: OpCall) -> Letters:
    """repeat(self, repeats): a dim repeated once keeps its letter; a dim tiled k > 1 times, and
    the leading dims repeat adds, stay whole."""
    repeats = list(call.args[1])
    rank, out_rank = len(call.in_shapes[0]), len(repeats)
    offset = out_rank - rank
    own = "".join(string.ascii_lowercase[i] if repeats[offset + i] == 1 else string.ascii_uppercase[i]
                  for i in range(rank))
    out = "".join(string.ascii_uppercase[10 + j] for j in range(offset)) + "".join(
        c if c.islower() else string.ascii_uppercase[20 + i] for i, c in enumerate(own))
    return Letters((own,), (out,), fixed=frozenset(string.ascii_uppercase), partial_inputs=(frozenset({0}),))


def _fft(call: OpCall) -> Letters:
    """_fft_r2c / _fft_c2r / _fft_c2c(self, dim, ...): the transformed dims stay whole (the
    last one changes size from real to one-sided complex); the others shard."""
    rank = len(call.in_shapes[0])
    letters = string.ascii_lowercase[:rank]
    dims = sorted(d % rank for d in call.args[1])
    out = letters[:dims[-1]] + "Z" + letters[dims[-1] + 1:]
    return Letters((letters,), (out,), fixed=frozenset("Z" + "".join(letters[d] for d in dims)),
                   partial_inputs=(frozenset({0}),))


SHAPE_RULES: dict = {
    aten._fft_r2c.default: LetterRule(_fft, follower=True),
    aten._fft_c2r.default: LetterRule(_fft, follower=True),
    aten._fft_c2c.default: LetterRule(_fft, follower=True),
    aten.flip.default: LetterRule(_flip, follower=True),
    aten.diagonal.default: LetterRule(_diagonal, follower=True, free=True),
    aten.repeat.default: LetterRule(_repeat, follower=True),
}
