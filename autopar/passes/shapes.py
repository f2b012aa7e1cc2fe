"""shapes: every node's global output shapes and dtypes, from the fake-tensor trace."""
from __future__ import annotations

from autopar.ir.program import Program, shape_table
from autopar.passes.base import Pass, PassContext, side_table

side_table('meta', dict, 'node -> the global TensorMeta of each of its outputs (None: not a tensor)')


class ShapesPass(Pass):
    name = "shapes"
    provides = ("meta",)

    def run(self, program: Program, ctx: PassContext) -> str:
        program.tables["meta"] = shape_table(program)
        return f"{len(program.tables['meta'])} nodes"
