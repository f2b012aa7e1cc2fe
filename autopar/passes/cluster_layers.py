"""cluster_layers: identical repeated layers share one set of solver variables.

A transformer's layers are the same computation on different parameters, so the
solver need not decide each one's layout separately: every interior layer takes
the layout of one template layer, and its costs add to the template's (edges
between layers become edges among the template's own variables). The first and
last layer of a run stay free, since their neighbours (embedding, head) differ.
This is the clustering of Meta's AutoParallel and of Alpa's repeated-layer
handling; with it an 80-layer model solves about as fast as a 3-layer one.

Finding the layers. Parameters named ``<prefix>.<i>.<rest>`` with the same
``rest`` names, shapes and dtypes for every ``i`` form a run of layers.
The joint graph runs forward layer by layer and backward in reverse, so layer
``i``'s forward block is the forward ops from the first one that reads a layer-``i``
parameter up to the first that reads a layer-``i+1`` one (likewise in backward,
in reverse). Two layers are identical when their blocks match op by op: same
op, arguments, shapes, and each tensor argument in the same place relative to the
layer (its own parameter ``rest``, an op of its own or a neighbouring layer's
block at the same offset, or the same node outside the layers). Nodes then map
to the template's node at the same offset, and only where their strategy lists
match entry by entry, so sharing a variable always means the same layout; and a
layer that constraints (ctx.constraints: pins, forbids) treat unlike the template
keeps its own variables.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Optional

from torch import fx

from autopar.passes.base import Pass, PassContext
from autopar.program import Program, output_metas, tensor_inputs

_LAYER = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


class ClusterLayersPass(Pass):
    name = "cluster_layers"
    requires = ("strategies",)
    provides = ("cluster_of", "allowed")

    def run(self, program: Program, ctx: PassContext) -> str:
        # only layers that the constraints treat alike share variables
        allowed = program.tables["allowed"] = ctx.constraints.allowed(program, program.table("strategies"), ctx.mesh)
        if not ctx.options.get("cluster_layers", True):
            program.tables["cluster_of"] = {}
            return "off"
        strategies = program.table("strategies")
        cluster_of: dict[str, str] = {}
        notes = []
        for run in _layer_runs(program):
            mapped, sharing = _map_run(program, run, strategies, allowed)
            cluster_of.update(mapped)
            if mapped:
                notes.append(f"{sharing} of {len(run.layers)} layers of {run.prefix} share layer "
                             f"{run.layers[1]}'s variables")
        program.tables["cluster_of"] = cluster_of
        return "; ".join(notes) or "no repeated layers"


class _Run:
    """Layers ``prefix.i`` (consecutive indices in ``layers``) with the same parameters."""

    def __init__(self, prefix: str, layers: list[int], params: dict[int, dict[str, str]]):
        self.prefix, self.layers, self.params = prefix, layers, params  # params: layer -> rest -> placeholder


def _layer_runs(program: Program) -> list[_Run]:
    meta = program.table("meta")
    by_prefix: dict[str, dict[int, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for placeholder, fqn in program.params.items():
        m = _LAYER.match(fqn)
        if m:
            by_prefix[m.group(1)][int(m.group(2))][m.group(3)] = placeholder
    runs = []
    for prefix, layers in by_prefix.items():
        def signature(i):
            return sorted((rest, meta[ph][0]) for rest, ph in layers[i].items())
        indices = sorted(layers)
        start = 0
        for k in range(1, len(indices) + 1):
            if k == len(indices) or indices[k] != indices[k - 1] + 1 or signature(indices[k]) != signature(indices[start]):
                if k - start >= 3:
                    runs.append(_Run(prefix, indices[start:k], {i: layers[i] for i in indices[start:k]}))
                start = k
    return runs


def _map_run(program: Program, run: _Run, strategies: dict, allowed: dict) -> tuple[dict[str, str], int]:
    """Node -> the template layer's node it shares a variable with; and how many layers share
    the template's variables (the template included)."""
    # the joint graph holds forward (up to the loss, with what it saves for backward) then backward
    calls = [n for n in program.nodes() if n.op == "call_function"]
    loss_at = next(k for k, n in enumerate(calls) if n.name == program.loss)
    phases = {"f": calls[:loss_at + 1], "b": calls[loss_at + 1:]}
    blocks = {}  # (phase, layer) -> list of nodes
    for phase, nodes in phases.items():
        starts = _block_starts(nodes, run)
        if starts is None:
            return {}, 0
        for k, layer in enumerate(run.layers):
            begin = starts[layer]
            # backward visits the layers in reverse: layer i's block ends where layer i-1's begins
            neighbour = run.layers[k + 1] if phase == "f" and k + 1 < len(run.layers) else \
                run.layers[k - 1] if phase == "b" and k > 0 else None
            end = starts[neighbour] if neighbour is not None else None
            blocks[phase, layer] = nodes[begin:end] if end is not None else nodes[begin:]
    where: dict[str, tuple[str, int, int]] = {}  # node -> (phase, layer, offset)
    for (phase, layer), nodes in blocks.items():
        for offset, n in enumerate(nodes):
            where[n.name] = (phase, layer, offset)
    rest_of = {ph: rest for layer in run.layers for rest, ph in run.params[layer].items()}

    def signature(phase: str, layer: int) -> Optional[list]:
        nodes = blocks[phase, layer]
        return [_node_signature(n, layer, where, rest_of, program.constants) for n in nodes]

    template = run.layers[1]
    interior = run.layers[1:-1]
    for phase in ("f", "b"):
        reference = signature(phase, template)
        for layer in interior[1:]:
            if signature(phase, layer) != reference:
                return {}, 0  # not one repeated computation: solve the layers separately
    mapped: dict[str, str] = {}
    sharing = 1
    for layer in interior[1:]:
        pairs = [(own.name, theirs.name) for phase in ("f", "b")
                 for own, theirs in zip(blocks[phase, layer], blocks[phase, template])]
        pairs += [(ph, run.params[template][rest]) for rest, ph in run.params[layer].items()]
        if any(allowed.get(own) != allowed.get(theirs) for own, theirs in pairs):
            continue  # constrained unlike the template: this layer keeps its own variables
        mapped.update((own, theirs) for own, theirs in pairs if _same_options(strategies[own], strategies[theirs]))
        sharing += 1
    return mapped, sharing


def _block_starts(nodes: list[fx.Node], run: _Run) -> Optional[dict[int, int]]:
    """Per layer, the position in ``nodes`` of the first op that reads one of its parameters;
    None unless the layers start in order (forward) or in reverse order (backward)."""
    layer_of = {ph: layer for layer in run.layers for ph in run.params[layer].values()}
    starts: dict[int, int] = {}
    for pos, n in enumerate(nodes):
        for arg in tensor_inputs(n):
            layer = layer_of.get(arg.name)
            if layer is not None and layer not in starts:
                starts[layer] = pos
    if len(starts) != len(run.layers):
        return None
    order = [starts[layer] for layer in run.layers]
    if order != sorted(order) and order != sorted(order, reverse=True):
        return None
    return starts


def _node_signature(node: fx.Node, layer: int, where: dict, rest_of: dict, constants: dict) -> tuple:
    def ref(arg):
        if isinstance(arg, fx.Node):
            if arg.name in constants:  # each layer may make its own copy of a small constant
                value = constants[arg.name]
                return ("constant", str(value.dtype), tuple(value.shape), tuple(value.flatten().tolist()))
            if arg.name in rest_of:
                return ("param", rest_of[arg.name])
            if arg.name in where:
                phase, their_layer, offset = where[arg.name]
                return ("layer", phase, their_layer - layer, offset)
            return ("node", arg.name)
        if isinstance(arg, (list, tuple)):
            return tuple(ref(a) for a in arg)
        if isinstance(arg, dict):
            return tuple(sorted((k, ref(v)) for k, v in arg.items()))
        return repr(arg)

    return str(node.target), ref(node.args), ref(node.kwargs), output_metas(node)


def _same_options(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.in_specs == y.in_specs and x.out_specs == y.out_specs for x, y in zip(a, b))
