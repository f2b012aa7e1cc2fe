"""Rewrites during and after capture that make more of the graph shardable.

A mean divides by a global count: computed on a shard it would divide by the
local count. Written as a sum and a division by the global count, the sum can be
split (it becomes a partial sum) and the division stays exact.
"""
from __future__ import annotations

import functools
import math
import operator

import torch

from autopar.ir.program import Program
from autopar.ops.table import rule_for

aten = torch.ops.aten


def capture_decompositions() -> dict:
    """The decompositions capture applies: every op without a sharding rule that PyTorch writes
    in Core ATen (``torch._decomp``), so the solver shards what the op is made of instead of
    replicating it (only an op with neither stays whole, and is replicated); and composite
    losses whose mean hides a local count, whose decompositions use plain ops. Filtered on each
    capture: a rule registered since (autopar.register_rule) keeps its op whole."""
    table = {op: fn for op, fn in _core_aten_decompositions().items() if rule_for(op) is None}
    table.update(_loss_decompositions())
    return table


@functools.cache
def _core_aten_decompositions() -> dict:
    """torch's Core ATen decompositions, materialized once per process (tens of milliseconds,
    which every capture paid)."""
    from torch._decomp import core_aten_decompositions

    return {op: fn for op, fn in core_aten_decompositions().items() if isinstance(op, torch._ops.OpOverload)}


@functools.cache
def _loss_decompositions() -> dict:
    from torch._decomp import get_decompositions

    return get_decompositions([aten.mse_loss, aten.mse_loss_backward, aten.l1_loss, aten.smooth_l1_loss,
                               aten.smooth_l1_loss_backward, aten.huber_loss, aten.huber_loss_backward])


def canonicalize(program: Program, tied: dict[str, str]) -> None:
    _retie(program, tied)
    drop_assertions(program)
    _detach_factories(program)
    _rewrite_mean_nll(program)
    _rewrite_mean(program)
    _fold_double_transposes(program)
    program.gm.graph.lint()
    program.gm.recompile()


def _retie(program: Program, tied: dict[str, str]) -> None:
    """Make tied parameters one placeholder again; its gradient sums those of all its uses."""
    graph = program.gm.graph
    placeholder = {fqn: ph for ph, fqn in program.params.items()}
    grad_of = {fqn: g for g, fqn in program.grads.items()}
    output = next(n for n in graph.nodes if n.op == "output")
    nodes = {n.name: n for n in graph.nodes}
    for alias, primary in tied.items():
        alias_ph, primary_ph = nodes[placeholder[alias]], nodes[placeholder[primary]]
        alias_ph.replace_all_uses_with(primary_ph)
        graph.erase_node(alias_ph)
        del program.params[alias_ph.name]
        g_alias = nodes[grad_of.pop(alias)] if alias in grad_of else None
        g_primary = nodes[grad_of[primary]] if primary in grad_of else None
        if g_alias is None:
            continue
        if g_primary is None:  # only the alias name was used in forward
            grad_of[primary] = g_alias.name
            continue
        with graph.inserting_before(output):
            total = graph.call_function(aten.add.Tensor, (g_primary, g_alias))
        total.meta["val"] = g_primary.meta["val"]
        output.args = (tuple(total if o is g_primary else o for o in output.args[0] if o is not g_alias),)
        grad_of[primary] = total.name
        nodes[total.name] = total
    program.grads = {g: fqn for fqn, g in grad_of.items()}
    program.outputs = [o.name if o is not None else None for o in output.args[0]]


def drop_assertions(program: Program) -> None:
    """Metadata assertions check global sizes: meaningless on local blocks, and they return
    nothing; with them go the constant copies only they read."""
    graph = program.gm.graph
    for node in list(graph.nodes):
        if node.target is aten._assert_tensor_metadata.default and not node.users:
            checked = node.all_input_nodes
            graph.erase_node(node)
            for value in checked:
                if value.target is aten.lift_fresh_copy.default and not value.users:
                    source = value.args[0]
                    graph.erase_node(value)
                    if source.op == "get_attr" and not source.users:
                        graph.erase_node(source)
                        program.constants.pop(source.name, None)


_NEW_FACTORIES = {aten.new_zeros.default: aten.zeros.default, aten.new_ones.default: aten.ones.default,
                  aten.new_empty.default: aten.empty.memory_format}


def _detach_factories(program: Program) -> None:
    """x.new_zeros(size) reads only x's dtype: as zeros(size, dtype=...) it no longer ties a layout to x."""
    graph = program.gm.graph
    for node in list(graph.nodes):
        factory = _NEW_FACTORIES.get(node.target)
        if factory is None:
            continue
        val = node.meta["val"]
        kwargs = {"dtype": val.dtype, "layout": torch.strided, "device": val.device, "pin_memory": False}
        with graph.inserting_before(node):
            made = graph.call_function(factory, (node.args[1],), kwargs)
        made.meta["val"] = val
        node.replace_all_uses_with(made)
        graph.erase_node(node)


def _fold_double_transposes(program: Program) -> None:
    """t(t(x)) is x (AOTAutograd writes a linear layer's weight gradient as one): readers of the
    outer transpose read x, and the gradient or loss it was is now x."""
    graph = program.gm.graph
    for node in list(graph.nodes):
        inner = node.args[0] if node.target is aten.t.default else None
        if not isinstance(inner, torch.fx.Node) or inner.target is not aten.t.default:
            continue
        source = inner.args[0]
        if node.name in program.grads and source.name in program.grads:
            continue  # two parameters' gradients would become one node
        node.replace_all_uses_with(source)
        _rename_output(program, node.name, source.name)
        graph.erase_node(node)
        if not inner.users:
            graph.erase_node(inner)


def _rename_output(program: Program, old: str, new: str) -> None:
    """The graph output (loss, value, buffer update or gradient) that was node ``old`` is now node ``new``."""
    for table in (program.grads, program.mutated):
        if old in table:
            table[new] = table.pop(old)
    if program.loss == old:
        program.loss = new
    program.values = [new if v == old else v for v in program.values]
    program.outputs = [new if o == old else o for o in program.outputs]


def _rewrite_mean(program: Program) -> None:
    """mean(x, dims) -> sum(x, dims) / count."""
    graph = program.gm.graph
    for node in list(graph.nodes):
        if node.target not in (aten.mean.dim, aten.mean.default):
            continue
        x = node.args[0]
        val = x.meta["val"]
        if not val.dtype.is_floating_point or node.kwargs.get("dtype") is not None:
            continue
        if node.target is aten.mean.default:
            dims, keep = list(range(val.dim())), False
        else:
            dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else list(range(val.dim()))
            keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        count = math.prod(val.shape[d] for d in dims) if dims else 1
        with graph.inserting_before(node):
            total = graph.call_function(aten.sum.dim_IntList, (x, list(dims), keep))
            total.meta["val"] = node.meta["val"]
            mean = graph.call_function(aten.div.Scalar, (total, count))
            mean.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(mean)
        _rename_output(program, node.name, mean.name)
        graph.erase_node(node)


def _rewrite_mean_nll(program: Program) -> None:
    """nll_loss(mean) -> nll_loss(sum) / total_weight.

    The mean divides by a global count; as a sum and a count, both halves are
    partial sums over a sharded batch and one all-reduce each makes them whole.
    """
    graph = program.gm.graph
    for node in list(graph.nodes):
        if node.target is not aten.nll_loss_forward.default or node.args[3] != 1:
            continue
        getters = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if 0 not in getters:
            continue
        with graph.inserting_after(node):
            summed = graph.call_function(aten.nll_loss_forward.default, (*node.args[:3], 2, *node.args[4:]))
        summed.meta["val"] = node.meta["val"]
        with graph.inserting_after(summed):
            total = graph.call_function(operator.getitem, (summed, 0))
        total.meta["val"] = node.meta["val"][0]
        with graph.inserting_after(total):
            weight = graph.call_function(operator.getitem, (summed, 1))
        weight.meta["val"] = node.meta["val"][1]
        with graph.inserting_after(weight):
            mean = graph.call_function(aten.div.Tensor, (total, weight))
        mean.meta["val"] = getters[0].meta["val"]
        old_loss = getters[0].name
        getters[0].replace_all_uses_with(mean)
        if 1 in getters:
            getters[1].replace_all_uses_with(weight)
        for g in getters.values():
            graph.erase_node(g)
        graph.erase_node(node)
        _rename_output(program, old_loss, mean.name)
