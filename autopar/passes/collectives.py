"""collectives: an explicit redistribution wherever a producer's layout differs
from what a consumer needs, in forward and backward (and for each gradient, into
its parameter's layout, in the compute dtype where a mixed-precision policy reduces gradients
in it; for each buffer's new value, into the buffer's)."""
from __future__ import annotations

import dataclasses

from autopar.ir.placement import Spec
from autopar.ir.precision import MixedPrecision
from autopar.ir.program import Program, forward_nodes, is_multi_output, tensor_inputs
from autopar.ir.records import UPDATE, Redistribution
from autopar.ir.redistribute import COMMUNICATING
from autopar.passes.base import Pass, PassContext, side_table
from autopar.passes.mixed_precision import gradients_to_reduce_on_the_wire

side_table('redistributions', list, 'every Redistribution the layouts need, in forward and backward')


class CollectivesPass(Pass):
    name = "collectives"
    requires = ("meta", "choice")
    provides = ("redistributions",)

    def run(self, program: Program, ctx: PassContext) -> str:
        redistributions = find_redistributions(program, program.table("choice"), ctx.cost, ctx.request.precision)
        program.tables["redistributions"] = redistributions
        n_comm = sum(1 for r in redistributions for s in r.steps if s.kind in COMMUNICATING)
        return f"{len(redistributions)} redistributions, {n_comm} collectives"


def find_redistributions(program: Program, choice: dict, cost,
                         precision: MixedPrecision | None = None) -> list[Redistribution]:
    """Every (value, layout) move the chosen strategies need, with its steps priced; under a
    mixed ``precision`` that reduces gradients in the compute dtype, their syncs move them in it."""
    meta = program.table("meta")
    wire_dtype = {g: precision.reduce for g in gradients_to_reduce_on_the_wire(program, meta, precision)}
    forward = forward_nodes(program)
    found: dict[tuple[str, Spec], dict] = {}

    def need(value: str, dst: Spec, consumer: str, phase: str) -> None:
        src = choice[value].out_specs[0]
        if src == dst:
            return
        entry = found.setdefault((value, dst), {"src": src, "consumers": [], "phase": phase})
        entry["consumers"].append(consumer)

    for node in program.nodes():
        if node.op != "call_function":
            continue
        for j, arg in enumerate(tensor_inputs(node)):
            if is_multi_output(arg):
                continue  # getitem reads its tuple element in place
            need(arg.name, choice[node.name].in_specs[j], node.name,
                 "forward" if node.name in forward else "backward")
    for grad, param in program.gradient_targets():
        need(grad, choice[param].out_specs[0], "output", "backward")
    buffer = {fqn: ph for ph, fqn in program.buffers.items()}
    for value, fqn in program.mutated.items():
        need(value, choice[buffer[fqn]].out_specs[0], UPDATE, "forward")

    redistributions = []
    for k, ((value, dst), entry) in enumerate(found.items()):
        wire = wire_dtype.get(value) if "output" in entry["consumers"] else None
        moved = meta[value][0] if wire is None else dataclasses.replace(meta[value][0], dtype=wire)
        # a gradient's sync alone (nothing in backward reads it) starts asynchronously, in a bucket
        timed = cost.step_times(moved, entry["src"], dst, bucketed=entry["consumers"] == ["output"])
        redistributions.append(Redistribution(
            id=f"r{k}", value=value, src=entry["src"], dst=dst, steps=tuple(s for s, _, _ in timed),
            step_seconds=tuple(t for _, t, _ in timed), step_bytes=tuple(b for _, _, b in timed),
            phase=entry["phase"], consumers=tuple(entry["consumers"]),
            wire_dtype=wire if any(s.kind in COMMUNICATING for s, _, _ in timed) else None))
    return redistributions
