"""Mirror-image layouts: which of two interchangeable mesh axes carries the batch.

Two axes of one size whose groups lie alike on the cluster (the same links) price every layout
and its mirror image, the two axes' placements swapped, the same, so the solver's pick between
them is arbitrary. The user's names are not: an axis named "dp" is where a batch is meant to be
split (autopar.ir.mesh.Mesh.data_axes, which local inputs are split over). So where the
solved layout splits a user input's batch over another axis and not over the dp axis mirroring
it, the two axes' placements are swapped in every chosen strategy, where each swapped strategy
is one the node offers and the constraints allow (a collective forbidden on one axis breaks
the symmetry: then nothing is swapped).
"""
from __future__ import annotations

from autopar.cost_models.collectives import axis_placement
from autopar.ir.placement import Shard, Spec
from autopar.ir.program import Program
from autopar.ir.strategy import Strategy
from autopar.passes.base import PassContext


def batch_on_dp_axes(choice: dict, program: Program, ctx: PassContext, allowed: dict) -> dict:
    """``choice`` (node -> Strategy), its batch splits moved onto the dp axes where a mirror
    image allows."""
    mesh, hardware = ctx.mesh, ctx.request.hardware
    if ctx.constraints.forbidden_collectives:
        return choice
    for dp in mesh.data_axes():
        for other in range(mesh.ndim):
            if other == dp or mesh.shape[other] != mesh.shape[dp] or \
                    axis_placement(mesh, other, hardware) != axis_placement(mesh, dp, hardware):
                continue
            if _batch_split_on(choice, program, other) and not _batch_split_on(choice, program, dp):
                mirrored = _mirrored(choice, program, allowed, dp, other)
                if mirrored is not None:
                    choice = mirrored
    return choice


def _batch_split_on(choice: dict, program: Program, axis: int) -> bool:
    return any(choice[name].out_specs[0].placements[axis] == Shard(0) for name in program.user_inputs
               if name in choice)


def _mirrored(choice: dict, program: Program, allowed: dict, a: int, b: int) -> dict | None:
    """Every chosen strategy with axes ``a`` and ``b`` swapped, or None where a node does not offer
    or may not take its mirror image."""
    strategies = program.table("strategies")
    out = {}
    for name, chosen in choice.items():
        mirror = Strategy(tuple(_swap(s, a, b) for s in chosen.in_specs),
                          tuple(_swap(s, a, b) for s in chosen.out_specs))
        found = next((k for k, s in enumerate(strategies[name])
                      if s.in_specs == mirror.in_specs and s.out_specs == mirror.out_specs), None)
        if found is None or (name in allowed and not allowed[name][found]):
            return None
        out[name] = strategies[name][found]
    return out


def _swap(spec: Spec, a: int, b: int) -> Spec:
    placements = list(spec.placements)
    placements[a], placements[b] = placements[b], placements[a]
    return Spec(tuple(placements))
