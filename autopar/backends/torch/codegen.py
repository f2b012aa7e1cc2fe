"""Torch backend: the plan as per-rank Python source, a forward and a backward program.

Every rank runs the same ``forward`` and ``backward`` on its local shards: one ATen call per
line, a trailing comment with global shape, local shape and placement, and each collective on
its own line through the runtime object ``rt``. ``forward`` returns the loss, the values
backward reads (``saved``), the model's other outputs (in their planned layouts) and the
buffers' new values; ``backward`` takes the saved values back and returns each parameter's
gradient by name. A plan of a forward alone (evaluation) has no ``backward``. A gradient's
first all-reduce / reduce-scatter starts asynchronously right after the
gradient is computed and is waited for at the return, so it overlaps the rest of backward.
Each variable is deleted after its last use, so memory is freed as the memory model
(autopar.lowering.memory) assumes. The order comes from autopar.lowering.schedule.
"""
from __future__ import annotations

import dataclasses

import torch

from autopar.backends.printer import (
    Sections,
    call_arguments,
    constant_note,
    header,
    indented,
    kernel_axis,
    kernel_modules,
    literal,
    local_call,
    op_text,
    shape_text,
    torch_name,
    wrapped,
)
from autopar.backends.torch.chunk_moves import ChunkMoves
from autopar.ir.program import STEP
from autopar.lowering.naming import readable
from autopar.lowering.schedule import Statement, programs
from autopar.ops.devices import CPU_ONLY_OPS
from autopar.units import human_bytes, human_seconds


def emit_torch(plan) -> str:  # plan: autopar.Plan (which imports this module)
    named = readable(plan)  # printed with readable names; the hash and fingerprint are the plan's
    program = programs(named)
    moves = ChunkMoves(named, program.forward + program.backward) if plan.offload is not None else None
    placeholders = [n.name for n in named.graph.nodes if n.op == "placeholder"
                    and (moves is None or n.name not in moves.placeholders)]
    takes = ["rt"] + (["chunks"] if moves is not None else [])
    lines = header(plan, "autopar: per-rank training step for torch.distributed (generated; do not edit)")
    lines += [
        f"# forward({', '.join(takes)}, parameters..., buffers..., inputs...) -> (loss, saved, values, "
        "{buffer name: new value})",
    ] + ([
        f"# backward({', '.join(takes)}, parameters..., buffers..., inputs..., saved, grad_loss, sync, unsynced)",
        "#     -> {parameter name: gradient}",
    ] if plan.graph.kind == STEP else []) + [
        "# all on this rank's local shards; saved: the values forward keeps for backward;",
        "# values: the model's other outputs, in their planned layouts.",
    ] + ([
        "# chunks: the offloaded parameters' host chunks (autopar.runtime.offload.ChunkStore); each is",
        "# fetched to the device and evicted where the plan placed it, its parameters read from there.",
    ] if moves is not None else []) + module_preamble(plan)
    lines += wrapped("PLACEHOLDERS = [", [repr(n) for n in placeholders], "]")
    printer, sections = StatementPrinter(named), Sections(named)
    lines += ["", ""] + wrapped("def forward(", takes + placeholders, "):")
    lines += indented(moves.begin(forward=True) if moves is not None else [])
    for i, s in enumerate(program.forward[:-1]):
        lines += indented(sections.before(s, "forward") + (moves.before(i, s) if moves is not None else [])
                          + printer.lines(s))
    end = len(program.forward) - 1
    lines += indented((moves.before(end, program.forward[end]) if moves is not None else [])
                      + _forward_return(named.graph, program.forward[end], program.saved))
    if named.graph.kind == STEP:
        lines += ["", ""] + wrapped("def backward(", takes + placeholders + ["saved", "grad_loss", "sync", "unsynced"],
                                    "):")
        lines += indented(BackwardBody(named, printer, sections, moves=moves).lines(program))
        lines += ["", "", *ACCUMULATE_SOURCE.splitlines()]
    return "\n".join(lines) + "\n"


def module_preamble(plan) -> list[str]:
    """The emitted module's imports and the plan's identity."""
    return ["import torch", ""] + (
        ["from autopar.runtime import kernels  # kernels by what they compute, on any device", ""]
        if uses_device_neutral_kernels(plan) else []) + (
        [f"from autopar.runtime import {module}  # layers whose ranks communicate inside them" for module in
         kernel_modules(plan)]) + [
        "aten = torch.ops.aten",
        "",
        f"PLAN_HASH = {plan.hash!r}",
        f"GRAPH_FINGERPRINT = {plan.fingerprint!r}",
    ]


def _forward_return(graph, statement: Statement, saved) -> list[str]:
    """``return loss, [saved...], [values...], {buffer: new value}`` (the statement's uses come in
    GraphIR.forward_outputs' order)."""
    uses = list(statement.uses)
    loss = uses.pop(0) if graph.loss is not None else "None"
    values, updates = uses[:len(graph.values)], uses[len(graph.values):]
    buffers = [f"{fqn!r}: {var}" for fqn, var in zip(graph.mutated.values(), updates)]
    if not saved and not values and not buffers:
        return [f"return {loss}, [], [], {{}}"]
    return (["return ("] + indented([f"{loss},"] + wrapped("[", list(saved), "],  # saved for backward")
                                   + wrapped("[", values, "],  # the model's other outputs")
                                   + wrapped("{", buffers, "},  # the buffers' new values"))
            + [")"])


ACCUMULATE_SOURCE = '''def accumulate(grad, unsynced, name):
    """``grad`` plus the local gradient of ``name`` that earlier micro-batches left unsynced (no_sync)."""
    earlier = unsynced.pop(name, None)
    return grad if earlier is None else grad + earlier'''


def is_loss_seed(plan, s: Statement) -> bool:
    """Backward's first statement, ``ones_like(loss)``: the gradient autograd hands backward."""
    return s.kind == "call" and s.node.target == "aten.ones_like.default" and s.node.refs() == [plan.graph.loss]


def seed_lines(s: Statement) -> list[str]:
    seed = f"{s.defines} = grad_loss  # d(loss)/d(loss): what autograd hands backward (1 for loss.backward())"
    return [seed] + ([f"del {', '.join(s.frees)}"] if s.frees else [])


class BackwardBody:
    """The backward program's body. With ``sync`` False (inside ``no_sync()``) it returns each
    parameter's local gradient before any of its collectives; with ``sync`` True it first adds
    what earlier micro-batches left in ``unsynced``, then syncs once. The gradient collectives
    are linear, so syncing the sum equals summing the syncs."""

    def __init__(self, plan, printer: StatementPrinter, sections: Sections, gradients=None, before=None,
                 moves: ChunkMoves | None = None):
        """``gradients``: the gradient nodes it returns (a pipeline stage's own; default all);
        ``before``: variable -> lines printed before the statement that defines it; ``moves``:
        an offloading plan's chunk moves."""
        self.plan, self.printer, self.sections, self.moves = plan, printer, sections, moves
        self.before = before or {}
        self.local = tuple(plan.graph.gradients if gradients is None else gradients)  # each before its sync
        self.syncs = {r.id: r for r in plan.redistributions if r.consumers == ("output",)}
        # a gradient's move to its parameter's layout that a backward op reads too: its collectives
        # cannot wait for the last micro-batch
        self.shared = sorted({plan.graph.grads[r.value] for r in plan.redistributions
                              if r.value in self.local and "output" in r.consumers and r.id not in self.syncs})
        self.begun: set[str] = set()
        self.returned_local = False

    def lines(self, program) -> list[str]:
        out = []
        if self.shared:
            out += ["if not sync:"] + indented([
                f"raise RuntimeError('no_sync() cannot defer the gradient sync of {', '.join(self.shared)}: backward "
                f"also reads it synced; call backward outside no_sync() for this plan')"])
        out += wrapped("[", list(program.saved), "] = saved  # the values forward kept for backward") \
            if program.saved else []
        out += ["saved.clear()  # held here alone now: each is freed after its last use"]
        out += self.moves.begin(forward=False) if self.moves is not None else []
        offset, last = len(program.forward), len(program.backward) - 1
        for j, s in enumerate(program.backward):
            moved = self.moves.before(offset + j, s, last=j == last) if self.moves is not None else []
            out += self.sections.before(s, "backward") + moved + self.before.get(s.defines, []) + self.statement(s)
            out += self.moves.after(s) if self.moves is not None else []
        return out

    def statement(self, s: Statement) -> list[str]:
        r = s.redistribution if s.kind in ("start", "wait", "move") else None
        if is_loss_seed(self.plan, s):
            return seed_lines(s)
        syncing = r is not None and r.id in self.syncs
        if s.kind == "output" or (syncing and s.kind != "start"):
            head = self.local_return()
        else:  # a guarded sync start deletes its gradient on the synced path only
            head, s = [], s if syncing else self.keeping_local_gradients(s)
        if syncing and r.id not in self.begun:  # the sum, synced once
            self.begun.add(r.id)
            head.append(f"{r.value} = accumulate({r.value}, unsynced, {self.plan.graph.grads[r.value]!r})")
        body = self.printer.lines(s) if s.kind != "output" else self.output(s).split("\n")
        if syncing and s.kind == "start":  # overlapping the rest of backward, when syncing
            return ["if sync:"] + indented(head + body)
        return head + body

    def local_return(self) -> list[str]:
        """Once, before the program's last gradient collectives: the local gradients under no_sync()."""
        if self.returned_local:
            return []
        self.returned_local = True
        grads = [f"    {self.plan.graph.grads[o]!r}: {o}," for o in self.local]
        return ["if not sync:  # model.no_sync(): the local gradients, left for the next synced backward"] + \
            indented(["return {"] + grads + ["}"])

    def keeping_local_gradients(self, s: Statement) -> Statement:
        """``s`` without deleting a gradient the no_sync() return still needs."""
        if self.returned_local or not any(v in self.local for v in s.frees):
            return s
        return dataclasses.replace(s, frees=[v for v in s.frees if v not in self.local])

    def output(self, s: Statement) -> str:
        """``return {parameter name: gradient}``: a gradient without collectives adds the unsynced part here."""
        g = self.plan.graph
        values = dict(zip(self.local, s.uses))
        grads = [f"    {g.grads[o]!r}: {values[o] if values[o] != o else f'accumulate({o}, unsynced, {g.grads[o]!r})'},"
                 for o in self.local]
        return "\n".join(["return {"] + grads + ["}"])


class StatementPrinter:
    def __init__(self, plan):
        self.plan = plan

    def lines(self, s: Statement) -> list[str]:
        out = getattr(self, s.kind)(s).split("\n")
        if s.recomputed:
            out[0] += ("" if "  # " in out[0] else "  #") + " [recomputed for backward, not kept from forward]"
        if s.frees:
            out.append(f"del {', '.join(s.frees)}")
        return out

    def spec_comment(self, name: str, index: int = 0) -> str:
        text = self.layout(name, index)
        return f"  # {text}" if text else ""

    def layout(self, name: str, index: int = 0) -> str:
        meta = self.plan.graph.node(name).outputs[index]
        spec = self.plan.strategies[name].out_specs[index]
        if meta is None:
            return ""
        local = spec.local_shape(meta.shape, self.plan.mesh)
        return f"{shape_text(meta.shape)} -> local {shape_text(local)} {spec}"

    def placeholder(self, s: Statement) -> str:
        g = self.plan.graph
        role = f"parameter {g.params[s.defines]}" if s.defines in g.params else \
            f"buffer {g.buffers[s.defines]}" if s.defines in g.buffers else "input"
        return f"# {s.defines} ({role}): {self.layout(s.defines)}"

    def constant(self, s: Statement) -> str:
        node = s.node
        values = literal(node.args[0], str, _special)
        return (f"{node.name} = torch.tensor({values}, dtype={_special(node.kwargs['dtype'])}, "
                f"device=rt.device).reshape({list(node.outputs[0].shape)})  # constant")

    def move(self, s: Statement) -> str:
        r, step = s.redistribution, s.redistribution.steps[s.step]
        var = self.wire_in(r, s.step, s.uses[0])
        call = _step_call(step, var, self.plan.mesh.axis_names)
        if step.kind in _MAY_REDUCE_IN_PLACE and var in s.frees:  # the program reads it no more
            call = call[:-1] + ", last_read=True)"
        return f"{s.defines} = {self.wire_out(r, s.step, call)}  # {_describe(r, s.step)}"

    def start(self, s: Statement) -> str:
        r = s.redistribution
        call = _step_call(r.steps[0], self.wire_in(r, 0, s.uses[0]), self.plan.mesh.axis_names, "start_")
        overlaps = "prefetched: runs while the previous layer computes" if s.prefetch else \
            "started with its layer's other gathers" if r.steps[0].kind == "all_gather" else \
            "overlaps the rest of backward"
        return f"{s.defines} = {call}  # {_describe(r, 0)}, {overlaps}"

    def wait(self, s: Statement) -> str:
        started = "the parameter gather" if s.redistribution.steps[0].kind == "all_gather" else "the gradient sync"
        return (f"{s.defines} = {self.wire_out(s.redistribution, 0, f'rt.wait({s.uses[0]})')}  "
                f"# {s.redistribution.id}: {started} started above")

    @staticmethod
    def wire_in(r, step: int, var: str) -> str:
        """A gradient reduced in the compute dtype (mixed precision) is cast down for its first step."""
        return f"{var}.to({torch_name(torch.dtype, r.wire_dtype)})" if r.wire_dtype is not None and step == 0 else var

    def wire_out(self, r, step: int, text: str) -> str:
        """... and back to its own dtype after its last."""
        if r.wire_dtype is None or step != len(r.steps) - 1:
            return text
        return f"{text}.to({torch_name(torch.dtype, self.plan.graph.node(r.value).outputs[0].dtype)})"

    def getitem(self, s: Statement) -> str:
        src, index = s.node.args
        return f"{s.defines} = {s.uses[0]}[{index}]{self.spec_comment(src['ref'], index)}"

    def call(self, s: Statement) -> str:
        node = s.node
        op, args = local_call(self.plan, node)
        arguments = call_arguments(args, s, _special)
        if node.target == "aten.native_dropout.default":
            # random masks must not depend on the layout: draw for the global shape, keep this rank's block
            spec = self.plan.strategies[node.name].out_specs[0]
            return (f"{s.defines} = rt.native_dropout({arguments}, "
                    f"global_shape={list(node.outputs[0].shape)}, spec={spec.to_json()!r})  # -> {spec}")
        comment = self.spec_comment(node.name) if len(node.outputs) == 1 else \
            f"  # -> {', '.join(str(x) for x in self.plan.strategies[node.name].out_specs)}"
        fallback = "  [replicated: no sharding rule]" if node.name in self.plan.fallback_nodes else ""
        note = constant_note(self.plan, node)
        if note:
            comment = f"{comment}; {note}" if comment else f"  # {note}"
        axis = kernel_axis(self.plan, node)
        if axis is not None:  # a layer whose communication runs inside it, over one mesh axis
            return f"{s.defines} = {op}(rt, {axis!r}, {arguments}){comment}"
        # no CUDA kernel: the device's own; a library's custom op keeps its namespace
        op = f"kernels.{CPU_ONLY_OPS[op]}" if op in CPU_ONLY_OPS else op_text(op)
        return f"{s.defines} = {op}({arguments}){comment}{fallback}"


def _describe(r, i: int) -> str:
    return f"{r.id} {r.phase}: {r.src} -> {r.dst}, {human_bytes(r.step_bytes[i])}, {human_seconds(r.step_seconds[i])}"


def uses_device_neutral_kernels(plan) -> bool:
    return any(n.target in CPU_ONLY_OPS for n in plan.graph.nodes)


# collectives the runtime may run in the input's own memory where the program reads it no more
# (RankMesh.all_reduce): each reads a partial sum, which an op computed just before
_MAY_REDUCE_IN_PLACE = ("all_reduce", "reduce_scatter")

def _step_call(step, var: str, axis_names, prefix: str = "") -> str:
    axis = repr(axis_names[step.axis])
    if step.kind in ("all_reduce", "zero_partial"):
        return f"rt.{prefix}{step.kind}({var}, {axis})"
    if step.kind == "all_to_all":
        return f"rt.{prefix}all_to_all({var}, {axis}, src_dim={step.src_dim}, dst_dim={step.dim})"
    return f"rt.{prefix}{step.kind}({var}, {axis}, dim={step.dim})"


def _special(value: dict) -> str | None:
    if "dtype" in value:
        return torch_name(torch.dtype, value["dtype"])
    if "device" in value:
        return "rt.device"
    if "layout" in value:
        return torch_name(torch.layout, value["layout"])
    if "memory_format" in value:
        return torch_name(torch.memory_format, value["memory_format"])
    return None
