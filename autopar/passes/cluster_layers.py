"""cluster_layers: identical repeated layers share one set of solver variables.

A transformer's layers are the same computation on different parameters, so the
solver need not decide each one's layout separately: every interior layer takes
the layout of one template layer, and its costs add to the template's (edges
between layers become edges among the template's own variables). The first and
last layer of a run stay free, since their neighbours (embedding, head) differ.
This is the clustering of Meta's AutoParallel and of Alpa's repeated-layer
handling; with it an 80-layer model solves about as fast as a 3-layer one.

The layers and the block of ops each owns are found by ``autopar.capture.layer_blocks``;
nodes map to the template's node at the same offset, and only where their
strategy lists match entry by entry, so sharing a variable always means the same
layout; and a layer that constraints (ctx.constraints: pins, forbids) treat
unlike the template keeps its own variables.
"""
from __future__ import annotations

from autopar.capture.layer_blocks import LayerRun, layer_blocks, layer_runs
from autopar.ir.program import Program
from autopar.passes.base import Pass, PassContext, side_table

side_table('cluster_of', dict, 'node -> the node of the template layer whose variables it shares')
side_table('allowed', dict, 'node -> per strategy, whether the constraints allow it (as clustering saw them)')


class ClusterLayersPass(Pass):
    name = "cluster_layers"
    requires = ("strategies",)
    provides = ("cluster_of", "allowed")

    def run(self, program: Program, ctx: PassContext) -> str:
        # only layers that the constraints treat alike share variables
        allowed = program.tables["allowed"] = ctx.constraints.allowed(program, program.table("strategies"), ctx.mesh)
        if not ctx.request.cluster_layers:
            program.tables["cluster_of"] = {}
            return "off"
        strategies = program.table("strategies")
        cluster_of: dict[str, str] = {}
        notes = []
        for run in layer_runs(program):
            mapped, sharing = _map_run(program, run, strategies, allowed)
            cluster_of.update(mapped)
            if mapped:
                notes.append(f"{sharing} of {len(run.layers)} layers of {run.prefix} share layer "
                             f"{run.layers[1]}'s variables")
        program.tables["cluster_of"] = cluster_of
        return "; ".join(notes) or "no repeated layers"


def _map_run(program: Program, run: LayerRun, strategies: dict, allowed: dict) -> tuple[dict[str, str], int]:
    """Node -> the template layer's node it shares a variable with; and how many layers share
    the template's variables (the template included)."""
    found = layer_blocks(program, run)
    if found is None:
        return {}, 0
    template = run.layers[1]
    interior = run.layers[1:-1]
    for phase in found.phases:
        reference = found.signature(phase, template, program.constants)
        for layer in interior[1:]:
            if found.signature(phase, layer, program.constants) != reference:
                return {}, 0  # not one repeated computation: solve the layers separately
    mapped: dict[str, str] = {}
    sharing = 1
    for layer in interior[1:]:
        pairs = [(own.name, theirs.name) for phase in found.phases
                 for own, theirs in zip(found.blocks[phase, layer], found.blocks[phase, template])]
        pairs += [(ph, run.inputs[template][rest]) for rest, ph in run.inputs[layer].items()]
        if any(allowed.get(own) != allowed.get(theirs) for own, theirs in pairs):
            continue  # constrained unlike the template: this layer keeps its own variables
        mapped.update((own, theirs) for own, theirs in pairs
                      if own in strategies and _same_options(strategies[own], strategies[theirs]))
        sharing += 1
    return mapped, sharing


def _same_options(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.in_specs == y.in_specs and x.out_specs == y.out_specs for x, y in zip(a, b))
