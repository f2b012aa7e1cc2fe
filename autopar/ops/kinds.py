"""Rule kinds: how an op may be laid out along one mesh axis.

A rule turns an ``OpCall`` (the op, its non-tensor arguments and the global
shapes of its tensor inputs and outputs) into 1-D ``Option``s. The strategy
expander combines options across mesh axes. Most ops are described by *letters*
(einsum notation): sharding a letter shards every operand that has it; an output
without the letter holds a partial sum.
"""
from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autopar.ir.placement import P, R, Shard
from autopar.ir.strategy import Option


class RuleDoesNotApply(Exception):
    """Raised by a rule for a call it cannot describe; the op then gets the Replicate fallback."""


@dataclass(frozen=True)
class OpCall:
    target: Any
    args: tuple
    kwargs: dict
    in_shapes: tuple[tuple[int, ...], ...]  # one per tensor input, in flattened argument order
    out_shapes: tuple[tuple[int, ...] | None, ...]  # None where an output is not a tensor
    in_floating: tuple[bool, ...] = ()
    in_dtypes: tuple[str | None, ...] = ()  # "float32", ... per tensor input (empty: not known)
    out_dtypes: tuple[str | None, ...] = ()  # per output, None where it is not a tensor
    # the plan's precision lets partial sums be rounded to a lower precision before they are summed
    # (MixedPrecision(reduce=<the compute dtype>)); otherwise a cast down never takes a partial sum
    low_precision_partials: bool = False

    def arg(self, index: int, name: str, default=None):
        if index < len(self.args):
            return self.args[index]
        return self.kwargs.get(name, default)


@dataclass(frozen=True)
class LocalShapes:
    """The shapes of one call's tensors as a rank holds them under one strategy: what a rule
    rewrites size-like arguments from (``Rule.local_args``); with that strategy's input layouts,
    where shapes alone leave two kernels apart (``Rule.local_call``)."""

    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...] | None, ...]
    in_specs: tuple = ()


@dataclass(frozen=True)
class Letters:
    """Einsum-style description of one op call."""

    inputs: tuple[str | None, ...]
    outputs: tuple[str | None, ...]
    fixed: frozenset = frozenset()  # letters that must stay whole (normalised, sliced, max-reduced...)
    additive: frozenset = frozenset()  # inputs added to the result (a bias): Partial when the sum is split
    partial_inputs: tuple[frozenset, ...] = ()  # input sets that may be Partial (rest Replicate) -> Partial out
    # outputs that do not sum over the letters they lack (batch norm's running statistics in
    # evaluation pass through): replicated, not partial, where such a letter is split
    unreduced: frozenset = frozenset()


def letter_options(lt: Letters) -> list[Option]:
    n_out = len(lt.outputs)
    opts = [Option(tuple(R for _ in lt.inputs), tuple(R for _ in lt.outputs))]
    used = sorted({c for s in lt.inputs + lt.outputs if s for c in s} - set(lt.fixed))
    for c in used:
        contracted = not any(s and c in s for s in lt.outputs)
        ins = []
        for j, s in enumerate(lt.inputs):
            if s and c in s:
                ins.append(Shard(s.index(c)))
            elif j in lt.additive and contracted:
                ins.append(P)
            else:
                ins.append(R)
        outs = tuple(Shard(s.index(c)) if (s and c in s) else (P if s is not None and j not in lt.unreduced else R)
                     for j, s in enumerate(lt.outputs))
        opts.append(Option(tuple(ins), outs))
    for pset in lt.partial_inputs:
        opts.append(Option(tuple(P if j in pset else R for j in range(len(lt.inputs))), (P,) * n_out))
    return opts


class Rule:
    """Base: a rule produces options; ``follower`` ops take their single input's layout."""

    follower: bool = False
    shape_arg: int | None = None  # argument holding the output size: rewritten to the local size
    free: bool = False  # metadata-only (a view): no kernel runs, so no compute time

    def options(self, call: OpCall) -> list[Option]:
        raise NotImplementedError

    def flops(self, call: OpCall, in_shapes, out_shapes) -> float:
        return 1.0 * sum(numel(s) for s in out_shapes if s is not None)  # 1.0 *, not float(): sizes may be symbols

    def inner_time(self, call: OpCall, in_specs, local: LocalShapes, cost) -> float:
        """Seconds a strategy's local op takes beyond its FLOPs at its local shapes: collectives
        it runs itself and waits for a busier rank (a layer whose communication is inside it:
        autopar.ops.moe). Moves between ops are priced on the edges."""
        return 0.0

    def scratch_bytes(self, in_specs, local_inputs: tuple, itemsizes: tuple, mesh_shape: tuple) -> float:
        """Bytes a strategy's local op holds only while it runs, beyond its outputs, given its
        inputs' local shapes and item sizes: what a kernel whose ranks communicate gathers
        (autopar.ops.attention). The memory model counts them at the op."""
        return 0.0

    def kernel_collectives(self, in_specs) -> tuple[str, ...]:
        """The kinds of collective the runtime kernel of a strategy runs over ``kernel_axis``
        (what ``explain`` lists as inside the op)."""
        return ()

    def kernel_axis(self, in_specs) -> int | None:
        """The mesh axis whose ranks communicate inside what a strategy runs, or None (a local
        op). Where it is an axis, ``local_call`` names a runtime kernel (``"module.function"`` of
        autopar.runtime), called with the rank's mesh and that axis's name before the op's
        arguments: a layer whose collectives depend on run-time values (autopar.ops.moe)."""
        return None

    def local_args(self, call: OpCall, local: LocalShapes) -> list:
        """The call's positional arguments as a rank passes them: by default the output size
        argument (``shape_arg``: view, expand, factories) becomes the local block's size."""
        args = list(call.args)
        if self.shape_arg is not None and self.shape_arg < len(args):
            args[self.shape_arg] = list(local.outputs[0])
        return args

    def local_call(self, call: OpCall, local: LocalShapes) -> tuple[Any, list]:
        """(the op a rank runs, its positional arguments): the call's own op, with ``local_args``."""
        return call.target, self.local_args(call, local)


def communicating_axis(rule: Rule, in_specs, mesh_shape) -> int | None:
    """The mesh axis whose ranks communicate inside what ``rule`` runs for a strategy
    (``Rule.kernel_axis``), where that axis has more than one rank: over a single rank a block
    is the whole tensor, and ``local_call`` runs the op itself."""
    axis = rule.kernel_axis(in_specs)
    return axis if axis is not None and mesh_shape[axis] > 1 else None


def operand_itemsize(call: OpCall, operand: int) -> int:
    """The bytes per element of a call's tensor input (4 where its dtype is not known)."""
    dtype = call.in_dtypes[operand] if call.in_dtypes else None
    return getattr(torch, dtype).itemsize if dtype else 4


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _fresh(taken: set) -> str:
    for c in string.ascii_uppercase:
        if c not in taken:
            taken.add(c)
            return c
    raise ValueError("op has too many broadcast dims")


@dataclass
class LetterRule(Rule):
    """A rule given by a function from the call to its ``Letters``."""

    make: Callable[[OpCall], Letters]
    follower: bool = False
    shape_arg: int | None = None
    contraction: bool = False  # flops = 2 * prod(letter sizes), as for matmuls
    flop_fn: Callable | None = None
    free: bool = False

    def options(self, call: OpCall) -> list[Option]:
        return letter_options(self.make(call))

    def flops(self, call, in_shapes, out_shapes) -> float:
        if self.flop_fn is not None:
            return self.flop_fn(in_shapes, out_shapes)
        if self.contraction:
            lt = self.make(call)
            sizes = {}
            for s, shape in zip(lt.inputs, in_shapes):
                for c, n in zip(s or "", shape):
                    sizes[c] = n
            return 2.0 * numel(sizes.values())
        return super().flops(call, in_shapes, out_shapes)


def einsum(equation: str, bias: str | None = None) -> LetterRule:
    """``einsum("mk,kn->mn", bias="n")``: a contraction, optionally with an added bias first."""
    lhs, rhs = equation.split("->")
    operands = tuple(lhs.split(","))
    if bias is not None:
        operands = (bias,) + operands

    def make(call: OpCall) -> Letters:
        ins = operands
        if bias is not None:
            # the bias may be given at full output rank instead of broadcast
            ins = (rhs[-len(call.in_shapes[0]):] if call.in_shapes[0] else "",) + operands[1:]
        return Letters(ins, (rhs,), additive=frozenset({0}) if bias is not None else frozenset())

    return LetterRule(make, contraction=True)


def broadcast_letters(call: OpCall) -> tuple[list[str], str, frozenset]:
    """(each tensor input's letters, the output's, the letters that stay whole) of an
    elementwise call: an input dim of the output's size shares its letter, a broadcast dim
    (size 1 against a larger output dim) gets a letter of its own that is never split."""
    out = call.out_shapes[0]
    rank = len(out)
    out_letters = string.ascii_lowercase[:rank]
    taken = set(out_letters)
    ins = []
    for shape in call.in_shapes:
        s = ""
        offset = rank - len(shape)
        for i, n in enumerate(shape):
            s += out_letters[offset + i] if n == out[offset + i] else _fresh(taken)
        ins.append(s)
    return ins, out_letters, frozenset(taken - set(out_letters))


def pointwise(linear: str = "none", follower: bool = True) -> LetterRule:
    """Elementwise op with broadcasting.

    ``linear`` says when a partial sum may flow through: "all" (add/sub: every
    tensor input partial), "one" (mul: one partial, others replicated), "first"
    (div, or a backward op linear in its gradient argument), "none".
    """

    def make(call: OpCall) -> Letters:
        ins, out_letters, fixed = broadcast_letters(call)
        n = len(ins)
        floating = all(call.in_floating) if call.in_floating else True
        partial: tuple = ()
        operands = call.args[:2]
        numbers = [isinstance(a, (int, float, bool)) for a in operands]
        mode = linear
        if mode == "all" and any(numbers):
            mode = "none"  # x + 1.0 is not linear: each rank would add the constant to its summand
        if mode == "first" and operands and numbers[0]:
            mode = "none"  # 2.0 / x: the tensor is not the linear operand
        if floating and n:
            if mode == "all":
                partial = (frozenset(range(n)),)
            elif mode == "one":
                partial = tuple(frozenset({j}) for j in range(n))
            elif mode == "first":
                partial = (frozenset({0}),)
        return Letters(tuple(ins), tuple(out_letters if o is not None else None for o in call.out_shapes),
                       fixed=fixed, partial_inputs=partial)

    return LetterRule(make, follower=bool(follower))


def unary(linear: bool = False, free: bool = False) -> LetterRule:
    rule = pointwise("first" if linear else "none", follower=True)
    rule.free = free
    return rule


def _dims(value, rank: int) -> list[int]:
    if rank == 0:
        return []  # a 0-d tensor: nothing to name
    if value is None:
        return list(range(rank))
    if isinstance(value, int):
        value = [value]
    return sorted(d % rank if rank else 0 for d in value)


def reduction(dims_arg: int | None, keepdim_arg: int | None, kind: str) -> LetterRule:
    """A reduction over ``dims_arg`` (None: every dim), keeping them as size 1 where the
    ``keepdim`` argument (position ``keepdim_arg``, or keyword) says. ``kind`` is "sum" (a
    split sum gives a partial sum), "mean" (linear, but the reduced dims stay whole) or
    "whole" (neither: max, any, argmax, var, prod: the reduced dims stay whole). Every tensor
    output (max.dim's values and indices) takes the reduced letters."""

    def make(call: OpCall) -> Letters:
        rank = len(call.in_shapes[0])
        letters = string.ascii_lowercase[:rank]
        dims = _dims(call.arg(dims_arg, "dim") if dims_arg is not None else None, rank)
        keep = bool(call.arg(keepdim_arg, "keepdim", False) if keepdim_arg is not None
                    else call.kwargs.get("keepdim", False))
        out = "".join((c.upper() if keep else "") if i in dims else c for i, c in enumerate(letters))
        fixed = {c.upper() for c in letters}
        if kind != "sum":
            fixed |= {letters[d] for d in dims}
        partial = (frozenset({0}),) if kind != "whole" and len(call.out_shapes) == 1 else ()
        outs = tuple(None if s is None else out for s in call.out_shapes)
        return Letters((letters,), outs, fixed=frozenset(fixed), partial_inputs=partial)

    return LetterRule(make, follower=True)


def normalize(dim_arg: int) -> LetterRule:
    """softmax/log_softmax (and their backward): the normalised dim stays whole."""

    def make(call: OpCall) -> Letters:
        rank = len(call.out_shapes[0])
        letters = string.ascii_lowercase[:rank]
        d = call.arg(dim_arg, "dim") % rank if rank else 0
        fixed = frozenset({letters[d]}) if rank else frozenset()
        return Letters((letters,) * len(call.in_shapes), (letters,), fixed=fixed)

    return LetterRule(make, follower=True)


def letters(ins: Sequence[str | None], outs: Sequence[str | None], fixed: str = "", additive=(),
            flop_fn=None, contraction=False) -> LetterRule:
    """A fixed-rank op written out by hand, e.g. embedding ``("vh", "bt") -> "bth"``."""
    lt = Letters(tuple(ins), tuple(outs), fixed=frozenset(fixed), additive=frozenset(additive))
    return LetterRule(lambda call: lt, flop_fn=flop_fn, contraction=contraction)


@dataclass
class ReplicateOnly(Rule):
    """The op's only correct layout is replicated everywhere (say why in the table)."""

    reason: str = ""

    def options(self, call: OpCall) -> list[Option]:
        return [Option(tuple(R for _ in call.in_shapes), tuple(R for _ in call.out_shapes))]


@dataclass
class ViewRule(Rule):
    """view/reshape/squeeze/unsqueeze: a sharded dim survives when it leads its group of merged or split dims.

    A rank runs ``reshape`` to its block's output shape (``local_call``): a view's strides need
    not hold for a block (a collective's output is contiguous, say), and squeeze would also
    drop a dim that only the block has of size 1."""

    follower: bool = True
    free: bool = True
    shape_arg: int | None = 1
    reshape_locally: bool = True  # unsqueeze's own call is right on any block

    def local_call(self, call: OpCall, local: LocalShapes) -> tuple[Any, list]:
        if not self.reshape_locally:
            return super().local_call(call, local)
        return torch.ops.aten.reshape.default, [call.args[0], list(local.outputs[0])]

    def options(self, call: OpCall) -> list[Option]:
        src, dst = call.in_shapes[0], call.out_shapes[0]
        opts = [Option((R,), (R,)), Option((P,), (P,))]
        for ia, ib in view_groups(src, dst):
            lead_a = next((i for i in ia if src[i] > 1), None)
            lead_b = next((j for j in ib if dst[j] > 1), None)
            if lead_a is not None and lead_b is not None:
                opts.append(Option((Shard(lead_a),), (Shard(lead_b),)))
        return opts


def view_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair up runs of dims of equal product: [2, 8, 16] -> [16, 16] gives ([0, 1], [0]), ([2], [1])."""
    groups = []
    i = j = 0
    while i < len(src) and j < len(dst):
        ia, ib = [i], [j]
        pa, pb = src[i], dst[j]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb and i < len(src):
                ia.append(i)
                pa *= src[i]
                i += 1
            elif j < len(dst):
                ib.append(j)
                pb *= dst[j]
                j += 1
            else:
                break
        groups.append((ia, ib))
    return groups


@dataclass
class ExpandRule(Rule):
    """expand: kept dims follow the input; broadcast dims may be sharded from a replicated input."""

    follower: bool = True
    free: bool = True
    shape_arg: int | None = 1

    def options(self, call: OpCall) -> list[Option]:
        src, dst = call.in_shapes[0], call.out_shapes[0]
        offset = len(dst) - len(src)
        opts = [Option((R,), (R,)), Option((P,), (P,))]
        for d in range(len(dst)):
            i = d - offset
            if i >= 0 and src[i] == dst[d]:
                opts.append(Option((Shard(i),), (Shard(d),)))
            else:
                opts.append(Option((R,), (Shard(d),)))
        return opts


@dataclass
class PermuteRule(Rule):
    """permute / transpose / t: placements move with the dims."""

    kind: str = "permute"
    follower: bool = True
    free: bool = True

    def options(self, call: OpCall) -> list[Option]:
        rank = len(call.in_shapes[0])
        if self.kind == "t":
            perm = list(range(rank))[::-1]
        elif self.kind == "transpose":
            a, b = call.args[1] % rank, call.args[2] % rank
            perm = list(range(rank))
            perm[a], perm[b] = perm[b], perm[a]
        else:
            perm = [d % rank for d in call.args[1]]
        opts = [Option((R,), (R,)), Option((P,), (P,))]
        for out_dim, in_dim in enumerate(perm):
            opts.append(Option((Shard(in_dim),), (Shard(out_dim),)))
        return opts


@dataclass
class FactoryRule(Rule):
    """full/zeros/ones/empty: each rank makes its local block directly."""

    shape_arg: int | None = 0
    shardable: bool = True

    stride_arg: int | None = None  # empty_strided's strides: rewritten to the local block's

    def options(self, call: OpCall) -> list[Option]:
        opts = [Option((), (R,))]
        if self.shardable:
            opts += [Option((), (Shard(d),)) for d in range(len(call.out_shapes[0]))]
        return opts

    def inner_communication_time(self, call: OpCall, in_specs, local: LocalShapes, cost) -> float:
        """Seconds of the collectives a strategy's local op runs itself (a layer whose
        communication is inside it: autopar.ops.moe); moves between ops are priced on edges."""
        return 0.0

    def local_args(self, call: OpCall, local: LocalShapes) -> list:
        args = super().local_args(call, local)
        if self.stride_arg is not None and self.stride_arg < len(args):
            args[self.stride_arg] = strides_in_order(list(local.outputs[0]), args[self.stride_arg])
        return args


@dataclass
class NewFactoryRule(FactoryRule):
    """new_empty / new_zeros / new_full / new_empty_strided(self, size, ...): a factory that
    reads only its input's dtype and device, so the input may lie in any layout."""

    shape_arg: int | None = 1

    def options(self, call: OpCall) -> list[Option]:
        rank = len(call.in_shapes[0])
        ins = [R, P] + [Shard(d) for d in range(rank)]
        outs = [R] + [Shard(d) for d in range(len(call.out_shapes[0]))]
        return [Option((i,), (o,)) for i in ins for o in outs]


def strides_in_order(shape: list[int], global_strides) -> list[int]:
    """Dense strides for ``shape`` that order its dims as ``global_strides`` does (a block of a
    tensor laid out channels-last is laid out channels-last)."""
    order = sorted(range(len(shape)), key=lambda d: (global_strides[d], shape[d]))  # innermost first
    strides, step = [0] * len(shape), 1
    for d in order:
        strides[d] = step
        step *= max(shape[d], 1)
    return strides


def fixed_dim_rule(dim_arg: int, free: bool = False) -> LetterRule:
    """slice/select/split (views: ``free``) and cat: the dim they cut or join stays whole."""

    def make(call: OpCall) -> Letters:
        # cat skips an empty 1-D operand whatever the others' rank (a key cache's empty start,
        # torch.tensor([])): it stays whole and the others' dims, not its one, can be split
        skipped = [tuple(s) == (0,) for s in call.in_shapes]
        rank = len(next((s for s, skip in zip(call.in_shapes, skipped) if not skip), call.in_shapes[0]))
        letters = string.ascii_lowercase[:rank]
        d = call.arg(dim_arg, "dim", 0) % rank
        outs = []
        for shape in call.out_shapes:
            if shape is None:
                outs.append(None)
            elif len(shape) == rank:
                outs.append(letters)
            else:  # select drops the dim
                outs.append(letters[:d] + letters[d + 1:])
        ins = tuple(None if skip and rank != 1 else letters for skip in skipped)
        return Letters(ins, tuple(outs), fixed=frozenset({letters[d]}),
                       partial_inputs=(frozenset(j for j, s in enumerate(ins) if s is not None),))

    return LetterRule(make, follower=True, free=free)
