"""Names a person would give: the plan as the emitted programs print it.

Parameters and buffers are named by their path (``blocks.0.attn.q.weight`` ->
``blocks_0_attn_q_weight``), the model's inputs by forward's argument names, its other
outputs by their place in its output (``logits``), each gradient ``grad_<parameter>``, and
CPU flash attention's values ``attention`` (the program calls the device's kernel). Every
other value computed inside a submodule is named by the module and its op
(``blocks_0_attn_bmm``, then ``blocks_0_attn_bmm_1``); the model's own values keep their
graph name. The plan's own node names (what plans, pins and explain use) do not change.
"""
from __future__ import annotations

import dataclasses
import keyword
import re

from autopar.lowering.schedule import moved_name

# names the emitted programs' step functions read besides their values (the torch and JAX
# programs' modules, helpers, functions and arguments); JAX's ATen helpers are all ``aten_*``
_RESERVED = {"rt", "torch", "aten", "forward", "backward", "accumulate", "saved", "grad_loss", "sync", "unsynced",
             "None", "loss", "jax", "jnp", "lax", "np", "math", "P", "block", "forward_local", "backward_local",
             "local_step"}


_CPU_ATTENTION = "_scaled_dot_product_flash_attention_for_cpu"


def readable(plan):
    """``plan`` with its nodes renamed for printing (its hash and fingerprint are the original's)."""
    names = readable_names(plan.graph, plan.modules)
    new = names.get
    # a recomputed variable can be a moved value (``<node>__<redistribution>``)
    moved = {moved_name(r.value, r.id): moved_name(new(r.value, r.value), r.id) for r in plan.redistributions}
    redistributions = tuple(dataclasses.replace(r, value=new(r.value, r.value),
                                                consumers=tuple(new(c, c) for c in r.consumers))
                            for r in plan.redistributions)
    return dataclasses.replace(
        plan,
        graph=plan.graph.renamed(names),
        strategies={new(k, k): v for k, v in plan.strategies.items()},
        redistributions=redistributions,
        recompute=tuple(names.get(v) or moved.get(v, v) for v in plan.recompute),
        fallback_nodes={new(k, k): v for k, v in plan.fallback_nodes.items()},
        fallback_modules={new(k, k): v for k, v in plan.fallback_modules.items()},
        modules={new(k, k): v for k, v in plan.modules.items()},
        pipeline=plan.pipeline and dataclasses.replace(
            plan.pipeline, node_units={new(k, k): v for k, v in plan.pipeline.node_units.items()}),
    )


def readable_names(graph, modules: dict[str, str] | None = None) -> dict[str, str]:
    """graph node name -> the name to print, for the nodes that get one (``modules``: node ->
    the path of the module it was computed in, ``Plan.modules``)."""
    wanted = {}
    for ph, fqn in list(graph.params.items()) + list(graph.buffers.items()):
        wanted[ph] = identifier(fqn)
    for ph, name in zip(graph.inputs, graph.input_names):
        wanted[ph] = identifier(name)
    value_names = graph.output_tree.value_names if graph.output_tree is not None else []
    for value, name in zip(graph.values, value_names):
        wanted.setdefault(value, identifier(name))
    for grad, fqn in graph.grads.items():
        if grad not in wanted:  # a gradient that is also an input keeps the input's name
            wanted[grad] = "grad_" + identifier(fqn)
    for node in graph.nodes:  # named by what it computes: the program runs the device's own kernel
        if node.name.startswith(_CPU_ATTENTION):
            wanted.setdefault(node.name, "attention" + node.name.removeprefix(_CPU_ATTENTION))
    _name_by_module(graph, modules or {}, wanted)
    taken = {n.name for n in graph.nodes if n.name not in wanted} | _RESERVED
    names = {}
    for node, name in wanted.items():
        while name in taken or name.startswith("aten_"):
            name = name + "_" if name in taken else "_" + name
        taken.add(name)
        names[node] = name
    return names


def identifier(text: str) -> str:
    """``text`` as a Python identifier: characters other than ASCII letters, digits and ``_`` become ``_``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    if not name or name[0].isdigit() or keyword.iskeyword(name):
        name = "_" + name
    return name


def _name_by_module(graph, modules: dict[str, str], wanted: dict[str, str]) -> None:
    """``<module>_<op>`` (numbered from the second on) for each value computed in a submodule
    that has no name yet: the op is the graph name without its counter (``addmm_1`` -> ``addmm``)."""
    seen: dict[str, int] = {}
    for node in graph.nodes:
        module = modules.get(node.name)
        if node.op != "call" or not module or node.name in wanted:
            continue
        stem = identifier(module) + "_" + re.sub(r"_\d+$", "", node.name)
        count = seen.get(stem, 0)
        seen[stem] = count + 1
        wanted[node.name] = stem if count == 0 else f"{stem}_{count}"
