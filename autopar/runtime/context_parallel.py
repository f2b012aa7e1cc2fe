"""Context parallelism: attention with its sequence split over a mesh axis.

Rank i of the axis's n holds positions [i c, (i + 1) c) of the query, key and value
(``Shard(2)``, c = S / n). Forward all-gathers the keys and values and attends the rank's
queries to the span of them its queries may see: every key without a causal mask; with one,
the keys before its block (no mask) and its own block (the causal mask, which is then aligned:
query j of the block sees keys 0..j of it). A mask tensor comes as the block's rows, over
every key, and the queries attend to every key under it. The spans' results are merged by their log-sum-exps,
as flash attention merges blocks (Dao et al., arXiv:2205.14135, §3.1), so the output and
log-sum-exp are those of attention over the whole sequence.

Backward gathers the keys and values again (keeping them from forward would hold the whole
sequence's keys per layer) and runs each span's backward with the merged output and
log-sum-exp, which is what a span's share of the gradient reads (the softmax of the whole row);
the keys' and values' gradients, summed over every rank's queries, are reduce-scattered back
to their blocks.

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


@between_graphs
def attention_all_gather(rt, axis: str, query, key, value, dropout_p: float = 0.0, is_causal: bool = False, *,
                         attn_mask=None, scale=None):
    """(output, log-sum-exp) of this rank's query block, attending to the whole sequence."""
    keys, values = _gathered(rt, axis, key, value)
    parts = [kernels.attention_forward(query, _span(keys, a, b), _span(values, a, b), 0.0, causal,
                                       attn_mask=attn_mask, scale=scale)
             for a, b, causal in _visible_spans(rt, axis, query.shape[SEQUENCE_DIM], is_causal)]
    if len(parts) == 1:
        return parts[0]
    logsumexp = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    output = sum(torch.exp(lse - logsumexp).unsqueeze(-1) * out.float() for out, lse in parts)
    return output.to(query.dtype), logsumexp


@between_graphs
def attention_all_gather_backward(rt, axis: str, grad_output, query, key, value, output, logsumexp,
                                  dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask=None, scale=None):
    """(grad query, grad key, grad value) of attention_all_gather, each this rank's block."""
    keys, values = _gathered(rt, axis, key, value)
    grad_query = torch.zeros_like(query, dtype=torch.float32)
    grad_keys = torch.zeros_like(keys, dtype=torch.float32)
    grad_values = torch.zeros_like(values, dtype=torch.float32)
    for a, b, causal in _visible_spans(rt, axis, query.shape[SEQUENCE_DIM], is_causal):
        grads = kernels.attention_backward(grad_output, query, _span(keys, a, b), _span(values, a, b), output,
                                           logsumexp, 0.0, causal, attn_mask=attn_mask, scale=scale)
        grad_query += grads[0]
        _span(grad_keys, a, b).add_(grads[1])
        _span(grad_values, a, b).add_(grads[2])
    return (grad_query.to(query.dtype), rt.reduce_scatter(grad_keys.to(key.dtype), axis, SEQUENCE_DIM),
            rt.reduce_scatter(grad_values.to(value.dtype), axis, SEQUENCE_DIM))
