"""An op outside the translation table, decomposed at emission into ops inside it.

PyTorch's decompositions for backends (``torch._decomp.core_aten_decompositions``) rewrite an
op into Core ATen; traced on this rank's blocks (fake tensors of the local shapes), they give a
small graph of ops the table translates, which the module carries as one function per node
(``decomposed_<node>``: its shapes are this node's). A decomposition that needs an op the
table lacks raises AutoparError naming that op; the code generator adds the node and module.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from autopar.errors import AutoparError
from autopar.ir.graph import resolve_target


@functools.cache
def _decompositions() -> dict:
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions())


def has_decomposition(target: str) -> bool:
    try:
        return resolve_target(target) in _decompositions()
    except (AttributeError, ValueError):  # a library's op that is not loaded, or not an ATen name
        return False


def decomposed_function(name: str, target: str, args: list, kwargs: dict, inputs: list, table: dict,
                        dtype_text: Callable[[torch.dtype], str]) -> tuple[list[str], list]:
    """(the source lines of ``def name(...)``, the table functions it calls) for ``target``
    called with ``args``/``kwargs`` (IR arguments: ``{"ref": ...}`` for tensors), whose tensor
    inputs are ``inputs`` (local (shape, dtype name) pairs, in reference order)."""
    examples = [torch.empty(shape, dtype=getattr(torch, dtype), device="meta") for shape, dtype in inputs]
    op = resolve_target(target)

    def call(*tensors):
        supply = iter(tensors)
        return op(*_python_values(args, supply), **_python_values(kwargs, supply))

    decomposed = make_fx(call, decomposition_table=_decompositions(), tracing_mode="fake")(*examples)
    # traced again, functionalized: a decomposition may write in place (copy_, sub_), which JAX cannot
    pure = torch.func.functionalize(decomposed, remove="mutations")
    graph = make_fx(pure, tracing_mode="fake")(*examples).graph
    return _source(name, target, graph, table, dtype_text)


def _python_values(value, tensors):
    """IR arguments as torch takes them: the next of ``tensors`` for each tensor reference."""
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            return next(tensors)
        if set(value) == {"dtype"}:
            return getattr(torch, value["dtype"])
        if set(value) == {"device"}:
            return torch.device("meta")
        if set(value) == {"layout"}:
            return getattr(torch, value["layout"])
        if set(value) == {"memory_format"}:
            return getattr(torch, value["memory_format"])
        return {k: _python_values(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_python_values(v, tensors) for v in value]
    return value


def _source(name: str, target: str, graph, table: dict, dtype_text) -> tuple[list[str], list]:
    variables: dict = {}
    params, body, used = [], [], []
    for node in graph.nodes:
        if node.op == "placeholder":
            variables[node] = f"x{len(params)}"
            params.append(variables[node])
        elif node.op == "call_function":
            variables[node] = f"t{len(variables) - len(params)}"
            body.append(f"{variables[node]} = {_call_text(node, variables, table, used, target, dtype_text)}")
        elif node.op == "output":
            body.append(f"return {_argument_text(node.args[0], variables, dtype_text)}")
    lines = [f"def {name}({', '.join(params)}):", f'    """{target}, decomposed into Core ATen for these shapes."""']
    return lines + ["    " + line for line in body], used


def _call_text(node, variables: dict, table: dict, used: list, target: str, dtype_text) -> str:
    args = [_argument_text(a, variables, dtype_text) for a in node.args]
    if node.target is operator.getitem:
        return f"{args[0]}[{args[1]}]"
    function = table.get(str(node.target).replace("aten::", "aten."))
    if function is None:
        raise AutoparError(f"it calls {node.target}")
    if function not in used:
        used.append(function)
    args += [f"{k}={_argument_text(v, variables, dtype_text)}" for k, v in node.kwargs.items()]
    return f"{function.__name__}({', '.join(args)})"


def _argument_text(value, variables: dict, dtype_text) -> str:
    if isinstance(value, torch.fx.Node):
        return variables[value]
    if isinstance(value, (list, tuple)):
        items = ", ".join(_argument_text(v, variables, dtype_text) for v in value)
        return f"({items},)" if isinstance(value, tuple) and len(value) == 1 else \
            (f"({items})" if isinstance(value, tuple) else f"[{items}]")
    if isinstance(value, torch.dtype):
        return dtype_text(value)
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return "None"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"float('{value}')"
    return repr(value)


def local_inputs(plan, node) -> list[tuple[list[int], str]]:
    """(local shape, dtype) of each tensor ``node`` reads, in reference order, as this rank holds it."""
    specs = plan.strategies[node.name].in_specs
    out = []
    for spec, ref in zip(specs, node.refs()):
        meta = plan.graph.node(ref).outputs[0]
        out.append((list(spec.local_shape(meta.shape, plan.mesh)), meta.dtype))
    return out
