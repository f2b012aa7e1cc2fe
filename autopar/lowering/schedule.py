"""The per-rank program as an ordered list of statements, before it is printed.

The torch backend prints these statements and the memory model simulates them,
so the memory that is predicted is the memory of the program that runs: the
same order, the same collectives, and a variable dropped (``del``) right after
its last use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from autopar.ir.graph import GraphIR, IRNode, resolve_target
from autopar.ir.mesh import Mesh
from autopar.ir.program import STEP
from autopar.ops.kinds import communicating_axis
from autopar.ops.table import rule_for

# per collective kind, the local size of its result, and per library the extra bytes it holds
# while it runs, as autopar.runtime.rank_mesh calls it: on gloo, all_gather keeps the gathered
# parts until it concatenates them, reduce_scatter reduces a full copy before it slices,
# all_to_all gathers then slices; on NCCL a dim-0 all_gather lands in its result and a dim-0
# reduce_scatter reads its input in place, other dims go through contiguous parts
_RESULT = {"all_gather": lambda n, p: n * p, "reduce_scatter": lambda n, p: n / p, "shard": lambda n, p: n / p}
_SCRATCH = {
    "gloo": {"all_gather": lambda n, p, dim: n * p, "reduce_scatter": lambda n, p, dim: n,
             "all_to_all": lambda n, p, dim: 2 * n * p},
    "nccl": {"all_gather": lambda n, p, dim: 0.0 if dim == 0 else n * p,
             "reduce_scatter": lambda n, p, dim: 0.0 if dim == 0 else n, "all_to_all": lambda n, p, dim: 2 * n},
}


RETURNS = ("forward_output", "output")  # the statements that hand values back to the caller


@dataclass
class Statement:
    kind: str  # placeholder | constant | call | getitem | move | start | wait | forward_output | output
    defines: str | None  # the variable it binds
    uses: tuple[str, ...] = ()  # variables it reads, in order
    node: IRNode | None = None
    redistribution: object = None  # for move / start / wait
    step: int = 0  # which step of the redistribution
    nbytes: float = 0.0  # new storage it allocates (0 for a view of an input)
    scratch: float = 0.0  # bytes held only while it runs
    alias_of: str | None = None  # a view: the variable whose storage it shares
    frees: list[str] = field(default_factory=list)  # variables dead after it: the program deletes them
    recomputed: bool = False  # a forward statement run again in backward (autopar.passes.recompute)
    prefetch: bool = False  # a parameter gather started a layer ahead (prefetch_parameter_gathers)


def schedule(graph: GraphIR, strategies: dict, redistributions, mesh: Mesh, recompute=(),
             library: str = "nccl", prefetch: bool = False) -> list[Statement]:
    """The program of a plan (or of a solution being planned) in the order it runs. The forward
    variables in ``recompute`` are dropped after their last forward use and computed again (as
    ``<name>__rc``) right before backward first reads them, with whatever they read in turn.
    ``library`` (Hardware.collectives_library) sizes the buffers collectives hold. ``prefetch``:
    parameter all-gathers start a layer ahead (prefetch_parameter_gathers, as the recompute pass
    decided for the plan); without, each runs where it is first read."""
    statements = _Scheduler(graph, strategies, redistributions, mesh, recompute, _SCRATCH[library]).run()
    return with_frees(prefetch_parameter_gathers(statements, graph) if prefetch else statements)


def backward_start(statements: list[Statement]) -> int:
    """The index of the first statement after forward's return: where the schedule starts backward."""
    return next(i for i, s in enumerate(statements) if s.kind == "forward_output") + 1


@dataclass(frozen=True)
class Split:
    """A training step's statements as two programs: ``forward`` (the placeholders, then every
    statement through its return: the loss, the other values and the buffers' new values, in
    GraphIR.forward_outputs' order) and ``backward`` (the rest, ending with the output; empty for
    a forward alone); ``saved`` are the forward variables backward reads (the values
    recomputation keeps, and those the graph computes in forward for backward), in the order
    forward defines them."""

    forward: list[Statement]
    backward: list[Statement]
    saved: tuple[str, ...]


def programs(plan) -> Split:
    """A plan's forward and backward programs, as both code generators print them."""
    return split(schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh, plan.recompute,
                          prefetch=plan.prefetch))


def split(statements: list[Statement]) -> Split:
    boundary = backward_start(statements)
    forward, backward = statements[:boundary], statements[boundary:]
    read = {u for s in backward for u in s.uses}
    defined = dict.fromkeys(s.defines for s in forward if s.kind != "placeholder" and s.defines is not None)
    return Split(forward, backward, tuple(v for v in defined if v in read))


def recomputed_name(var: str) -> str:
    return f"{var}__rc"


def moved_name(value: str, redistribution_id: str) -> str:
    """The variable holding ``value`` after a redistribution."""
    return f"{value}__{redistribution_id}"


class _Scheduler:
    def __init__(self, graph: GraphIR, strategies: dict, redistributions, mesh: Mesh, recompute, scratch: dict):
        self.graph, self.strategies, self.mesh, self.scratch = graph, strategies, mesh, scratch
        self.recompute = set(recompute)
        self.backward = False  # set once forward's outputs are computed: from there on the program is backward
        order = {n.name: i for i, n in enumerate(graph.nodes)}
        self.forward_end = max(graph.forward_outputs, key=order.__getitem__)  # forward's last output
        buffer_placeholder = {fqn: ph for ph, fqn in graph.buffers.items()}
        self.update_dst = {v: strategies[buffer_placeholder[fqn]].out_specs[0] for v, fqn in graph.mutated.items()}
        self.defining: dict[str, list[Statement]] = {}  # forward variable -> the statements that compute it
        self.copies: dict[str, str] = {}  # recomputed variable -> its backward copy
        self.by_target = {(r.value, r.dst): r for r in redistributions}  # one per (value, layout)
        placeholder = {fqn: ph for ph, fqn in graph.params.items()}
        self.grad_dst = {g: strategies[placeholder[fqn]].out_specs[0] for g, fqn in graph.grads.items()}
        self.async_syncs = {r.value: r for r in redistributions  # gradient node -> its async sync
                            if r.is_async and r.value in self.grad_dst and r.dst == self.grad_dst[r.value]}
        self.done: dict[str, str] = {}  # redistribution id -> variable holding the moved value
        self.started: dict[str, str] = {}  # redistribution id -> variable of its pending first step
        self.out: list[Statement] = []

    def run(self) -> list[Statement]:
        for node in self.graph.nodes:
            if node.op == "placeholder":
                self.out.append(Statement("placeholder", node.name, node=node))
            elif node.op == "constant":
                self.emit(Statement("constant", node.name, node=node, nbytes=self.local_bytes(node.name)))
            elif node.op == "call":
                self.call(node)
                if node.name in self.async_syncs:
                    self.start(node.name)
            if node.name == self.forward_end:
                self.forward_return()
            if node.op == "output" and self.graph.kind == STEP:
                self.finish()
        return self.out

    def emit(self, statement: Statement) -> None:
        self.out.append(statement)
        if not self.backward and statement.defines is not None:
            self.defining.setdefault(statement.defines, []).append(statement)

    def available(self, var: str) -> str:
        """The variable backward reads for ``var``: its recomputed copy when it is recomputed.
        (Forward is everything up to the loss, with the few backward ops the graph places there.)"""
        if not self.backward or var not in self.recompute:
            return var
        if var not in self.copies:
            copy = recomputed_name(var)
            for s in self.defining[var]:  # a multi-step move recomputes every step
                uses = tuple(copy if u == var else self.available(u) for u in s.uses)
                self.out.append(replace(s, defines=copy, uses=uses, frees=[], recomputed=True,
                                        alias_of=uses[0] if s.alias_of is not None else None))
            self.copies[var] = copy
        return self.copies[var]

    def local_bytes(self, name: str, index: int | None = None) -> float:
        node = self.graph.node(name)
        specs = self.strategies[name].out_specs
        total = 0.0
        for i, meta in enumerate(node.outputs):
            if meta is not None and index in (None, i):
                total += math.prod(specs[i].local_shape(meta.shape, self.mesh)) * meta.itemsize
        return total

    def moved(self, value: str, dst) -> str:
        """The variable holding ``value`` in layout ``dst``, scheduling the steps on first use."""
        r = self.by_target.get((value, dst))
        if r is None:
            return self.available(value)
        if r.id not in self.done:
            var = moved_name(value, r.id)
            current, first, nbytes = self.available(value), 0, self.local_bytes(value, 0)
            if r.id in self.started:
                nbytes = _result_bytes(r.steps[0], nbytes, self.mesh)
                self.out.append(Statement("wait", var, (self.started[r.id],), redistribution=r,
                                          alias_of=self.started[r.id]))
                current, first = var, 1
            for i in range(first, len(r.steps)):
                step = r.steps[i]
                scratch = self.scratch_bytes(step, nbytes)
                nbytes = _result_bytes(step, nbytes, self.mesh)
                self.emit(Statement("move", var, (current,), redistribution=r, step=i, nbytes=nbytes,
                                    scratch=scratch))
                current = var
            self.done[r.id] = var
        return self.available(self.done[r.id])

    def start(self, grad: str) -> None:
        r = self.async_syncs[grad]
        nbytes = self.local_bytes(grad, 0)
        self.out.append(Statement("start", f"{grad}__{r.id}_pending", (grad,), redistribution=r,
                                  nbytes=_result_bytes(r.steps[0], nbytes, self.mesh),
                                  scratch=self.scratch_bytes(r.steps[0], nbytes)))
        self.started[r.id] = f"{grad}__{r.id}_pending"

    def scratch_bytes(self, step, nbytes: float) -> float:
        return self.scratch.get(step.kind, lambda n, p, dim: 0.0)(nbytes, self.mesh.shape[step.axis], step.dim)

    def call(self, node: IRNode) -> None:
        if node.target == "getitem":
            src, _ = node.args
            source = self.available(src["ref"])
            self.emit(Statement("getitem", node.name, (source,), node=node, alias_of=source))
            return
        in_specs = iter(self.strategies[node.name].in_specs)  # refs come in tensor-input order
        uses = tuple(self.moved(name, next(in_specs)) for name in node.refs())
        rule = rule_for(resolve_target(node.target))
        view = rule is not None and rule.free and uses
        self.emit(Statement("call", node.name, uses, node=node, nbytes=0.0 if view else self.local_bytes(node.name),
                            alias_of=uses[0] if view else None, scratch=self.kernel_scratch(node, rule)))

    def kernel_scratch(self, node: IRNode, rule) -> float:
        """What a runtime kernel whose ranks communicate holds while it runs (Rule.scratch_bytes)."""
        in_specs = self.strategies[node.name].in_specs
        if rule is None or communicating_axis(rule, in_specs, self.mesh.shape) is None:
            return 0.0
        metas = [self.graph.node(ref).outputs[0] for ref in node.refs()]
        local = tuple(spec.local_shape(m.shape, self.mesh) for spec, m in zip(in_specs, metas))
        return rule.scratch_bytes(in_specs, local, tuple(m.itemsize for m in metas), self.mesh.shape)

    def forward_return(self) -> None:
        """Forward's return, once its last output is computed: the loss, the values, and each
        buffer's new value moved into the buffer's layout."""
        g = self.graph
        uses = tuple(self.available(v) for v in ([g.loss] if g.loss is not None else []) + list(g.values))
        uses += tuple(self.moved(v, self.update_dst[v]) for v in g.mutated)
        self.out.append(Statement("forward_output", None, uses))
        self.backward = True

    def finish(self) -> None:
        """Backward's return: each gradient in its parameter's layout."""
        outs = tuple(self.moved(name, self.grad_dst[name]) for name in self.graph.gradients)
        self.out.append(Statement("output", None, outs))


def prefetch_parameter_gathers(statements: list[Statement], graph: GraphIR) -> list[Statement]:
    """ZeRO-3 / FSDP prefetch, as FSDP2 runs it: the all-gathers of one layer's parameters start
    together when the previous layer's first gathered parameter is waited for, so they run while
    that layer computes; each is waited for where the program first reads it (a ``wait``, then
    any later steps of its move). The first layer starts its own gathers and the next's at its
    first. At most two layers' gathered parameters are held at once, each from its start on.
    A parameter gathered through views (forward gathers a weight's transpose) takes its views
    along. A layer is a parameter's path through its first numbered module (``layers.3``), else
    its module; its gathers form a run of consecutive parameter gathers (forward's, then
    backward's where it gathers again); none starts in forward to be waited for in backward."""
    defined_at = {s.defines: i for i, s in enumerate(statements) if s.defines is not None}
    boundary = backward_start(statements)
    runs: list[tuple[tuple, list[tuple[int, list[int]]]]] = []  # (layer, in backward) -> (index, view chain)s
    for i, s in enumerate(statements):
        if s.kind == "move" and s.step == 0 and s.redistribution.steps[0].kind == "all_gather":
            found = _parameter_view_chain(s.uses[0], statements, defined_at, graph)
            if found is None:
                continue
            layer = (_layer(graph.params[found[0]]), i >= boundary)
            if runs and runs[-1][0] == layer:
                runs[-1][1].append((i, found[1]))
            else:
                runs.append((layer, [(i, found[1])]))
    starts: dict[int, list[Statement]] = {}  # statement index -> the statements issued right before it
    replaced: dict[int, Statement | None] = {}  # index -> its wait, or None for a view moved up
    for j, (_, run) in enumerate(runs):
        anchor = runs[max(j - 1, 0)][1][0][0]
        if (anchor < boundary) != (run[0][0] < boundary):  # no gather runs from forward into backward
            anchor = run[0][0]
        ahead = anchor != run[0][0]
        for i, chain in run:
            s = statements[i]
            for v in chain:  # the views the gather reads, from where they were, unless defined already
                if v > anchor and v not in replaced:
                    starts.setdefault(anchor, []).append(statements[v])
                    replaced[v] = None
            pending = f"{s.defines}_pending"
            starts.setdefault(anchor, []).append(replace(s, kind="start", defines=pending, prefetch=ahead))
            replaced[i] = Statement("wait", s.defines, (pending,), redistribution=s.redistribution,
                                    alias_of=pending, recomputed=s.recomputed)
    out: list[Statement] = []
    for i, s in enumerate(statements):
        out += starts.get(i, [])
        if replaced.get(i, s) is not None:
            out.append(replaced.get(i, s))
    return out


def _parameter_view_chain(var: str, statements: list[Statement], defined_at: dict,
                          graph: GraphIR) -> tuple[str, list[int]] | None:
    """(the parameter placeholder ``var`` is, or is a chain of views of, the indices of those
    views in program order), or None where ``var`` is computed otherwise."""
    chain = []
    while var not in graph.params:
        i = defined_at.get(var)
        if i is None or statements[i].kind != "call" or statements[i].alias_of is None or len(statements[i].uses) != 1:
            return None
        chain.append(i)
        var = statements[i].uses[0]
    return var, chain[::-1]


def _layer(fqn: str) -> str:
    parts = fqn.split(".")
    numbered = next((k for k, part in enumerate(parts[:-1]) if part.isdigit()), None)
    return ".".join(parts[:numbered + 1]) if numbered is not None else fqn.rpartition(".")[0]


def _result_bytes(step, nbytes: float, mesh) -> float:
    return _RESULT.get(step.kind, lambda n, p: n)(nbytes, mesh.shape[step.axis])


def with_frees(statements: list[Statement], held=()) -> list[Statement]:
    """``statements``, each with the variables it was the last to read (or that nothing reads)
    as its ``frees``; never the placeholders or ``held`` (what the caller holds)."""
    statements = [replace(s, frees=[]) for s in statements]
    last: dict[str, int] = {}
    for i, s in enumerate(statements):
        if s.defines is not None:
            last.setdefault(s.defines, i)
        for v in s.uses:
            last[v] = i
    placeholders = {s.defines for s in statements if s.kind == "placeholder"} | set(held)  # the caller holds these
    for v, i in last.items():
        if v not in placeholders and statements[i].kind not in RETURNS:
            statements[i].frees.append(v)
    return statements
