"""Which module of the user's model each node of the joint graph comes from.

Capture keeps each forward node's ``nn_module_stack``, and each backward node the stack
of the forward op it differentiates (``fwd_nn_module_stack``, which the joint trace
records). Any other node (ops canonicalize added, say) takes the module of the
activations or parameters it reads, else that of the gradient it reads.
"""
from __future__ import annotations

from torch import fx

from autopar.capture.export import user_fqn
from autopar.ir.program import Program, descendants, tensor_inputs


def module_paths(program: Program) -> dict[str, str]:
    """Node name -> dotted module path ("" for the top-level model) for every call node."""
    forward = {n.name: path for n in program.nodes() if (path := _innermost_module(n)) is not None}
    param_module = {ph: fqn.rpartition(".")[0] for ph, fqn in program.params.items()}
    carries_gradient = descendants([program.node(program.loss)] if program.loss is not None else [])
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


def _innermost_module(node: fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    fqn = list(stack.values())[-1][0]
    return user_fqn(fqn) if fqn != "model" else ""
