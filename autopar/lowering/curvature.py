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
leave such layers first-order.

Factors are computed on a device's rows of a micro-batch and averaged over the stage's devices
(rows split over data-parallel axes). Features split over the stage's devices (tensor
parallelism) are gathered first, so every device holds the whole factors (replicated, not
sharded); a weight's gradient split likewise is gathered to be preconditioned, and each device
keeps its block. An operand that is a partial sum is refused.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.ir.placement import Shard

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
    # per operand of the gradient mm: the (mesh axis, dim) its features are split along, to gather
    operand_gathers: tuple = ((), ())
    weight_gathers: tuple = ()  # the (mesh axis, dim) the weight (and its gradient) is split along

    def input_and_output_grad(self, first, second):
        """(a, g) as [rows, features] from the gradient mm's two operands."""
        return (first.t(), second) if self.swapped else (second, first.t())


def curvature_layers(plan) -> tuple[list[CurvatureLayer], list[str]]:
    """(the K-FAC layers, the parameters updated first-order), in the graph's parameter order."""
    graph = plan.graph
    placeholder_of = {fqn: ph for ph, fqn in graph.params.items()}
    linear = _forward_linear_pairs(graph)
    layers, first_order = [], []
    for grad, fqn in graph.grads.items():
        layer = _linear_layer(graph, grad, fqn, placeholder_of[fqn], linear)
        if layer is None:
            first_order.append(fqn)
        else:
            layers.append(_with_gathers(plan, layer, placeholder_of[fqn]))
    return layers, first_order


def _linear_layer(graph, grad: str, fqn: str, placeholder: str, linear: set):
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
    if (a.name, placeholder) not in linear:
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


def _forward_linear_pairs(graph) -> set[tuple[str, str]]:
    """(input, weight placeholder) of every forward ``mm``/``addmm`` of an input by ``t(weight)``:
    nn.Linear's matmul, with or without bias."""
    pairs = set()
    for n in graph.nodes:
        if n.phase != "forward" or n.target not in _LINEAR:
            continue
        refs = n.refs()
        weights = [graph.node(r).refs()[0] for r in refs if graph.node(r).target in _TRANSPOSES
                   and len(graph.node(r).refs()) == 1]
        pairs |= {(r, w) for r in refs for w in weights}
    return pairs


def _with_gathers(plan, layer: CurvatureLayer, placeholder: str) -> CurvatureLayer:
    """``layer`` with the gathers that make its operands' features and its gradient whole."""
    node = plan.graph.node(layer.gradient_mm)
    axes = plan.mesh.axis_names
    operands = []
    for i, spec in enumerate(plan.strategies[node.name].in_specs[:2]):  # each operand's feature dim is i
        if spec.has_partial():
            raise AutoparError(f"K-FAC computes {layer.weight}'s curvature factors from its gradient matmul's "
                               f"operands, and this plan multiplies a partial sum there ({spec} over {plan.mesh}): "
                               f"use a first-order optimizer for this plan")
        operands.append(_split_along(spec, axes, i))
    weight = _split_along(plan.strategies[placeholder].out_specs[0], axes, None)
    return dataclasses.replace(layer, operand_gathers=tuple(operands), weight_gathers=weight)


def _split_along(spec, axes, dim) -> tuple:
    """(mesh axis, dim) of each Shard of ``spec`` (of ``dim`` alone, unless None), innermost axis
    first: the order gathers undo a split over several axes."""
    return tuple((axes[a], p.dim) for a, p in reversed(list(enumerate(spec.placements)))
                 if isinstance(p, Shard) and (dim is None or p.dim == dim))
