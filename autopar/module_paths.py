"""Which module of the user's model each node of the joint graph comes from.

AOTAutograd's joint graph keeps no ``nn_module_stack``, but torch.export's
forward graph does. Decomposed as capture decomposes, that graph holds nearly
the same sequence of ATen ops as the joint graph's forward, so aligning the two
sequences names the module of each forward node. Any other node (backward ops,
ops canonicalize added) takes the module of the activations or parameters it
reads, else that of the gradient it reads.
"""
from __future__ import annotations

import difflib
import warnings
from typing import Optional

import torch
from torch import fx
from torch._export.utils import _collect_all_valid_cia_ops

from autopar.canonicalize import capture_decompositions
from autopar.capture import user_fqn
from autopar.program import Program, descendants, forward_nodes, tensor_inputs


def module_paths(program: Program) -> dict[str, str]:
    """Node name -> dotted module path ("" for the top-level model) for every call node."""
    if program.exported is None:
        return {}
    forward = _aligned_forward_paths(program)
    param_module = {ph: fqn.rpartition(".")[0] for ph, fqn in program.params.items()}
    carries_gradient = descendants([program.node(program.loss)])
    paths: dict[str, str] = {}
    for node in program.nodes():
        if node.op != "call_function":
            continue
        if node.name in forward:
            paths[node.name] = forward[node.name]
            continue
        # a backward op reads the gradient coming from outer modules and the activations (or
        # parameters) of the module it differentiates: the latter name it
        labelled = [(i.name in carries_gradient, forward.get(i.name, param_module.get(i.name, paths.get(i.name))))
                    for i in tensor_inputs(node)]
        labelled = [(grad, path) for grad, path in labelled if path is not None]
        if labelled:
            paths[node.name] = min(labelled, key=lambda gp: (gp[0], -len(gp[1])))[1]
    return paths


def _aligned_forward_paths(program: Program) -> dict[str, str]:
    with warnings.catch_warnings():  # torch's own pytree deprecation notices, not the user's business
        warnings.simplefilter("ignore", FutureWarning)
        try:
            decomposed = program.exported.run_decompositions(_same_decompositions(capture_decompositions()))
        except Exception:  # noqa: BLE001 - naming modules is a courtesy: never fail a plan over it
            return {}
    theirs = [n for n in decomposed.graph.nodes if n.op == "call_function"]
    in_forward = forward_nodes(program)
    ours = [n for n in program.nodes() if n.op == "call_function" and n.name in in_forward]
    matcher = difflib.SequenceMatcher(None, [str(n.target) for n in theirs], [str(n.target) for n in ours],
                                      autojunk=False)
    out = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            path = _innermost_module(theirs[block.a + k])
            if path is not None:
                out[ours[block.b + k].name] = path
    return out


def _same_decompositions(own: dict):
    """Our table plus the CompositeImplicitAutograd ops, which AOTAutograd always decomposes."""
    implicit = _collect_all_valid_cia_ops()
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if op not in implicit and op not in own:
            table.pop(op)
    table.update(own)
    return table


def _innermost_module(node: fx.Node) -> Optional[str]:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    fqn = list(stack.values())[-1][0]
    return user_fqn(fqn) if fqn != "model" else ""
