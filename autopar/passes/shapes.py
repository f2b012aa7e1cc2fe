"""shapes: every node's global output shapes and dtypes, from the fake-tensor trace."""
from __future__ import annotations

import dataclasses

from autopar.graph_ir import to_ir
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


def fingerprint_of(program: Program) -> str:
    """The graph fingerprint every plan of ``program`` carries, without planning it."""
    shaped = dataclasses.replace(program, tables={})
    ShapesPass().run(shaped, ctx=None)  # it reads no context; to_ir needs its shapes table
    return to_ir(shaped).fingerprint()
