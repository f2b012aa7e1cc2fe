"""The sharding problem of one program on one mesh as plain arrays, for autopar.solvers.sharding.

Nodes tied together (followers, and the layers cluster_layers matched to a template layer)
share one variable group; an edge inside a group folds into the group's own cost. Each
group's strategies carry compute and the reshards into them; each pair of groups carries a
matrix of reshard times. Then the constraints that make the program a training step, one
function per family: the loss ends replicated, each gradient ends in its parameter's layout
(its first collective partly hidden under backward, ``Hardware.gradient_overlap``; on a
pipeline stage's micro-batch, 1/m of it: the syncs run once per step), each
buffer's new value in its buffer's layout, and what the user's constraints rule out costs
infinity. Under mixed precision, a gradient's partial sums are reduced in the policy's
reduction dtype (autopar.passes.mixed_precision).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from autopar.ir.placement import Partial, Spec
from autopar.ir.program import Program, forward_nodes, tensor_inputs
from autopar.passes.base import PassContext
from autopar.passes.mixed_precision import gradients_to_reduce_on_the_wire, partial_sums_to_keep
from autopar.solvers.sharding import Overlap


@dataclass(frozen=True)
class ShardingProblem:
    strategies: dict  # node -> the strategies it can take
    groups: list  # the node deciding each variable group
    group_of: dict  # node -> index of the group that decides its strategy
    node_costs: list  # per group and strategy: seconds (inf: ruled out)
    edge_costs: dict  # (group, group) -> matrix of seconds between their strategies
    edges: list  # the same as the solver takes them: (group, group, rows of seconds)
    overlap: Overlap | None  # gradient syncs that can hide under backward, None where none can
    hint: list  # per group, its replicated strategy (the data-parallel start), None where it has none

    @property
    def options(self) -> list:
        return [self.strategies[g] for g in self.groups]

    @property
    def booleans(self) -> int:
        """The full integer program's booleans: one per strategy and per finite edge entry."""
        return sum(len(c) for c in self.node_costs) + sum(int(np.isfinite(m).sum()) for m in self.edge_costs.values())

    def choice_of(self, choice) -> dict:
        """node -> chosen Strategy, for a solver's ``choice`` (one index per group)."""
        return {name: self.strategies[name][choice[self.group_of[name]]] for name in self.strategies}


def build_problem(program: Program, ctx: PassContext, allowed: dict) -> ShardingProblem:
    """``allowed``: node -> keep flag per strategy, from the constraints."""
    builder = _Builder(program, ctx)
    forward = forward_nodes(program)
    for node in program.nodes():
        if node.op == "call_function":
            builder.price_compute(node, backward=node.name not in forward)
            builder.price_input_reshards(node)
    _require_replicated_loss(builder, program)
    _require_gradients_in_parameter_layouts(builder, program)
    _require_buffer_updates_in_buffer_layouts(builder, program)
    _forbid_what_constraints_rule_out(builder, allowed)
    return builder.finish()


def variable_groups(strategies: dict, tied: dict, cluster_of: dict) -> tuple[list, dict]:
    """(the node deciding each group, node -> its group's index): a node follows its cluster
    template and its tie until one that follows nothing."""
    groups = [n for n in strategies if n not in tied and n not in cluster_of]
    index = {g: i for i, g in enumerate(groups)}
    group_of = {}
    for name in strategies:
        root = name
        while root in cluster_of or root in tied:
            root = cluster_of[root] if root in cluster_of else tied[root]
        group_of[name] = index[root]
    return groups, group_of


class _Builder:
    def __init__(self, program: Program, ctx: PassContext):
        self.meta, self.strategies = program.table("meta"), program.table("strategies")
        self.tied, self.cluster_of = program.table("tied_to"), program.table("cluster_of")
        self.cost = ctx.cost
        self.kappa = ctx.cost.hardware.gradient_overlap
        self.sync_share = ctx.request.sync_share  # 1/m on a pipeline stage: gradients sync once per m micro-batches
        self.forbidden_move = ctx.constraints.move_checker(ctx.mesh)
        precision = ctx.request.precision
        self.keep_partial = partial_sums_to_keep(program, self.meta, precision)
        self.wire_dtype = {g: precision.reduce for g in gradients_to_reduce_on_the_wire(program, self.meta, precision)}
        self.groups, self.group_of = variable_groups(self.strategies, self.tied, self.cluster_of)
        self.node_costs = [[0.0] * len(self.strategies[g]) for g in self.groups]
        self.cover = [[0.0] * len(self.strategies[g]) for g in self.groups]  # backward that syncs hide under
        self.edge_costs: dict[tuple[int, int], np.ndarray] = {}
        self.hidden: dict[tuple[int, int], np.ndarray] = {}
        self._matrices: dict[tuple, np.ndarray] = {}

    def price_compute(self, node, backward: bool) -> None:
        g = self.group_of[node.name]
        for k, s in enumerate(self.strategies[node.name]):
            self.node_costs[g][k] += s.compute_s
            if backward:
                self.cover[g][k] += self.kappa * s.compute_s

    def price_input_reshards(self, node) -> None:
        for j, arg in enumerate(tensor_inputs(node)):
            if self.tied.get(node.name) == arg.name and arg.op == "call_function" and len(self.meta[arg.name]) > 1:
                continue  # getitem of a multi-output op: same layout by construction
            m = self.meta[arg.name][0]
            keep = (arg.name, node.name) in self.keep_partial
            self.add_edge(arg.name, node.name, j, lambda src, dst, m=m, keep=keep:
                          self.reshard_time(m, src, dst, keep_partial=keep), dst_input=j)

    def reshard_time(self, meta, src, dst, keep_partial: bool = False, bucketed: bool = False) -> float:
        if self.forbidden_move is not None and self.forbidden_move(src, dst):
            return math.inf
        if keep_partial and _reduces(src, dst):
            return math.inf
        return self.cost.reshard_time(meta, src, dst, bucketed)

    def add_edge(self, src: str, dst: str, kind, price, dst_input: int | None = None,
                 into: dict | None = None) -> None:
        """Add price(src's output spec, dst's spec) between each pair of their strategies to the
        edge between their groups; dst's spec is that of its input ``dst_input``, or of its
        output where None (``into``: the hidden syncs instead of the edge costs). Edges of
        clustered layers repeat the template's (same strategies, same shapes): priced once."""
        into = self.edge_costs if into is None else into
        key = (self.cluster_of.get(src, src), self.cluster_of.get(dst, dst), kind)
        matrix = self._matrices.get(key)
        if matrix is None:
            src_specs = [s.out_specs[0] for s in self.strategies[src]]
            dst_specs = [s.out_specs[0] if dst_input is None else s.in_specs[dst_input] for s in self.strategies[dst]]
            matrix = self._matrices[key] = _price_matrix(src_specs, dst_specs, price)
        gi, gj = self.group_of[src], self.group_of[dst]
        if gi == gj:
            own = self.node_costs[gi]
            for k, c in enumerate(np.diagonal(matrix).tolist()):
                own[k] += c
        elif (gj, gi) in into:
            into[gj, gi] += matrix.T
        elif (gi, gj) in into:
            into[gi, gj] += matrix
        else:
            into[gi, gj] = matrix.copy()

    def finish(self) -> ShardingProblem:
        overlap = Overlap([(i, j, m.tolist()) for (i, j), m in self.hidden.items()], self.cover) \
            if self.hidden else None
        edges = [(i, j, m.tolist()) for (i, j), m in self.edge_costs.items()]
        return ShardingProblem(self.strategies, self.groups, self.group_of, self.node_costs, self.edge_costs, edges,
                               overlap, [_replicated_index(self.strategies[g]) for g in self.groups])


def _price_matrix(src_specs: list, dst_specs: list, price) -> np.ndarray:
    """price(a, b) for each pair of (src, dst) specs, computed once per distinct pair: strategies
    that differ in their other inputs share these specs, and a layer's matrices run to
    hundreds of entries over a handful of distinct layouts."""
    rows, row_of = _distinct(src_specs)
    columns, column_of = _distinct(dst_specs)
    distinct = np.array([[price(a, b) for b in columns] for a in rows], dtype=float).reshape(len(rows), len(columns))
    return distinct[np.ix_(row_of, column_of)]


def _distinct(specs: list) -> tuple[list, list]:
    """(the distinct specs in order of first appearance, each spec's index among them)."""
    index: dict = {}
    positions = [index.setdefault(spec, len(index)) for spec in specs]
    return list(index), positions


def _reduces(src: Spec, dst: Spec) -> bool:
    return any(isinstance(a, Partial) and not isinstance(b, Partial) for a, b in zip(src.placements, dst.placements))


def _require_replicated_loss(builder: _Builder, program: Program) -> None:
    """The loss ends replicated on every rank."""
    if program.loss is None:
        return
    group = builder.group_of[program.loss]
    for k, s in enumerate(builder.strategies[program.loss]):
        if not s.out_specs[0].is_replicated():
            builder.node_costs[group][k] = math.inf


def _require_gradients_in_parameter_layouts(builder: _Builder, program: Program) -> None:
    """Each gradient ends in its parameter's layout, so the optimizer updates matching shards; the
    first step of a gradient's sync can run under backward (priced on the hidden-sync edges)."""
    meta, cost = builder.meta, builder.cost
    for grad, param in program.gradient_targets():
        moved = meta[grad][0]
        if grad in builder.wire_dtype:  # a mixed-precision gradient reduced in its compute dtype
            moved = dataclasses.replace(moved, dtype=builder.wire_dtype[grad])
        hideable = builder.kappa > 0 and builder.group_of[grad] != builder.group_of[param]
        share = builder.sync_share
        builder.add_edge(grad, param, ("sync", hideable), lambda src, dst, moved=moved, hideable=hideable, share=share:
                         share * (builder.reshard_time(moved, src, dst, bucketed=True)
                                  - (cost.async_time(moved, src, dst) if hideable else 0.0)))
        if hideable:
            builder.add_edge(grad, param, "hidden sync", lambda src, dst, moved=moved, share=share:
                             share * cost.async_time(moved, src, dst), into=builder.hidden)


def _require_buffer_updates_in_buffer_layouts(builder: _Builder, program: Program) -> None:
    """A buffer's new value (BatchNorm's running statistics) ends in the buffer's layout, where
    the runtime writes it back."""
    placeholder = {fqn: ph for ph, fqn in program.buffers.items()}
    for value, fqn in program.mutated.items():
        buffer = placeholder[fqn]
        builder.add_edge(value, buffer, "update", lambda src, dst, meta=builder.meta[value][0]:
                         builder.reshard_time(meta, src, dst))


def _forbid_what_constraints_rule_out(builder: _Builder, allowed: dict) -> None:
    """A strategy a constraint rules out (node -> keep flag per strategy) costs infinity."""
    for name, keep in allowed.items():
        for k, ok in enumerate(keep):
            if not ok:
                builder.node_costs[builder.group_of[name]][k] = math.inf


def _replicated_index(options) -> int | None:
    for k, s in enumerate(options):
        if all(spec.is_replicated() for spec in s.in_specs + s.out_specs):
            return k
    return None
