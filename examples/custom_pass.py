"""A custom pass: attention heads go on the tensor-parallel axis, whatever the cost model says.

    python examples/custom_pass.py

Megatron splits attention by heads over ``tp``: every rank computes whole heads and no
collective runs inside the attention kernel. The solver may find that another layout is
cheaper under its cost model; a team that wants Megatron's layout anyway says so with a
pass. The pass runs before ``cluster_layers`` (the default place for a user's pass), sees
every node's strategies, and forbids, for each attention op (forward and backward), the
strategies whose query is not split on its heads dim over ``tp``. The solver lays out
everything else around that, and ``autopar.check`` proves the program still trains like
the single-process model.
"""
from __future__ import annotations

import os
import sys

import autopar
from autopar.ir.placement import Shard

HEADS_DIM = 1  # scaled_dot_product_attention takes (batch, heads, seq, head_dim)


class HeadsOnTP(autopar.Pass):
    name = "heads_on_tp"

    def __init__(self, axis: str = "tp"):
        self.axis = axis

    def run(self, program, ctx) -> str:
        if self.axis not in ctx.mesh.axis_names:
            return f"no {self.axis!r} axis on mesh {ctx.mesh}: nothing to do"
        tp = ctx.mesh.axis_names.index(self.axis)
        attention = {n for n in program.nodes() if n.op == "call_function" and "scaled_dot_product" in str(n.target)}

        def heads_not_on_tp(node, strategy) -> bool:
            return node in attention and strategy.in_specs[0].placements[tp] != Shard(HEADS_DIM)

        ctx.constraints.forbid(heads_not_on_tp)
        return f"{len(attention)} attention ops split by heads over {self.axis}"


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from examples import gpt2

    model, inputs = gpt2.make("tiny")
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware="h100-sxm", passes=[HeadsOnTP()])
    for record in plan.history:
        if record.name == HeadsOnTP.name:
            print(f"pass {record.name}: {record.note}")
    for node in plan.graph.nodes:
        if "scaled_dot_product" in node.target:
            print(f"  {node.name:<44} query {plan.strategies[node.name].in_specs[0]}")
    report = autopar.check(model, inputs, plan=plan, steps=2)
    print(report)


if __name__ == "__main__":
    main()
