"""plan.explain(node or module path): the layouts the solver weighed for a node, and why it chose one.

Each strategy of the node is priced as if only that node changed: its compute, moving
its inputs from their producers' chosen layouts into it ("reshard in"), and moving its
output into its consumers' chosen layouts (and a gradient into its parameter's) —
"reshard out", which holds the collectives a partial or sharded result costs. Where the
chosen layout is not the cheapest of these, the reason is one of the couplings the
explanation names: a follower or clustered layer shares the layout of another node, a
constraint rules the cheaper one out, or the memory budget (the chosen one holds less).
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.ir.placement import Spec
from autopar.ir.program import Program, tensor_inputs
from autopar.ir.redistribute import COMMUNICATING, plan_steps
from autopar.ops.attention import FORWARD as ATTENTION_FORWARD
from autopar.ops.attention import query_spec, sequence_axis
from autopar.ops.kinds import communicating_axis
from autopar.ops.moe import MOE_FORWARD
from autopar.ops.table import rule_for
from autopar.passes.base import PassContext
from autopar.passes.recompute import memory_budget
from autopar.units import human_bytes, human_seconds

_MAX_SHOWN = 12  # strategies listed per node (the chosen one always)
_MAX_NODES = 12  # nodes explained for a module


@dataclass(frozen=True)
class PricedStrategy:
    layout: str  # "in1, in2 -> out"
    compute_s: float
    reshard_in_s: float
    reshard_out_s: float
    collectives: tuple[str, ...]  # "all_reduce[tp]" of every move this layout makes
    output_bytes: float  # per device
    allowed: bool
    chosen: bool
    sequence_axis: str | None = None  # attention's: the axis its sequence is split over (context parallel)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.reshard_in_s + self.reshard_out_s


@dataclass(frozen=True)
class NodeExplanation:
    node: str
    what: str  # the op, or the parameter's name
    module: str
    strategies: tuple[PricedStrategy, ...]  # cheapest first
    reason: str

    @property
    def chosen(self) -> PricedStrategy:
        return next(s for s in self.strategies if s.chosen)

    @property
    def rejected(self) -> tuple[PricedStrategy, ...]:
        return tuple(s for s in self.strategies if not s.chosen)

    def __str__(self) -> str:
        shown = list(self.strategies[:_MAX_SHOWN]) + [s for s in self.strategies[_MAX_SHOWN:] if s.chosen]
        width = max(len("layout (in -> out)"), *(len(s.layout) for s in shown))
        lines = [f"{self.node} ({self.what}{', in ' + self.module if self.module else ''}): "
                 f"{len(self.strategies)} layouts considered",
                 f"  {'':2}{'layout (in -> out)':<{width}} {'compute':>10} {'reshard in':>11} {'reshard out':>11} "
                 f"{'total':>10} {'bytes/dev':>10}  collectives"]
        for s in shown:
            mark = "->" if s.chosen else "x " if not s.allowed else "  "
            lines.append(f"  {mark}{s.layout:<{width}} {human_seconds(s.compute_s):>10} "
                         f"{human_seconds(s.reshard_in_s):>11} {human_seconds(s.reshard_out_s):>11} "
                         f"{_total(s):>10} {human_bytes(s.output_bytes):>10}  "
                         f"{', '.join(s.collectives) or '-'}")
        if len(self.strategies) > len(shown):
            lines.append(f"  ... {len(self.strategies) - len(shown)} more, dearer")
        lines.append(f"  why: {self.reason}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Explanation:
    target: str
    nodes: tuple[NodeExplanation, ...]
    note: str = ""  # for "attention": why the sequence is split or kept whole

    def __str__(self) -> str:
        head = [] if len(self.nodes) == 1 else [f"{self.target}: {len(self.nodes)} nodes"]
        return "\n\n".join(head + [str(n) for n in self.nodes] + ([self.note] if self.note else []))


def explain(plan, program: Program, ctx: PassContext, target: str) -> Explanation:
    """``target``: a node name, a parameter's name, or a module path (its parameters and ops)."""
    nodes = _resolve(plan, program, target)
    allowed = ctx.constraints.allowed(program, program.table("strategies"), ctx.mesh)
    explained = tuple(_explain_node(plan, program, ctx, allowed, name) for name in nodes)
    note = sequence_split_note(plan, explained, memory_budget(ctx)) if target == "attention" else ""
    return Explanation(target, explained, note)


def _resolve(plan, program: Program, target: str) -> list[str]:
    strategies = program.table("strategies")
    if target == "moe":  # every mixture-of-experts layer (autopar.ops.moe), in the model's order
        layers = [n.name for n in plan.graph.nodes if n.target == MOE_FORWARD]
        if not layers:
            raise AutoparError(f"plan {plan.hash} has no mixture-of-experts layer (a Hugging Face experts module "
                               f"captured as autopar::moe_experts)")
        return layers[:_MAX_NODES]
    if target == "attention":  # every attention call of forward: where context parallelism is weighed
        layers = [n.name for n in plan.graph.nodes if n.target == ATTENTION_FORWARD]
        if not layers:
            raise AutoparError(f"plan {plan.hash} has no attention call (scaled dot-product attention, as "
                               f"F.scaled_dot_product_attention captures)")
        return layers[:_MAX_NODES]
    by_fqn = {fqn: ph for ph, fqn in program.params.items()}
    if target in by_fqn:
        return [by_fqn[target]]
    if target in strategies:
        return [target]
    params = [ph for fqn, ph in by_fqn.items() if fqn.rpartition(".")[0] == target]
    ops = [n for n, path in plan.modules.items() if path == target and n in strategies
           and plan.graph.node(n).phase == "forward" and not _is_view(plan.strategies[n])]
    ops.sort(key=lambda n: -plan.strategies[n].compute_s)
    if params or ops:
        return (params + ops)[:_MAX_NODES]
    known = sorted(set(by_fqn) | set(plan.modules.values()) | set(strategies))
    close = difflib.get_close_matches(target, known, n=3)
    raise AutoparError(f"{target!r} is no node, parameter or module of this plan"
                       + (f"; did you mean {', '.join(close)}?" if close else
                          f" (modules are e.g. {', '.join(sorted(set(plan.modules.values()))[:4])})"))


def _is_view(strategy) -> bool:
    return strategy.compute_s == 0.0


def _explain_node(plan, program: Program, ctx: PassContext, allowed: dict, name: str) -> NodeExplanation:
    strategies, meta = program.table("strategies"), program.table("meta")
    # the solver decides one variable per group (a node, its followers, its clustered layers):
    # price each of its values with every member moving together
    group = _group_of(name, strategies, program.table("tied_to"), program.table("cluster_of"))
    pricer = _Pricer(plan, program, ctx, group)
    chosen = plan.strategies
    rows = []
    for k, s in enumerate(strategies[name]):
        compute = reshard_in = reshard_out = 0.0
        collectives: list[str] = []
        ok = name != program.loss or s.out_specs[0].is_replicated()  # the loss ends replicated
        for member in group:
            compute += strategies[member][k].compute_s
            ok = ok and (allowed.get(member) is None or allowed[member][k])
            moved_in, moved_out = pricer.moves(member, k, collectives)
            collectives += _inner_collectives(program, member, strategies[member][k], ctx.mesh)
            reshard_in, reshard_out = reshard_in + moved_in, reshard_out + moved_out
        out_meta = meta[name][0]
        nbytes = math.prod(s.out_specs[0].local_shape(out_meta.shape, ctx.mesh)) * out_meta.itemsize \
            if out_meta is not None else 0.0
        is_chosen = s.in_specs == chosen[name].in_specs and s.out_specs == chosen[name].out_specs
        rows.append(PricedStrategy(_layout(s), compute, reshard_in, reshard_out, tuple(sorted(set(collectives))),
                                   nbytes, ok, is_chosen, _sequence_axis(program, name, s, ctx.mesh)))
    rows.sort(key=lambda r: (not r.allowed, r.total_s, not r.chosen))
    what = program.params.get(name) or str(program.node(name).target)
    module = plan.modules.get(name, program.params.get(name, "").rpartition(".")[0])
    return NodeExplanation(name, what, module, tuple(rows), _reason(rows, len(group), plan.solver))


def _sequence_axis(program: Program, name: str, strategy, mesh) -> str | None:
    """The axis (of more than one rank) an attention call's layout splits its sequence over."""
    node = program.node(name)
    if str(node.target) != ATTENTION_FORWARD:
        return None
    axis = sequence_axis(query_spec(node.target, strategy.in_specs))
    return mesh.axis_names[axis] if axis is not None and mesh.shape[axis] > 1 else None


def sequence_split_note(plan, nodes, budget: float) -> str:
    """Why attention's sequence is split, or kept whole: the time its calls' layouts cost each
    way (priced as the tables price them) beside the memory the plan needs, which is what the
    split saves (its activations shrink by the axis's size) and recomputation saves instead."""
    split = [n for n in nodes if n.chosen.sequence_axis]
    memory = _memory_standing(plan, budget)
    if not split:
        offered = [min((s for s in n.strategies if s.allowed and s.sequence_axis), key=lambda s: s.total_s,
                       default=None) for n in nodes]
        if not any(offered):
            return ("sequence split: none of these calls may split its sequence (a constraint rules it out, or "
                    "the call is cross-attention, has dropout, or a mask with the causal flag)")
        dearer = sum(best.total_s - n.chosen.total_s for n, best in zip(nodes, offered) if best is not None)
        priced = f"cost {human_seconds(dearer)} more over these calls than the chosen ones" if dearer >= 0 else \
            f"look {human_seconds(-dearer)} cheaper over these calls one at a time, but not beside the layouts " \
            f"around them (each call's why)"
        return f"sequence split: kept whole. The layouts splitting it {priced}; {memory}"
    axes = ", ".join(sorted({n.chosen.sequence_axis for n in split}))
    whole = [min((s for s in n.strategies if s.allowed and not s.sequence_axis), key=lambda s: s.total_s,
                 default=None) for n in split]
    head = f"sequence split: {len(split)} of {len(nodes)} calls split it over {axes}."
    if not any(whole):
        return f"{head} Their layouts keeping it whole are ruled out by a constraint (a pass or a pin); {memory}"
    faster = sum(n.chosen.total_s - best.total_s for n, best in zip(split, whole) if best is not None)
    if faster <= 0:
        return (f"{head} It is also the fastest of their layouts: keeping the sequence whole costs "
                f"{human_seconds(-faster)} more over these calls; {memory}")
    return (f"{head} Keeping the sequence whole would be {human_seconds(faster)} faster over these calls, but "
            f"holds the whole sequence's activations around attention: the split is taken for memory; {memory}")


def _memory_standing(plan, budget: float) -> str:
    """The plan's peak against its budget, and what else it takes to fit (recomputation, offload)."""
    peak = f"the plan peaks at {human_bytes(plan.predicted.peak_memory_bytes)} of its {human_bytes(budget)} budget"
    levers = []
    if plan.recompute:
        levers.append(f"recomputing {len(plan.recompute)} forward values "
                      f"(+{human_seconds(plan.predicted.recompute_s)} a step)")
    if plan.offload is not None:
        levers.append("offloading parameters to host memory")
    if not levers:
        return f"{peak} without recomputation or offload: smaller activations would buy nothing here"
    return f"{peak} by {' and '.join(levers)}"


def _inner_collectives(program: Program, name: str, strategy, mesh) -> list[str]:
    """The collectives a layout's op runs itself, priced in its compute (expert parallelism's
    all-to-alls, context parallelism's gathers of keys and values)."""
    node = program.node(name)
    rule = rule_for(node.target) if node.op == "call_function" else None
    axis = None if rule is None else communicating_axis(rule, strategy.in_specs, mesh.shape)
    if axis is None:
        return []
    return [f"{kind}[{mesh.axis_names[axis]}] inside" for kind in rule.kernel_collectives(strategy.in_specs)]


class _Pricer:
    """The resharding a group member's layout ``k`` costs beside its neighbours' chosen layouts
    (a neighbour inside the group moves with it)."""

    def __init__(self, plan, program: Program, ctx: PassContext, group: list[str]):
        self.plan, self.program, self.ctx, self.group = plan, program, ctx, group
        self.strategies, self.meta = program.table("strategies"), program.table("meta")
        self.tied = program.table("tied_to")
        self.grad_to_param = dict(program.gradient_targets())
        self.param_to_grad = {p: g for g, p in self.grad_to_param.items()}

    def price(self, src_meta, src: Spec, dst: Spec, collectives: list) -> float:
        collectives += [f"{s.kind}[{self.ctx.mesh.axis_names[s.axis]}]" for s in plan_steps(src, dst)
                        if s.kind in COMMUNICATING]
        return self.ctx.cost.reshard_time(src_meta, src, dst)

    def layout(self, node: str, k: int):
        return self.strategies[node][k] if node in self.group else self.plan.strategies[node]

    def moves(self, member: str, k: int, collectives: list) -> tuple[float, float]:
        """(seconds moving its inputs in, seconds moving its output out) under layout ``k``."""
        chosen, meta, tied = self.plan.strategies, self.meta, self.tied
        own = self.strategies[member][k]
        node = self.program.node(member)
        moved_in = moved_out = 0.0
        for j, arg in enumerate(tensor_inputs(node)):
            if arg.name not in chosen or (tied.get(member) == arg.name and len(meta[arg.name]) > 1):
                continue  # a getitem takes its multi-output op's layout by construction
            src = self.layout(arg.name, k).out_specs[0]
            moved_in += self.price(meta[arg.name][0], src, own.in_specs[j], collectives)
        for user in node.users:
            if user.name not in chosen or user.name in self.group:
                continue  # moves inside the group were priced as the user's inputs
            for j, arg in enumerate(tensor_inputs(user)):
                if arg is node and not (tied.get(user.name) == member and len(meta[member]) > 1):
                    moved_out += self.price(meta[member][0], own.out_specs[0], chosen[user.name].in_specs[j],
                                            collectives)
        if member in self.grad_to_param:  # a gradient ends in its parameter's layout
            param = self.grad_to_param[member]
            moved_out += self.price(meta[member][0], own.out_specs[0], self.layout(param, k).out_specs[0],
                                    collectives)
        grad = self.param_to_grad.get(member)
        if grad is not None and grad not in self.group:
            moved_in += self.price(meta[grad][0], chosen[grad].out_specs[0], own.out_specs[0], collectives)
        return moved_in, moved_out


def _group_of(name: str, strategies: dict, tied: dict, cluster_of: dict) -> list[str]:
    def root(n: str) -> str:
        while n in cluster_of or n in tied:
            n = cluster_of.get(n) or tied[n]
        return n

    mine = root(name)
    return [n for n in strategies if root(n) == mine]


def _reason(rows: list[PricedStrategy], group_size: int, solver) -> str:
    chosen = next(r for r in rows if r.chosen)
    shared = f" (priced with the {group_size - 1} nodes that share its layout: followers and repeated " \
             f"layers)" if group_size > 1 else ""
    forbidden = sum(1 for r in rows if not r.allowed)
    ruled_out = f"; {forbidden} ruled out by constraints (marked x)" if forbidden else ""
    cheaper = [r for r in rows if r.allowed and r.total_s < chosen.total_s - 1e-12]
    if not cheaper:
        runner_up = next((r for r in rows if r.allowed and not r.chosen), None)
        margin = " (the only allowed layout)" if runner_up is None else \
            f", tied with {runner_up.layout} (the solver's pick among equals)" \
            if runner_up.total_s - chosen.total_s < 1e-12 else \
            f", {human_seconds(runner_up.total_s - chosen.total_s)} ahead of {runner_up.layout}"
        return f"the cheapest layout given its neighbours' layouts{shared}{margin}{ruled_out}"
    best = cheaper[0]
    why = ["gradient syncs run partly hidden under backward, which these prices (full collective time) "
           "do not show"]
    if solver.status == "least-memory":
        why.append("no faster layout fitted the memory budget, so the plan is the layout holding the least memory")
    elif solver.status != "optimal":
        why.append("the solver proved no bound on the plan" if solver.gap >= 1.0 else
                   f"the solver stopped at its {'safety time' if solver.timed_out else 'work'} limit "
                   f"{solver.gap:.1%} from proven optimal")
    if chosen.output_bytes < best.output_bytes:
        why.insert(0, f"it holds {human_bytes(best.output_bytes - chosen.output_bytes)} less per device, "
                      f"which the memory budget needs")
    return (f"{best.layout} looks {human_seconds(chosen.total_s - best.total_s)} cheaper{shared}, but "
            + "; or ".join(why) + ruled_out)


def _layout(strategy) -> str:
    ins = ", ".join(str(s) for s in strategy.in_specs)
    outs = ", ".join(str(s) for s in strategy.out_specs)
    return f"{ins} -> {outs}" if ins else outs


def _total(row: PricedStrategy) -> str:
    return human_seconds(row.total_s) if row.allowed else "forbidden"
