"""Sharding rules of scaled dot-product attention, with the sequence split over a mesh axis.

Attention is independent per (batch, head), so those dims shard as letters do. Its query
sequence t and key sequence s stay whole under letters: every query reads every key. Context
parallelism splits them anyway, each rank holding a contiguous block of the query's positions
(``Shard(2)`` over one axis, and a mask's rows of that block), in two options:

- the keys and values split as the queries are: the rank's kernel all-gathers them over the
  axis, and backward gathers them again and reduce-scatters their gradients;
- the keys and values whole on the axis: the plan gathers them where its moves are cheapest
  (before grouped-query heads are repeated, say), and backward's gradients of them are
  partial sums, reduced where the plan's moves are cheapest.

Either way a rank attends its queries to every key, under a causal mask offset by its block's
position, so what it runs is a runtime kernel (autopar.runtime.context_parallel, named by
``Rule.kernel_axis`` / ``local_call``). This is the all-gather form of context parallelism
(Llama 3, arXiv:2407.21783, §3.3.2), whose messages are the keys and values once per layer
and direction.
"""
from __future__ import annotations

import torch

from autopar.ir.placement import P, R, Shard
from autopar.ir.strategy import Option
from autopar.ops.kinds import LetterRule, Letters, OpCall, letter_options, numel, operand_itemsize

SEQUENCE_DIM = 2  # of query, key, value, output (b, h, t, d) and log-sum-exp (b, h, t)
FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"

# what a rank runs under the sequence-split options (Rule.kernel_axis): keys gathered inside, or whole
ALL_GATHER_FORWARD = "context_parallel.attention_all_gather"
ALL_GATHER_BACKWARD = "context_parallel.attention_all_gather_backward"
WHOLE_KEYS_FORWARD = "context_parallel.attention_of_block"
WHOLE_KEYS_BACKWARD = "context_parallel.attention_of_block_backward"


def _sdpa_letters(call: OpCall, head: tuple[str, ...], outs: tuple[str, ...]) -> Letters:
    """Attention is independent per (batch, head): only those dims shard as letters."""
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


class AttentionRule(LetterRule):
    """Letters, plus the sequence split over an axis in two forms: the keys and values split as
    the queries are, gathered inside the kernel (``gathering``); or whole on the axis, where the
    plan's own moves gathered them, before the op (``whole_keys``: say before grouped-query
    heads are repeated, where they are fewer bytes), their gradients partial sums.

    ``operands``: the tensor inputs before any mask (3 in forward, 6 in backward);
    ``query``: the query's place among them (key and value follow it); ``dropout_arg``: the
    position of the dropout probability among the call's arguments."""

    def __init__(self, make, flop_fn, gathering: str, whole_keys: str, operands: int, query: int, dropout_arg: int,
                 backward: bool):
        super().__init__(make, flop_fn=flop_fn)
        self.gathering, self.whole_keys, self.operands, self.query = gathering, whole_keys, operands, query
        self.dropout_arg, self.backward = dropout_arg, backward

    def options(self, call: OpCall) -> list[Option]:
        letters = self.make(call)
        options = letter_options(letters)
        if self.splits_sequence(call):
            # a mask's rows are the queries': a rank reads its block's rows, every key's column
            masks = tuple(Shard(m.index("t")) if "t" in m else R for m in letters.inputs[self.operands:])
            block = Shard(SEQUENCE_DIM)
            options.append(Option((block,) * self.operands + masks, tuple(block for _ in call.out_shapes)))
            whole = [block] * self.operands
            whole[self.query + 1] = whole[self.query + 2] = R
            # backward: every rank's queries add to each key's and value's gradient
            outs = (block, P, P) if self.backward else (block, block)
            options.append(Option(tuple(whole) + masks, outs))
        return options

    def splits_sequence(self, call: OpCall) -> bool:
        """Whether the kernels compute this call with its sequence split: self-attention
        (queries and keys of one sequence, so a rank's query block and key block are the same
        positions) without dropout (its mask is drawn for the whole score matrix), and not both
        a mask tensor and the causal flag (the kernels apply one or the other)."""
        query, key = call.in_shapes[self.query], call.in_shapes[self.query + 1]
        masked = len(call.in_shapes) > self.operands
        causal = call.arg(self.dropout_arg + 1, "is_causal", False)
        return (query[SEQUENCE_DIM] == key[SEQUENCE_DIM] and not call.arg(self.dropout_arg, "dropout_p", 0.0)
                and not (masked and causal))

    def kernel_axis(self, in_specs) -> int | None:
        return sequence_axis(in_specs[self.query])

    def _gathers(self, in_specs, axis: int) -> bool:
        return keys_gathered(in_specs[self.query + 1], axis)

    def kernel_collectives(self, in_specs) -> tuple[str, ...]:
        axis = self.kernel_axis(in_specs)
        if axis is None or not self._gathers(in_specs, axis):
            return ()
        return ("all_gather", "reduce_scatter") if self.backward else ("all_gather",)

    def local_call(self, call, local):
        if local.inputs[self.query][SEQUENCE_DIM] == call.in_shapes[self.query][SEQUENCE_DIM]:
            return super().local_call(call, local)
        keys_whole = local.inputs[self.query + 1][SEQUENCE_DIM] == call.in_shapes[self.query + 1][SEQUENCE_DIM]
        return (self.whole_keys if keys_whole else self.gathering), list(call.args)

    def inner_time(self, call, in_specs, local, cost) -> float:
        """The sequence split with the keys gathered inside: their and the values' all-gathers
        (and in backward, their gradients' reduce-scatters), and the compute that ``flops`` at the
        local shapes leaves out: a rank's queries attend to every key, not to its own block only
        (priced without the causal mask's savings, as the whole op's FLOPs are). With the keys
        whole, ``flops`` at the local shapes is already the block's against every key."""
        axis = sequence_axis(in_specs[self.query])
        if axis is None or not self._gathers(in_specs, axis) or cost.mesh.shape[axis] == 1:
            return 0.0
        ranks = cost.mesh.shape[axis]
        key = local.inputs[self.query + 1]
        key_bytes = numel(key) * operand_itemsize(call, self.query + 1)
        moves = 2 * cost.collective_seconds("all_gather", key_bytes * ranks, axis)
        if self.backward:
            moves += 2 * cost.collective_seconds("reduce_scatter", key_bytes * ranks, axis)
        local_flops = self.flops(call, local.inputs, local.outputs)
        return moves + cost.op_time((ranks - 1) * local_flops, 0.0, operand_itemsize(call, self.query))

    def scratch_bytes(self, in_specs, local_inputs, itemsizes, mesh_shape) -> float:
        """The sequence split: the gathered keys and values (where the kernel gathers them);
        forward's spans' outputs and their merge in float32; backward's float32 sums of every
        key's and value's gradient, cast back (before the reduce-scatter, where it gathered), and
        the query's gradient in float32."""
        axis = sequence_axis(in_specs[self.query])
        if axis is None:
            return 0.0
        key = self.query + 1
        gathers = self._gathers(in_specs, axis)
        key_elements = numel(local_inputs[key]) * (mesh_shape[axis] if gathers else 1)
        query_elements = numel(local_inputs[self.query])
        gathered = 2 * key_elements * itemsizes[key] if gathers else 0.0
        if not self.backward:
            return gathered + 3 * query_elements * 4
        cast_back = 2 * key_elements * itemsizes[key] if gathers else 0.0
        return gathered + 2 * key_elements * 4 + cast_back + query_elements * 4


def query_spec(target, in_specs):
    """The query's layout among an attention call's input layouts (``target``: the op or its
    name; the query is the second input of backward, after the output's gradient)."""
    return in_specs[_query_index(target)]


def key_spec(target, in_specs):
    """The key's layout among an attention call's input layouts (it follows the query)."""
    return in_specs[_query_index(target) + 1]


def _query_index(target) -> int:
    return SDPA_BACKWARD.query if "backward" in str(target) else SDPA_FORWARD.query


def keys_gathered(key, axis: int) -> bool:
    """Whether the kernel gathers the keys over ``axis`` (their layout ``key`` splits them as the
    queries are), rather than taking them whole, gathered by the plan's moves."""
    return key.placements[axis] != R


def sequence_axis(spec) -> int | None:
    """The mesh axis a query's sequence is split over (context parallel), or None."""
    for axis, placement in enumerate(spec.placements):
        if placement == Shard(SEQUENCE_DIM):
            return axis
    return None


SDPA_FORWARD = AttentionRule(lambda c: _sdpa_letters(c, ("bhtd", "bhsd", "bhsd"), ("bhtd", "bht")),
                             flop_fn=_sdpa_flops, gathering=ALL_GATHER_FORWARD,
                             whole_keys=WHOLE_KEYS_FORWARD, operands=3, query=0, dropout_arg=3,
                             backward=False)
SDPA_BACKWARD = AttentionRule(
    lambda c: _sdpa_letters(c, ("bhtd", "bhtd", "bhsd", "bhsd", "bhtd", "bht"), ("bhtd", "bhsd", "bhsd")),
    flop_fn=_sdpa_backward_flops, gathering=ALL_GATHER_BACKWARD, whole_keys=WHOLE_KEYS_BACKWARD, operands=6,
    query=1, dropout_arg=6, backward=True)

ATTENTION_RULES: dict = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: SDPA_FORWARD,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default: SDPA_BACKWARD,
}
