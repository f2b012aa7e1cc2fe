"""strategies: candidate layouts per node, expanded from the rule table onto the mesh.

Followers (ops with one tensor input whose rule allows it: views, unary
pointwise, getitem) get one strategy per strategy of their producer and share
its solver variable (Alpa's followers), which keeps the solve small.

An op's strategies depend only on the op, its arguments and their shapes, so
they are worked out once per distinct call: the layers of a deep model repeat
the same few hundred calls.
"""
from __future__ import annotations

import itertools
import math
import operator

from torch import fx

from autopar.cost_models.model import CostModel
from autopar.ir.mesh import Mesh
from autopar.ir.placement import R, Shard, Spec
from autopar.ir.program import Program, TensorMeta, is_multi_output, tensor_inputs
from autopar.ir.strategy import Strategy, combine, spec_fits
from autopar.ops.kinds import LocalShapes, OpCall, ReplicateOnly, Rule, RuleDoesNotApply
from autopar.ops.table import rule_for
from autopar.passes.base import Pass, PassContext, side_table

FALLBACK = ReplicateOnly(reason="no sharding rule for this op")


def op_name(target) -> str:
    return str(target).replace("aten::", "aten.")


side_table('strategies', dict, 'node -> the Strategy values it can take')
side_table('tied_to', dict, 'node -> the node whose strategy it follows (views, unary ops)')
side_table('fallback', dict, 'node -> its op, for the nodes without a sharding rule (replicated)')
side_table('flops', dict, 'node -> FLOPs of its op on the global shapes')


class StrategiesPass(Pass):
    name = "strategies"
    requires = ("meta",)
    provides = ("strategies", "tied_to", "fallback", "flops")

    def run(self, program: Program, ctx: PassContext) -> str:
        meta = program.table("meta")
        strategies: dict[str, list[Strategy]] = {}
        tied: dict[str, str] = {}
        fallback: dict[str, str] = {}
        flops: dict[str, float] = {}  # global FLOPs of each op
        seen_calls: dict = {}  # call signature -> (rule, its strategies, FLOPs)
        followed: dict = {}
        for node in program.nodes():
            if node.op == "output":
                continue
            if node.op == "placeholder":
                strategies[node.name] = placeholder_strategies(meta[node.name][0], ctx.mesh)
                continue
            if node.op == "get_attr":  # a small constant: every rank holds all of it
                strategies[node.name] = [Strategy((), (Spec.replicated(ctx.mesh.ndim),))]
                continue
            if node.target is operator.getitem and is_multi_output(node.args[0]):
                src, i = node.args
                strategies[node.name] = [Strategy((s.out_specs[i],), (s.out_specs[i],)) for s in strategies[src.name]]
                tied[node.name] = src.name
                continue
            signature = call_signature(node, meta)
            if signature not in seen_calls:
                seen_calls[signature] = _strategies_of(node, meta, ctx)
            rule, own, flops[node.name] = seen_calls[signature]
            if rule is FALLBACK:
                fallback[node.name] = op_name(node.target)
            inputs = tensor_inputs(node)
            # the loss must end replicated: as a follower it would force its producer to be replicated
            # too, where its own strategies let a partial sum be all-reduced on the way in
            if rule.follower and len(inputs) == 1 and len(strategies[inputs[0].name]) > 0 \
                    and node.name != program.loss:
                src = inputs[0]
                src_meta = meta[src.name][0]
                key = (signature, tuple(s.out_specs[0] for s in strategies[src.name]))
                if key not in followed:
                    followed[key] = [follow(own, s.out_specs[0], src_meta, ctx.cost) for s in strategies[src.name]]
                strategies[node.name] = list(followed[key])
                tied[node.name] = src.name
            else:
                strategies[node.name] = list(own)
        # a tied weight kept apart for a pipeline is one tensor wherever a rank holds it: one layout
        placeholder_of = {fqn: ph for ph, fqn in program.params.items()}
        for alias, primary in program.tied.items():
            tied[placeholder_of[alias]] = placeholder_of[primary]
        program.tables.update(strategies=strategies, tied_to=tied, fallback=fallback, flops=flops)
        free = sum(1 for n in strategies if n not in tied)
        weighed = sum(len(strategies[n]) for n in strategies if n not in tied)
        return f"{len(strategies)} nodes, {free} free, {weighed} strategies, {len(fallback)} fallbacks"


def _strategies_of(node: fx.Node, meta: dict, ctx: PassContext) -> tuple[Rule, list[Strategy], float]:
    """(the rule that applied, the op's own strategies, its global FLOPs)."""
    rule = rule_for(node.target) or FALLBACK
    precision = ctx.request.precision
    call = make_call(node, meta, low_precision_partials=precision is not None and not precision.reduces_in_float32)
    try:
        own = expand(rule, call, node, meta, ctx.mesh, ctx.cost)
    except RuleDoesNotApply:
        rule = FALLBACK
        own = expand(rule, call, node, meta, ctx.mesh, ctx.cost)
    return rule, own, 0.0 if rule.free else rule.flops(call, call.in_shapes, call.out_shapes)


def call_signature(node: fx.Node, meta: dict) -> tuple:
    """What an op's strategies depend on: the op, its arguments with tensors as their metas."""
    def ref(arg):
        if isinstance(arg, fx.Node):
            return ("tensor", tuple(meta[arg.name]))
        if isinstance(arg, (list, tuple)):
            return tuple(ref(a) for a in arg)
        if isinstance(arg, dict):
            return tuple(sorted((k, ref(v)) for k, v in arg.items()))
        return type(arg).__name__, arg  # 1, 1.0 and True are equal keys, not equal arguments

    signature = node.target, ref(node.args), ref(node.kwargs), tuple(meta[node.name])
    try:
        hash(signature)
    except TypeError:  # an argument that cannot be a key: this call is not reused
        return None, node.name
    return signature


def placeholder_strategies(meta: TensorMeta | None, mesh: Mesh) -> list[Strategy]:
    if meta is None:
        return [Strategy((), (Spec.replicated(mesh.ndim),))]
    per_axis = [R] + [Shard(d) for d, n in enumerate(meta.shape) if n > 1]
    out = []
    for combo in itertools.product(per_axis, repeat=mesh.ndim):
        spec = Spec(combo)
        if spec_fits(spec, meta, mesh):
            out.append(Strategy((), (spec,)))
    return out


def make_call(node: fx.Node, meta: dict, low_precision_partials: bool = False) -> OpCall:
    in_metas = [meta[a.name][0] for a in tensor_inputs(node)]
    return OpCall(
        target=node.target,
        args=tuple(node.args),
        kwargs=dict(node.kwargs),
        in_shapes=tuple(m.shape if m else () for m in in_metas),
        out_shapes=tuple(m.shape if m else None for m in meta[node.name]),
        in_floating=tuple(bool(m and m.is_floating) for m in in_metas),
        in_dtypes=tuple(m.dtype if m else None for m in in_metas),
        out_dtypes=tuple(m.dtype if m else None for m in meta[node.name]),
        low_precision_partials=low_precision_partials,
    )


def expand(rule: Rule, call: OpCall, node: fx.Node, meta: dict, mesh: Mesh, cost: CostModel) -> list[Strategy]:
    """All combinations of the rule's 1-D options over the mesh axes that fit the shapes."""
    in_metas = [meta[a.name][0] for a in tensor_inputs(node)]
    out_metas = list(meta[node.name])
    options = rule.options(call)
    for o in options:
        if len(o.inputs) != len(in_metas) or len(o.outputs) != len(out_metas):
            raise AssertionError(f"rule for {op_name(node.target)} gave {o} for {len(in_metas)} inputs, "
                                 f"{len(out_metas)} outputs")
    return [Strategy(ins, outs, compute_time(rule, call, ins, outs, in_metas, out_metas, mesh, cost))
            for ins, outs in combine(options, in_metas, out_metas, mesh)]


def compute_time(rule, call, in_specs, out_specs, in_metas, out_metas, mesh, cost: CostModel) -> float:
    """Time of one op on its local shapes. The metas' dims may be sympy expressions (the cost formula)."""
    if rule.free:
        return cost.hardware.host_op_s
    in_local = [s.local_shape(m.shape, mesh) if m else () for s, m in zip(in_specs, in_metas)]
    out_local = [s.local_shape(m.shape, mesh) if m else None for s, m in zip(out_specs, out_metas)]
    nbytes = 0.0
    itemsize = 4
    for shape, m in list(zip(in_local, in_metas)) + list(zip(out_local, out_metas)):
        if m is not None:
            nbytes += math.prod(shape) * m.itemsize
            if m.is_floating:
                itemsize = m.itemsize
    inner = rule.inner_time(call, in_specs, LocalShapes(tuple(in_local), tuple(out_local), tuple(in_specs)), cost)
    return cost.op_time(rule.flops(call, in_local, out_local), nbytes, itemsize) + inner


def follow(own: list[Strategy], src_spec: Spec, src_meta: TensorMeta | None, cost: CostModel) -> Strategy:
    """The follower's best strategy given its producer's layout."""
    exact = [s for s in own if s.in_specs[0] == src_spec]
    if exact:
        return min(exact, key=lambda s: s.compute_s)
    return min(own, key=lambda s: s.compute_s + cost.reshard_time(src_meta, src_spec, s.in_specs[0]))


