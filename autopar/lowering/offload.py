"""Which gradients of offloaded parameters go to host memory inside backward.

A gradient leaves the device as soon as it is final (the statement defining the value backward
returns), where nothing but the return reads it after: it then holds no device memory for the
rest of backward, as PatrickStar's gradient chunks do. The others go when backward returns."""
from __future__ import annotations

from autopar.lowering.schedule import Statement


def gradients_to_host(statements: list[Statement], graph, offloaded) -> dict[str, str]:
    """{gradient variable: parameter} of the offloaded parameters' gradients moved to the host
    right after the statement that defines them (``offloaded``: the parameters' names)."""
    output = statements[-1]
    if output.kind != "output":
        return {}
    node_of = dict(zip(output.uses, graph.gradients))  # the output's uses come in the gradients' order
    last_read: dict[str, int] = {}
    defined: dict[str, int] = {}
    for i, s in enumerate(statements[:-1]):
        if s.defines is not None:
            defined.setdefault(s.defines, i)
        for u in s.uses:
            last_read[u] = i
    moved = {}
    for var, node in node_of.items():
        name = graph.grads[node]
        if name in offloaded and var in defined and last_read.get(var, -1) <= defined[var] \
                and list(output.uses).count(var) == 1:
            moved[var] = name
    return moved
