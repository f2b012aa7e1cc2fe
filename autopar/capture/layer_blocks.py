"""Repeated layers in a joint graph, and the block of ops each layer owns.

Parameters (and buffers) named ``<prefix>.<i>.<rest>`` with the same ``rest``
names, shapes and dtypes for every ``i`` form a run of layers. The joint graph
runs forward layer by layer and backward in reverse, so layer ``i``'s forward
block is the forward ops from the first one that reads a layer-``i`` input up to
the first that reads a layer-``i+1`` one (likewise in backward, in reverse); the
last layer's forward block runs on to forward's last output, the first layer's backward block
to the end.

A block's signature describes each op relative to its layer: same op, arguments
and shapes, and each tensor argument in the same place (an input ``rest`` of a
layer at an offset, an op of a layer's block at a layer offset and position, the
same node outside the layers, or a small constant by value). Two layers with
equal signatures are one computation on different parameters: the solver may
share their variables (``passes/cluster_layers``) and capture may copy one into
the other (``layer_expansion``).
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from torch import fx

from autopar.ir.program import FORWARD, Program, TensorMeta, forward_outputs, output_metas, tensor_inputs

LAYER_NAME = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


@dataclass
class LayerRun:
    """Layers ``prefix.i`` (consecutive indices in ``layers``) with the same inputs."""
    prefix: str
    layers: list[int]
    inputs: dict[int, dict[str, str]]  # layer -> rest -> placeholder (parameters and buffers)


@dataclass
class LayerBlocks:
    run: LayerRun
    blocks: dict[tuple[str, int], list[fx.Node]]  # (phase "f"/"b", layer) -> its ops in graph order
    where: dict[str, tuple[str, int, int]]  # node -> (phase, layer, offset in its block)
    input_of: dict[str, tuple[int, str]]  # placeholder -> (layer, rest)

    @property
    def phases(self) -> tuple[str, ...]:
        """"f" and "b" for a training step; "f" for a forward alone."""
        return tuple(dict.fromkeys(phase for phase, _ in self.blocks))

    def signature(self, phase: str, layer: int, constants: dict) -> list:
        return [self._node_signature(n, layer, constants) for n in self.blocks[phase, layer]]

    def _node_signature(self, node: fx.Node, layer: int, constants: dict) -> tuple:
        def ref(arg):
            if isinstance(arg, fx.Node):
                if arg.name in constants:  # each layer may make its own copy of a small constant
                    value = constants[arg.name]
                    return ("constant", str(value.dtype), tuple(value.shape), tuple(value.flatten().tolist()))
                if arg.name in self.input_of:
                    their_layer, rest = self.input_of[arg.name]
                    return ("input", their_layer - layer, rest)
                if arg.name in self.where:
                    phase, their_layer, offset = self.where[arg.name]
                    return ("layer", phase, their_layer - layer, offset)
                return ("node", arg.name)
            if isinstance(arg, (list, tuple)):
                return tuple(ref(a) for a in arg)
            if isinstance(arg, dict):
                return tuple(sorted((k, ref(v)) for k, v in arg.items()))
            return repr(arg)

        return str(node.target), ref(node.args), ref(node.kwargs), output_metas(node)


def layer_runs(program: Program, *, min_layers: int = 3) -> list[LayerRun]:
    """Runs of at least ``min_layers`` consecutive layers whose inputs match."""
    named = {**program.params, **program.buffers}
    by_prefix: dict[str, dict[int, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for placeholder, fqn in named.items():
        m = LAYER_NAME.match(fqn)
        if m:
            by_prefix[m.group(1)][int(m.group(2))][m.group(3)] = placeholder
    runs = []
    for prefix, layers in by_prefix.items():
        def signature(i, layers=layers):
            return sorted((rest, TensorMeta.of(program.node(ph).meta.get("val"))) for rest, ph in layers[i].items())
        indices = sorted(layers)
        start = 0
        for k in range(1, len(indices) + 1):
            run_ends = k == len(indices) or indices[k] != indices[k - 1] + 1
            if run_ends or signature(indices[k]) != signature(indices[start]):
                if k - start >= min_layers:
                    runs.append(LayerRun(prefix, indices[start:k], {i: layers[i] for i in indices[start:k]}))
                start = k
    return runs


def layer_blocks(program: Program, run: LayerRun) -> LayerBlocks | None:
    """Each layer's forward and backward block; None unless the layers run in order."""
    # the joint graph holds forward (up to its last output, with what it saves for backward) then backward
    calls = [n for n in program.nodes() if n.op == "call_function"]
    outputs = set(forward_outputs(program))
    forward_end = max(k for k, n in enumerate(calls) if n.name in outputs)
    phases = {"f": calls[:forward_end + 1], "b": calls[forward_end + 1:]}
    if program.kind == FORWARD:
        del phases["b"]
    input_of = {ph: (layer, rest) for layer in run.layers for rest, ph in run.inputs[layer].items()}
    marks = _derived_from_one_layer(phases["f"], input_of)
    # a layer whose inputs backward never reads (the first layer, when the model's input needs
    # no gradient) is still found by its gradients
    fqn_layer = {fqn: input_of[ph][0] for ph, fqn in {**program.params, **program.buffers}.items() if ph in input_of}
    marks.update((grad, fqn_layer[fqn]) for grad, fqn in program.grads.items() if fqn in fqn_layer)
    blocks = {}
    for phase, nodes in phases.items():
        starts = _block_starts(nodes, run, marks)
        if starts is None:
            return None
        for k, layer in enumerate(run.layers):
            begin = starts[layer]
            # backward visits the layers in reverse: layer i's block ends where layer i-1's begins
            neighbour = run.layers[k + 1] if phase == "f" and k + 1 < len(run.layers) else \
                run.layers[k - 1] if phase == "b" and k > 0 else None
            end = starts[neighbour] if neighbour is not None else None
            blocks[phase, layer] = nodes[begin:end] if end is not None else nodes[begin:]
    where = {n.name: (phase, layer, offset) for (phase, layer), nodes in blocks.items()
             for offset, n in enumerate(nodes)}
    return LayerBlocks(run, blocks, where, input_of)


def _derived_from_one_layer(forward: list[fx.Node], input_of: dict) -> dict[str, int]:
    """Each layer input, and each forward op computed from one layer's inputs alone (a
    transposed or cast weight, which backward reads instead of the weight): node -> layer."""
    layer_of = {name: layer for name, (layer, _) in input_of.items()}
    for n in forward:
        layers = {layer_of.get(a.name) for a in tensor_inputs(n)}
        if len(layers) == 1 and None not in layers:
            layer_of[n.name] = layers.pop()
    return layer_of


def _block_starts(nodes: list[fx.Node], run: LayerRun, layer_of: dict) -> dict[int, int] | None:
    """Per layer, the position in ``nodes`` of the first op that reads one of its inputs (or a
    value made from them alone) or is one of its gradients; None unless the layers start in order
    (forward) or in reverse order (backward)."""
    starts: dict[int, int] = {}
    for pos, n in enumerate(nodes):
        for marked in [n] + tensor_inputs(n):
            if marked.name in layer_of and layer_of[marked.name] not in starts:
                starts[layer_of[marked.name]] = pos
    if len(starts) != len(run.layers):
        return None
    order = [starts[layer] for layer in run.layers]
    if order != sorted(order) and order != sorted(order, reverse=True):
        return None
    return starts
