"""A plan grouped by the model's modules: what summary, `autopar show` and the HTML report list.

The module of each node is the innermost module it comes from (``plan.modules``); a
parameter belongs to the module that owns it, an input to the model itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field

TOP_LEVEL = "<model>"


@dataclass
class ModuleRow:
    path: str  # dotted module path, "" for the model itself
    params: list = field(default_factory=list)  # (fqn, shape, spec)
    forward_s: float = 0.0
    backward_s: float = 0.0
    collectives: list = field(default_factory=list)  # (redistribution, step index)


def node_modules(plan) -> dict[str, str]:
    """Node name -> module path for every node: call nodes as planned, parameters and buffers by
    their owner, inputs the model itself."""
    out = {n.name: "" for n in plan.graph.nodes}
    out.update({ph: fqn.rpartition(".")[0] for ph, fqn in {**plan.graph.params, **plan.graph.buffers}.items()})
    out.update(plan.modules)
    return out


def module_rows(plan) -> list[ModuleRow]:
    """One row per module, in the order the forward pass first runs it."""
    where = node_modules(plan)
    g = plan.graph
    ordered = [n for n in g.nodes if n.op == "call" and n.phase == "forward"] + list(g.nodes)
    rows: dict[str, ModuleRow] = {}
    for n in ordered:
        rows.setdefault(where[n.name], ModuleRow(where[n.name]))
    for ph, fqn in g.params.items():
        rows[where[ph]].params.append((fqn, g.node(ph).outputs[0].shape, plan.out_spec(ph)))
    for n in g.nodes:
        if n.op == "call" and n.name in plan.strategies:
            seconds = plan.strategies[n.name].compute_s
            if n.phase == "forward":
                rows[where[n.name]].forward_s += seconds
            else:
                rows[where[n.name]].backward_s += seconds
    for r, i in plan.collectives():
        rows[where.get(r.value, "")].collectives.append((r, i))
    return list(rows.values())


