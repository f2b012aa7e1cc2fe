"""Expert parallelism: a mixture-of-experts layer whose experts are split over a mesh axis.

Each rank holds ``E / n`` consecutive experts (``Shard(0)`` of the stacked expert weights) and
its own tokens. The ranks first all-gather their routing (the top-k expert indices: a few bytes
a token), from which each knows how many rows it sends to and receives from every rank and for
which of its experts each received row is (exchanging the sizes, then the experts' indices,
would be two collectives where this is one). The layer then sends every (token, expert) pair's
row to the rank of its expert by an uneven all-to-all, the experts run on what they received,
and a second all-to-all brings the outputs back, where the routing weights combine them. No
token is dropped, so the result equals the layer on one device.

Backward makes the same trip once: each pair's token row and its output gradient (weighted)
go to the expert, which recomputes its output and returns it with the row's gradient; the
experts' weight gradients stay where the experts are (they already sum over every rank's
tokens). The expert math is autopar.ops.moe's, shared with the single-device op.

Where the tokens are whole on the experts' axis (tensor parallelism left every rank of it all
tokens), no token moves: each rank runs its experts for the pairs routed to them, and returns
its summand of the layer's output (``experts_of_rank``); backward likewise returns summands of
the tokens' and routing weights' gradients, and its experts' weight gradients. The plan reduces
the summands with its own moves.

Under compile=True each of these kernels is a graph break: the program's statements around
it compile, and the kernel runs as written on the rank's RankMesh.
"""
from __future__ import annotations

import torch

from autopar.ops.moe import Routing, expert_backward, expert_forward
from autopar.runtime.graph_breaks import between_graphs


class _Dispatch:
    """One rank's pairs of a call, sorted by expert (so by the experts' rank), and the rows
    the other ranks send here, with the local expert each received row is for. ``rt``: the
    rank's mesh (autopar.runtime.rank_mesh.RankMesh, or validation's simulated one), whose
    ``exchange_rows`` is the uneven all-to-all."""

    def __init__(self, rt, axis: str, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, local_experts: int):
        self.rt, self.axis = rt, axis
        index = rt.mesh.axis_names.index(axis)
        rank, ranks = rt.coords[index], rt.mesh.shape[index]
        self.routing = Routing(top_k_index, top_k_weights)
        # each rank's pairs' experts in the order it sends them (sorted, as Routing sorts its own)
        everyone = torch.sort(rt.all_gather(top_k_index.contiguous(), axis, 0).reshape(ranks, -1), dim=1).values
        owner = everyone // local_experts
        self.send = torch.bincount(owner[rank], minlength=ranks).tolist()
        here = owner == rank
        self.received = here.sum(dim=1).tolist()
        arrived = everyone[here] % local_experts  # rank 0's rows first, each rank's in its order
        # rows from different ranks interleave their experts: group them by expert for the GEMMs
        self.by_expert = torch.argsort(arrived, stable=True)
        self.counts = torch.bincount(arrived, minlength=local_experts).tolist()

    def to_experts(self, rows: torch.Tensor) -> torch.Tensor:
        """Each sorted pair's row, sent to its expert's rank: the rows this rank's experts get."""
        return self.rt.exchange_rows(rows, self.axis, self.send, self.received)

    def back(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows computed for the received pairs, returned to the ranks that sent them."""
        return self.rt.exchange_rows(rows, self.axis, self.received, self.send)

    def grouped(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[self.by_expert]

    def ungrouped(self, rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(rows)
        out[self.by_expert] = rows
        return out


@between_graphs
def experts_all_to_all(rt, axis: str, x, top_k_index, top_k_weights, gate_up, down):
    """autopar::moe_experts with tokens and experts split over ``axis`` (gate_up, down: this
    rank's experts)."""
    trip = _Dispatch(rt, axis, top_k_index, top_k_weights, gate_up.shape[0])
    rows = trip.grouped(trip.to_experts(x[trip.routing.tokens]))
    outputs = trip.back(trip.ungrouped(expert_forward(rows, trip.counts, gate_up, down)))
    return trip.routing.combine(outputs, x)


@between_graphs
def experts_all_to_all_backward(rt, axis: str, grad, x, top_k_index, top_k_weights, gate_up, down):
    """autopar::moe_experts_backward with tokens and experts split over ``axis``: (grad x,
    grad top_k_weights, grad gate_up, grad down), the last two of this rank's experts."""
    trip = _Dispatch(rt, axis, top_k_index, top_k_weights, gate_up.shape[0])
    routing, width = trip.routing, x.shape[1]
    token_grads = grad[routing.tokens]
    weighted = (token_grads * routing.weights[:, None]).to(x.dtype)
    sent = trip.grouped(trip.to_experts(torch.cat([x[routing.tokens], weighted], dim=1)))
    outputs, grad_rows, grad_gate_up, grad_down = expert_backward(sent[:, :width], sent[:, width:], trip.counts,
                                                                  gate_up, down)
    returned = trip.back(trip.ungrouped(torch.cat([outputs, grad_rows], dim=1)))
    grad_x = torch.zeros_like(x).index_add_(0, routing.tokens, returned[:, width:])
    grad_weights = routing.unsort((token_grads * returned[:, :width]).sum(-1), top_k_weights)
    return grad_x, grad_weights, grad_gate_up, grad_down


class _OwnPairs:
    """The pairs of a call routed to this rank's experts (every token here), sorted by expert,
    with each local expert's count; the other pairs sorted after them."""

    def __init__(self, rt, axis: str, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, local_experts: int):
        first = rt.coords[rt.mesh.axis_names.index(axis)] * local_experts
        here = (top_k_index >= first) & (top_k_index < first + local_experts)
        # another rank's expert counts as one past the last local one: sorted after every own pair
        self.routing = Routing(torch.where(here, top_k_index - first, local_experts), top_k_weights)
        counts = torch.bincount(self.routing.experts, minlength=local_experts + 1).tolist()
        self.counts, self.n = counts[:local_experts], sum(counts[:local_experts])


@between_graphs
def experts_of_rank(rt, axis: str, x, top_k_index, top_k_weights, gate_up, down):
    """autopar::moe_experts with every token on this rank and its experts split over ``axis``:
    this rank's summand of the output (its experts' weighted outputs)."""
    own = _OwnPairs(rt, axis, top_k_index, top_k_weights, gate_up.shape[0])
    return own.routing.combine(expert_forward(x[own.routing.tokens[:own.n]], own.counts, gate_up, down), x)


@between_graphs
def experts_of_rank_backward(rt, axis: str, grad, x, top_k_index, top_k_weights, gate_up, down):
    """autopar::moe_experts_backward with every token on this rank: (this rank's summands of
    grad x and grad top_k_weights, grad gate_up, grad down of its experts)."""
    own = _OwnPairs(rt, axis, top_k_index, top_k_weights, gate_up.shape[0])
    return own.routing.backward(own.n, own.counts, grad, x, top_k_weights, gate_up, down)
