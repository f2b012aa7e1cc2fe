"""shapes: every node's global output shapes and dtypes, from the fake-tensor trace."""
from __future__ import annotations

from autopar.passes.base import Pass, PassContext
from autopar.program import Program, output_metas


class ShapesPass(Pass):
    name = "shapes"
    provides = ("meta",)

    def run(self, program: Program, ctx: PassContext) -> str:
        table = {}
        for node in program.nodes():
            if node.op != "output":
                table[node.name] = output_metas(node)
        program.tables["meta"] = table
        return f"{len(table)} nodes"
