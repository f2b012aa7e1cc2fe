"""Jobs of tests/test_moe.py, run on every rank of a local gloo group, and its helpers."""
import torch

from autopar.ir.mesh import Mesh
from autopar.ops.moe import KERNEL_OPS, expert_axis, experts_backward_reference, experts_reference
from autopar.runtime.moe import experts_all_to_all, experts_all_to_all_backward
from autopar.runtime.rank_mesh import RankMesh


def expert_parallel_axes(plan) -> set:
    """The mesh axes the plan splits its MoE layers' experts over."""
    axes = {expert_axis(plan.strategies[n.name].in_specs) for n in plan.graph.nodes if n.target in KERNEL_OPS}
    return {plan.mesh.axis_names[a] for a in axes if a is not None}


def no_expert_parallelism(constraints):
    """A Constrain pass's body: no MoE layer splits its experts."""
    constraints.forbid(lambda node, strategy: str(node.target) in KERNEL_OPS
                       and expert_axis(strategy.in_specs) is not None)


def routed_layer(tokens: int = 24, width: int = 8, hidden: int = 12, experts: int = 8, k: int = 2,
                 crowded: int | None = None):
    """A layer's inputs with random routing; ``crowded``: that expert is every token's first choice."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=g)
    scores = torch.rand(tokens, experts, generator=g)
    if crowded is not None:
        scores[:, crowded] += 1.0
    weights, index = scores.softmax(-1).topk(k, dim=-1)
    gate_up = torch.randn(experts, 2 * hidden, width, generator=g) * 0.3
    down = torch.randn(experts, width, hidden, generator=g) * 0.3
    grad = torch.randn(tokens, width, generator=g)
    return x, index, weights, gate_up, down, grad


def expert_parallel_layer(rank, world_size, crowded):
    """This rank's tokens and experts through the all-to-all kernels, and the whole layer's
    reference outputs and gradients cut to the same blocks."""
    x, index, weights, gate_up, down, grad = routed_layer(crowded=crowded)
    rt = RankMesh(Mesh(("ep",), (world_size,)))
    rows, experts = x.shape[0] // world_size, gate_up.shape[0] // world_size
    mine, own = slice(rank * rows, (rank + 1) * rows), slice(rank * experts, (rank + 1) * experts)
    got = (experts_all_to_all(rt, "ep", x[mine], index[mine], weights[mine], gate_up[own], down[own]),
           *experts_all_to_all_backward(rt, "ep", grad[mine], x[mine], index[mine], weights[mine], gate_up[own],
                                        down[own]))
    grads = experts_backward_reference(grad, x, index, weights, gate_up, down)
    want = (experts_reference(x, index, weights, gate_up, down)[mine], grads[0][mine], grads[1][mine],
            grads[2][own], grads[3][own])
    received = torch.bincount(index.reshape(-1) // experts, minlength=world_size)[rank].item()
    return {"got": got, "want": want, "pairs received": received}
