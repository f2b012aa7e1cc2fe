"""Mixture-of-experts layers as one op each: ``autopar::moe_experts`` and its backward.

Hugging Face's MoE models (Mixtral, Qwen2-MoE, DeepSeek-V3, ...) hold their experts in one
module: ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I), called with the tokens
(T, H), each token's top-k experts (T, k) and their routing weights (T, k). Captured op by op,
its routing (sort, bincount, grouped matmul by offsets) is a tangle of data-dependent ops no
per-op rule may split by expert. Capture replaces the whole module by this op
(autopar.capture.moe_regions), so the planner decides the layer's layout once:

- the tokens split, experts replicated (data parallel: a rank runs its own tokens);
- expert parallel over an axis: tokens and experts both split over it; each rank sends its
  tokens to their experts' ranks by all-to-all and gets the results back (a runtime kernel,
  autopar.runtime.moe, which the rule names as the op a rank runs);
- expert parallel over an axis the tokens are whole on (Megatron-Core's all-gather dispatcher,
  where tensor parallelism left every rank of the axis all tokens): each rank runs its experts
  for every token routed to them, and its output is a partial sum that the plan reduces (the
  tokens gathered and the outputs reduced by the plan's own moves, where they are cheapest).

The math of an expert (SwiGLU: ``down @ (silu(gate) * up)``) lives here once, in
``expert_forward`` / ``expert_backward`` over rows grouped by expert; the reference op and
the runtime's expert-parallel kernel both call it, so they compute the same thing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from autopar.ir.placement import P, R, Shard
from autopar.ir.strategy import Option
from autopar.ops.kinds import LetterRule, Letters, OpCall, letter_options, operand_itemsize

# what a rank runs under the expert-parallel option: a runtime kernel (Rule.kernel_axis)
ALL_TO_ALL_FORWARD = "moe.experts_all_to_all"
ALL_TO_ALL_BACKWARD = "moe.experts_all_to_all_backward"
OF_RANK_FORWARD = "moe.experts_of_rank"  # the tokens whole on the axis: this rank's experts' share
OF_RANK_BACKWARD = "moe.experts_of_rank_backward"
MOE_FORWARD = "autopar.moe_experts.default"
KERNEL_OPS = (MOE_FORWARD, "autopar.moe_experts_backward.default")
_INDEX_BYTES = 8  # a top-k expert index (int64), as the kernels all-gather the routing


def expert_forward(rows: torch.Tensor, counts: list[int], gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Each expert's output for its rows: ``rows`` grouped by expert, ``counts[e]`` of expert e's."""
    outputs = [_swiglu(group, gate_up[e], down[e])[0] for e, group in enumerate(rows.split(counts))]
    return torch.cat(outputs) if outputs else rows.new_empty(0, down.shape[1])


def expert_backward(rows: torch.Tensor, grad_outputs: torch.Tensor, counts: list[int], gate_up: torch.Tensor,
                    down: torch.Tensor):
    """(outputs, grad rows, grad gate_up, grad down) of expert_forward, given the gradient of its
    outputs. The outputs are recomputed: backward needs them for the routing weights' gradient."""
    outputs, grad_rows = [], []
    grad_gate_up, grad_down = torch.zeros_like(gate_up), torch.zeros_like(down)
    for e, (group, grad) in enumerate(zip(rows.split(counts), grad_outputs.split(counts))):
        y, gate, up, hidden = _swiglu(group, gate_up[e], down[e])
        grad_down[e] = grad.t() @ hidden
        grad_hidden = grad @ down[e]
        sig = torch.sigmoid(gate)
        grad_gate = grad_hidden * up * sig * (1 + gate * (1 - sig))  # d silu(g)/dg = s (1 + g (1 - s))
        grad_projected = torch.cat([grad_gate, grad_hidden * F.silu(gate)], dim=-1)
        grad_gate_up[e] = grad_projected.t() @ group
        outputs.append(y)
        grad_rows.append(grad_projected @ gate_up[e])
    width = rows.shape[1]
    return (torch.cat(outputs) if outputs else rows.new_empty(0, width),
            torch.cat(grad_rows) if grad_rows else rows.new_empty(0, width), grad_gate_up, grad_down)


def _swiglu(rows, gate_up, down):
    gate, up = (rows @ gate_up.t()).chunk(2, dim=-1)
    hidden = F.silu(gate) * up
    return hidden @ down.t(), gate, up, hidden


def result_dtype(x: torch.Tensor, top_k_weights: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, top_k_weights.dtype)


class Routing:
    """The (token, expert) pairs of a call, sorted by expert: pair p reads token ``tokens[p]``
    for expert ``experts[p]`` with weight ``weights[p]``; ``order`` maps sorted pairs back to the
    flattened (T, k) layout."""

    def __init__(self, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        flat = top_k_index.reshape(-1)
        self.order = torch.argsort(flat, stable=True)
        self.tokens = self.order // top_k_index.shape[1]
        self.experts = flat[self.order]
        self.weights = top_k_weights.reshape(-1)[self.order]

    def combine(self, outputs: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Each token's weighted sum of its experts' ``outputs`` (one row per sorted pair, for
        the first ``len(outputs)`` pairs), in the tokens' and weights' common dtype (float32
        under mixed precision, as eager's sum)."""
        n = len(outputs)
        weighted = (outputs * self.weights[:n, None]).to(result_dtype(like, self.weights))
        return like.new_zeros(like.shape, dtype=weighted.dtype).index_add_(0, self.tokens[:n], weighted)

    def backward(self, pairs: int, counts: list[int], grad, x, top_k_weights, gate_up, down):
        """(grad x, grad top_k_weights, grad gate_up, grad down) of the first ``pairs`` sorted
        pairs' share of the layer (``counts``: theirs per expert of ``gate_up``); the other
        pairs' routing weights get no gradient from them."""
        tokens, weights = self.tokens[:pairs], self.weights[:pairs]
        rows_grad = grad[tokens]
        y, grad_rows, grad_gate_up, grad_down = expert_backward(
            x[tokens], (rows_grad * weights[:, None]).to(x.dtype), counts, gate_up, down)
        grad_x = torch.zeros_like(x).index_add_(0, tokens, grad_rows.to(x.dtype))
        per_pair = rows_grad.new_zeros(len(self.tokens))
        per_pair[:pairs] = (rows_grad * y).sum(-1)
        return grad_x, self.unsort(per_pair, top_k_weights), grad_gate_up, grad_down

    def unsort(self, per_pair: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """A value per sorted pair, back in the (T, k) layout of ``like``."""
        out = torch.empty_like(like).reshape(-1)
        out[self.order] = per_pair.to(like.dtype)
        return out.reshape(like.shape)


def experts_reference(x, top_k_index, top_k_weights, gate_up, down):
    """The layer on one device: every token through its top-k experts, weighted and summed."""
    routing = Routing(top_k_index, top_k_weights)
    counts = torch.bincount(routing.experts, minlength=gate_up.shape[0]).tolist()
    return routing.combine(expert_forward(x[routing.tokens], counts, gate_up, down), x)


def experts_backward_reference(grad, x, top_k_index, top_k_weights, gate_up, down):
    routing = Routing(top_k_index, top_k_weights)
    counts = torch.bincount(routing.experts, minlength=gate_up.shape[0]).tolist()
    return routing.backward(len(routing.tokens), counts, grad, x, top_k_weights, gate_up, down)


@torch.library.custom_op("autopar::moe_experts", mutates_args=())
def moe_experts(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, gate_up: torch.Tensor,
                down: torch.Tensor) -> torch.Tensor:
    """A Hugging Face experts module's forward: x (T, H), top_k_index (T, k), top_k_weights
    (T, k), gate_up (E, 2I, H), down (E, H, I) -> (T, H); SwiGLU experts, computed in x's dtype,
    summed in x's and the weights' common dtype."""
    return experts_reference(x, top_k_index, top_k_weights, gate_up, down)


@moe_experts.register_fake
def _(x, top_k_index, top_k_weights, gate_up, down):
    return torch.empty_like(x, dtype=result_dtype(x, top_k_weights))


@torch.library.custom_op("autopar::moe_experts_backward", mutates_args=())
def moe_experts_backward(grad: torch.Tensor, x: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor, gate_up: torch.Tensor,
                         down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad x, grad top_k_weights, grad gate_up, grad down) of moe_experts."""
    return experts_backward_reference(grad, x, top_k_index, top_k_weights, gate_up, down)


@moe_experts_backward.register_fake
def _(grad, x, top_k_index, top_k_weights, gate_up, down):
    return torch.empty_like(x), torch.empty_like(top_k_weights), torch.empty_like(gate_up), torch.empty_like(down)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, top_k_index, top_k_weights, gate_up, down = ctx.saved_tensors
    grad_x, grad_weights, grad_gate_up, grad_down = moe_experts_backward(grad, x, top_k_index, top_k_weights,
                                                                         gate_up, down)
    return grad_x, None, grad_weights, grad_gate_up, grad_down


moe_experts.register_autograd(_backward, setup_context=_setup_context)


def _pairs(routing_shape) -> int:
    tokens, k = routing_shape
    return tokens * k


def _flops_per_pair(in_shapes) -> float:
    _, two_i, h = in_shapes[-2]
    return 2.0 * h * two_i + 2.0 * h * (two_i // 2)  # gate and up projections, then down


class ExpertsRule(LetterRule):
    """The tokens split (T: experts replicated), or expert parallel over an axis: both expert
    weights ``Shard(0)`` there, with the tokens and routing ``Shard(0)`` too (the all-to-all
    kernel) or whole (each rank's experts for every token; the token-sized outputs partial
    sums). The hidden and intermediate dims stay whole (SwiGLU pairs gate row i with up row
    I + i, which one Shard of the stacked gate_up cannot keep together)."""

    def __init__(self, make, routing_operand: int, kernels: tuple[str, str], flop_factor: float):
        """``routing_operand``: where top_k_index is among the tensor inputs (the expert weights
        are the last two); ``kernels``: the all-to-all kernel and the one for tokens whole on
        the axis; ``flop_factor``: the call's FLOPs per pair, in forwards."""
        super().__init__(make, flop_fn=lambda i, o: flop_factor * _pairs(i[routing_operand]) * _flops_per_pair(i))
        self.routing_operand, (self.kernel, self.of_rank_kernel) = routing_operand, kernels
        self.row_widths = 1 if routing_operand == 1 else 2  # backward's rows carry a gradient beside

    def options(self, call: OpCall) -> list[Option]:
        lt = self.make(call)
        token_inputs = len(lt.inputs) - 2  # the tokens, routing (and gradient): all but the stacked weights
        expert_parallel = Option((Shard(0),) * len(lt.inputs), tuple(Shard(0) for _ in lt.outputs))
        # token-sized outputs (the tokens' or routing weights' gradients) are this rank's experts' summands
        every_token = Option((R,) * token_inputs + (Shard(0), Shard(0)),
                             tuple(Shard(0) if "E" in out else P for out in lt.outputs))
        return letter_options(lt) + [expert_parallel, every_token]

    def inner_time(self, call, in_specs, local, cost) -> float:
        """Expert parallel: the routing's all-gather (every rank's top-k indices), then each
        (token, expert) pair's row to its expert's rank and the result back (backward sends the
        row with its gradient and gets the output with the row's gradient: twice the width). The
        step waits for the busiest rank, whose experts get ``cost.moe_imbalance`` times the mean:
        it receives and computes that much more."""
        axis = expert_axis(in_specs)
        if axis is None:
            return 0.0
        tokens, k = local.inputs[self.routing_operand]
        x = self.routing_operand - 1
        itemsize = operand_itemsize(call, x)
        if tokens_whole(in_specs, axis):
            # ``flops`` at the local shapes counts every token's pairs; this rank computes those
            # of its experts: 1/n of them, the busiest ``cost.moe_imbalance`` times that
            every = self.flops(call, local.inputs, local.outputs)
            share = every * cost.moe_imbalance / cost.mesh.shape[axis]
            return cost.op_time(share, 0.0, itemsize) - cost.op_time(every, 0.0, itemsize)
        row_bytes = local.inputs[x][1] * self.row_widths * itemsize
        imbalance = cost.moe_imbalance
        routing = cost.collective_seconds("all_gather", tokens * k * _INDEX_BYTES * cost.mesh.shape[axis], axis)
        rows = 2 * cost.routed_exchange_time(imbalance * tokens * k * row_bytes, axis)
        busiest = (imbalance - 1.0) * cost.op_time(self.flops(call, local.inputs, local.outputs), 0.0, itemsize)
        return routing + rows + busiest

    def kernel_axis(self, in_specs) -> int | None:
        return expert_axis(in_specs)

    def kernel_collectives(self, in_specs) -> tuple[str, ...]:
        axis = expert_axis(in_specs)
        if axis is None or tokens_whole(in_specs, axis):
            return ()
        return "all_gather", "all_to_all"

    def local_call(self, call, local):
        if local.inputs[-1][0] == call.in_shapes[-1][0]:  # every expert here: the op itself, on this rank's tokens
            return super().local_call(call, local)
        whole = tokens_whole(local.in_specs, expert_axis(local.in_specs))
        return (self.of_rank_kernel if whole else self.kernel), list(call.args)


def _forward_letters(call: OpCall) -> Letters:
    return Letters(("Th", "Tk", "Tk", "EGh", "EhI"), ("Th",), fixed=frozenset("hkEGI"))


def _backward_letters(call: OpCall) -> Letters:
    return Letters(("Th", "Th", "Tk", "Tk", "EGh", "EhI"), ("Th", "Tk", "EGh", "EhI"), fixed=frozenset("hkEGI"))


def expert_axis(in_specs) -> int | None:
    """The mesh axis the experts are split over under a strategy of either op (the stacked
    weights, its last two inputs, are Shard(0) there), or None."""
    for axis, placement in enumerate(in_specs[-1].placements):
        if isinstance(placement, Shard) and placement.dim == 0:
            return axis
    return None


def tokens_whole(in_specs, axis: int) -> bool:
    """Whether a strategy of either op keeps every token on each rank of the experts' ``axis``
    (its routing, the fourth input from the end, whole there) rather than routing them by all-to-all."""
    return in_specs[-4].placements[axis] == R


def splits_experts(plan) -> bool:
    """Whether a plan runs any MoE layer expert parallel."""
    return any(n.target in KERNEL_OPS and expert_axis(plan.strategies[n.name].in_specs) is not None
               for n in plan.graph.nodes if n.name in plan.strategies)


def layout_text(in_specs, axis_names) -> str:
    """A strategy of either op in words: expert parallel, data parallel or replicated."""
    axis = expert_axis(in_specs)
    routing = in_specs[-4]  # top_k_index, in either op: split as the tokens are
    if axis is not None and tokens_whole(in_specs, axis):
        return f"expert parallel over {axis_names[axis]} (every token there: each device's experts, outputs summed)"
    if axis is not None:
        return f"expert parallel over {axis_names[axis]} (tokens to their experts by all-to-all)"
    split = [axis_names[a] for a, p in enumerate(routing.placements) if isinstance(p, Shard)]
    return f"experts replicated, tokens split over {', '.join(split)}" if split else "replicated"


# the forward reads 6HI flops per (token, expert) pair; backward recomputes it and doubles it
MOE_RULES: dict = {
    torch.ops.autopar.moe_experts.default: ExpertsRule(_forward_letters, 1, (ALL_TO_ALL_FORWARD, OF_RANK_FORWARD), 1.0),
    torch.ops.autopar.moe_experts_backward.default: ExpertsRule(_backward_letters, 2,
                                                                (ALL_TO_ALL_BACKWARD, OF_RANK_BACKWARD), 3.0),
}
