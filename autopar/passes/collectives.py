"""collectives: an explicit redistribution wherever a producer's layout differs
from what a consumer needs, in forward and backward (and for each gradient, into
its parameter's layout; for each buffer's new value, into the buffer's)."""
from __future__ import annotations

from autopar.ir.placement import Spec
from autopar.ir.program import Program, forward_nodes, is_multi_output, tensor_inputs
from autopar.ir.records import UPDATE, Redistribution
from autopar.ir.redistribute import COMMUNICATING
from autopar.passes.base import Pass, PassContext, side_table

side_table('redistributions', list, 'every Redistribution the layouts need, in forward and backward')


class CollectivesPass(Pass):
    name = "collectives"
    requires = ("meta", "choice")
    provides = ("redistributions",)

    def run(self, program: Program, ctx: PassContext) -> str:
        redistributions = find_redistributions(program, program.table("choice"), ctx.cost)
        program.tables["redistributions"] = redistributions
        n_comm = sum(1 for r in redistributions for s in r.steps if s.kind in COMMUNICATING)
        return f"{len(redistributions)} redistributions, {n_comm} collectives"


def find_redistributions(program: Program, choice: dict, cost) -> list[Redistribution]:
    """Every (value, layout) move the chosen strategies need, with its steps priced."""
    meta = program.table("meta")
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
        timed = cost.step_times(meta[value][0], entry["src"], dst)
        redistributions.append(Redistribution(
            id=f"r{k}", value=value, src=entry["src"], dst=dst, steps=tuple(s for s, _, _ in timed),
            step_seconds=tuple(t for _, t, _ in timed), step_bytes=tuple(b for _, _, b in timed),
            phase=entry["phase"], consumers=tuple(entry["consumers"])))
    return redistributions
