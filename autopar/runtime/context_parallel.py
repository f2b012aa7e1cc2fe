"""Context parallelism: attention with its sequence split over a mesh axis.

Rank i of the axis's n holds positions [i c, (i + 1) c) of the query (``Shard(2)``, c = S / n)
and attends them to every key: with a causal flag, to the keys before its block (no mask) and
to its own block (the causal mask, which is then aligned: query j of the block sees keys 0..j
of it); with a mask tensor, which comes as the block's rows, to every key under it. The
spans' results are merged by their log-sum-exps, as flash attention merges blocks (Dao et al.,
arXiv:2205.14135, §3.1), so the output and log-sum-exp are those of attention over the whole
sequence. Backward runs each span's backward with the merged output and log-sum-exp, which is
what a span's share of the gradient reads (the softmax of the whole row).

Two pairs of kernels, by where the keys and values are gathered (autopar.ops.attention):

- ``attention_all_gather``: the keys and values come split as the queries are; the kernel
  all-gathers them, and its backward gathers them again (keeping them from forward would hold
  the whole sequence's keys per layer) and reduce-scatters their gradients to their blocks;
- ``attention_of_block``: the keys and values come whole (the plan gathered them); backward
  returns this rank's summand of their gradients (the plan reduces them).

The attention kernels are autopar.runtime.kernels', which run the device's own.
"""
from __future__ import annotations

import torch

from autopar.ops.attention import SEQUENCE_DIM
from autopar.runtime import kernels
from autopar.runtime.graph_breaks import between_graphs


def _visible_spans(rt, axis: str, block: int, is_causal: bool) -> list[tuple[int, int, bool]]:
    """(start, end, causal) of the gathered keys the rank's query block attends to (all of them
    under a mask tensor, whose rows of the block say which it sees)."""
    index = rt.mesh.axis_names.index(axis)
    rank, ranks = rt.coords[index], rt.mesh.shape[index]
    if not is_causal:
        return [(0, ranks * block, False)]
    before = [(0, rank * block, False)] if rank else []
    return before + [(rank * block, (rank + 1) * block, True)]


def _gathered(rt, axis: str, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [rt.all_gather(t.contiguous(), axis, SEQUENCE_DIM) for t in tensors]


def _span(x: torch.Tensor, start: int, end: int) -> torch.Tensor:
    return x.narrow(SEQUENCE_DIM, start, end - start)


def _attend(rt, axis: str, query, keys, values, is_causal: bool, attn_mask, scale):
    """(output, log-sum-exp) of the rank's query block against the whole sequence's keys."""
    parts = [kernels.attention_forward(query, _span(keys, a, b), _span(values, a, b), 0.0, causal,
                                       attn_mask=attn_mask, scale=scale)
             for a, b, causal in _visible_spans(rt, axis, query.shape[SEQUENCE_DIM], is_causal)]
    if len(parts) == 1:
        return parts[0]
    logsumexp = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    output = sum(torch.exp(lse - logsumexp).unsqueeze(-1) * out.float() for out, lse in parts)
    return output.to(query.dtype), logsumexp


def _attend_backward(rt, axis: str, grad_output, query, keys, values, output, logsumexp, is_causal: bool,
                     attn_mask, scale):
    """(grad query, grad keys, grad values) of _attend: the keys' and values' gradients over the
    whole sequence, this rank's queries' share of them."""
    grad_query = torch.zeros_like(query, dtype=torch.float32)
    grad_keys = torch.zeros_like(keys, dtype=torch.float32)
    grad_values = torch.zeros_like(values, dtype=torch.float32)
    for a, b, causal in _visible_spans(rt, axis, query.shape[SEQUENCE_DIM], is_causal):
        grads = kernels.attention_backward(grad_output, query, _span(keys, a, b), _span(values, a, b), output,
                                           logsumexp, 0.0, causal, attn_mask=attn_mask, scale=scale)
        grad_query += grads[0]
        _span(grad_keys, a, b).add_(grads[1])
        _span(grad_values, a, b).add_(grads[2])
    return grad_query.to(query.dtype), grad_keys.to(keys.dtype), grad_values.to(values.dtype)


@between_graphs
def attention_all_gather(rt, axis: str, query, key, value, dropout_p: float = 0.0, is_causal: bool = False, *,
                         attn_mask=None, scale=None):
    """(output, log-sum-exp) of this rank's query block, its keys and values gathered here."""
    keys, values = _gathered(rt, axis, key, value)
    return _attend(rt, axis, query, keys, values, is_causal, attn_mask, scale)


@between_graphs
def attention_all_gather_backward(rt, axis: str, grad_output, query, key, value, output, logsumexp,
                                  dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask=None, scale=None):
    """(grad query, grad key, grad value) of attention_all_gather, each this rank's block."""
    keys, values = _gathered(rt, axis, key, value)
    grad_query, grad_keys, grad_values = _attend_backward(rt, axis, grad_output, query, keys, values, output,
                                                          logsumexp, is_causal, attn_mask, scale)
    return (grad_query, rt.reduce_scatter(grad_keys, axis, SEQUENCE_DIM),
            rt.reduce_scatter(grad_values, axis, SEQUENCE_DIM))


@between_graphs
def attention_of_block(rt, axis: str, query, key, value, dropout_p: float = 0.0, is_causal: bool = False, *,
                       attn_mask=None, scale=None):
    """(output, log-sum-exp) of this rank's query block, given the whole sequence's keys and
    values (the plan gathered them before the call)."""
    return _attend(rt, axis, query, key, value, is_causal, attn_mask, scale)


@between_graphs
def attention_of_block_backward(rt, axis: str, grad_output, query, key, value, output, logsumexp,
                                dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask=None, scale=None):
    """(grad query, grad key, grad value) of attention_of_block: the query's gradient of this
    rank's block; the whole keys' and values' gradients, this rank's summand of them."""
    return _attend_backward(rt, axis, grad_output, query, key, value, output, logsumexp, is_causal, attn_mask,
                            scale)
