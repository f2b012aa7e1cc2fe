"""Which weights K-FAC preconditions, and where their curvature's inputs are in the program.

K-FAC (Martens & Grosse 2015) approximates a linear layer's Fisher block by the Kronecker
product of two small factors: ``A = E[a aᵀ]`` over the layer's inputs and ``G = E[ĝ ĝᵀ]`` over
the gradients of its outputs. The step already computes both: its weight gradient is one
``mm`` whose operands are exactly ``gᵀ`` and ``a`` (or ``aᵀ`` and ``g``, when the gradient
comes out transposed). So a weight is a K-FAC layer when its gradient is such an ``mm`` and the
forward multiplies the same input by the weight's transpose (``mm``/``addmm`` of ``a`` and
``t(weight)``: ``nn.Linear``); the stage programs hand the runtime that ``mm``'s operands.

Every other parameter (biases, norms, embeddings) keeps its plain gradient: the plan lists
them. So does a linear layer with a factor wider than ``MAX_FACTOR_WIDTH`` (a vocabulary head):
inverting a 30k-wide factor costs more than the whole step, which is why K-FAC implementations
leave such layers first-order. Factors are computed on a rank's rows of a micro-batch and averaged over the stage's
devices, which needs the features whole on each device: a layer whose input or output
gradient is split along its features (tensor parallelism) is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.ir.placement import Partial, Shard

_TRANSPOSES = ("aten.t.default", "aten.transpose.int", "aten.permute.default")
_CASTS = ("aten._to_copy.default",)
_LINEAR = ("aten.mm.default", "aten.addmm.default")
MAX_FACTOR_WIDTH = 8192


@dataclass(frozen=True)
class CurvatureLayer:
    weight: str  # the parameter's name
    gradient_mm: str  # the node whose operands are (gᵀ, a), or (aᵀ, g) when ``swapped``
    swapped: bool
    in_features: int
    out_features: int
    rows: int  # rows of ``a`` and ``g`` in one micro-batch (batch x sequence, over every device)

    def input_and_output_grad(self, first, second):
        """(a, g) as [rows, features] from the gradient mm's two operands."""
        return (first.t(), second) if self.swapped else (second, first.t())


def curvature_layers(plan) -> tuple[list[CurvatureLayer], list[str]]:
    """(the K-FAC layers, the parameters updated first-order), in the graph's parameter order."""
    graph = plan.graph
    placeholder_of = {fqn: ph for ph, fqn in graph.params.items()}
    layers, first_order = [], []
    for grad, fqn in graph.grads.items():
        layer = _linear_layer(graph, grad, fqn, placeholder_of[fqn])
        if layer is None:
            first_order.append(fqn)
        else:
            _check_features_whole(plan, layer)
            layers.append(layer)
    return layers, first_order


def _linear_layer(graph, grad: str, fqn: str, placeholder: str):
    weight = graph.node(placeholder).outputs[0]
    if weight is None or len(weight.shape) != 2:
        return None
    node, swapped = _peel(graph, graph.node(grad))
    if node.target != "aten.mm.default":
        return None
    first, second = (graph.node(r) for r in node.refs())
    out_features, in_features = weight.shape
    if max(out_features, in_features) > MAX_FACTOR_WIDTH:
        return None
    a = _source(graph, first) if swapped else second
    if not _multiplies_by_transpose(graph, a.name, placeholder):
        return None
    rows = a.outputs[0].shape[0]
    return CurvatureLayer(fqn, node.name, swapped, in_features, out_features, rows)


def _peel(graph, node):
    """The node under casts and transposes, and whether an odd number of transposes was peeled."""
    swapped = False
    while node.target in _TRANSPOSES + _CASTS:
        if node.target in _TRANSPOSES:
            swapped = not swapped
        node = graph.node(node.refs()[0])
    return node, swapped


def _source(graph, node):
    return graph.node(node.refs()[0]) if node.target in _TRANSPOSES else node


def _multiplies_by_transpose(graph, a: str, placeholder: str) -> bool:
    """Whether forward computes ``a @ weight.t()`` (nn.Linear's matmul, with or without bias)."""
    for n in graph.nodes:
        if n.phase != "forward" or n.target not in _LINEAR:
            continue
        refs = n.refs()
        if a in refs and any(graph.node(r).target in _TRANSPOSES and graph.node(r).refs() == [placeholder]
                             for r in refs):
            return True
    return False


def _check_features_whole(plan, layer: CurvatureLayer) -> None:
    node = plan.graph.node(layer.gradient_mm)
    feature_dims = (1, 0) if layer.swapped else (0, 1)  # (first operand's, second operand's) feature dim
    for ref, dim in zip(node.refs(), feature_dims):
        spec = plan.strategies[ref].out_specs[0]
        if any(isinstance(p, Partial) or p == Shard(dim) for p in spec.placements):
            raise AutoparError(
                f"K-FAC computes {layer.weight}'s curvature factors from whole features on each device, and this "
                f"plan splits its {'input' if (ref == node.refs()[1]) != layer.swapped else 'output gradient'} as "
                f"{spec} over {plan.mesh}: plan K-FAC on a mesh of 'pp' and 'dp' axes, or use a first-order "
                f"optimizer")
    weight = next(ph for ph, fqn in plan.graph.params.items() if fqn == layer.weight)
    if not plan.strategies[weight].out_specs[0].is_replicated:
        raise AutoparError(f"K-FAC preconditions whole weights, and this plan shards {layer.weight} as "
                           f"{plan.strategies[weight].out_specs[0]} over {plan.mesh}: plan it with the weights "
                           f"replicated on the stages' devices, or use a first-order optimizer")
