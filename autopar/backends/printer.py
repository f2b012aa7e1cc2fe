"""Source printing shared by the backends: headers, argument literals, comments."""
from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from typing import Any

import torch

from autopar.errors import AutoparError
from autopar.ir.graph import resolve_target
from autopar.ops.kinds import LocalShapes, OpCall, communicating_axis
from autopar.ops.table import rule_for


def one_line(text) -> str:
    """``text`` for a comment of an emitted program: every line break and control character
    becomes a space, so nothing a plan holds can end the comment and start code. (A plan file's
    fields are checked before a plan exists: this is the printer's own guard.)"""
    return "".join(" " if unicodedata.category(ch)[0] in "CZ" and ch != " " else ch for ch in str(text))


def torch_name(kind: type, name: str) -> str:
    """``torch.<name>`` for a torch constant of ``kind`` (torch.dtype, torch.layout, ...), refused
    where ``name`` is not one."""
    if not (isinstance(name, str) and name.isidentifier() and isinstance(getattr(torch, name, None), kind)):
        raise AutoparError(f"{name!r} is not a torch {kind.__name__}: the plan is corrupt")
    return f"torch.{name}"


def op_text(target: str) -> str:
    """How a program calls op ``target`` ("aten.mm.default", or a library's "ns.op.overload")."""
    if not _OP.fullmatch(target):
        raise AutoparError(f"{target!r} is not an op's name (namespace.op.overload): the plan is corrupt")
    return target if target.startswith("aten.") else f"torch.ops.{target}"


_OP = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")


def header(plan, title: str) -> list[str]:
    lines = [
        f"# {title}",
        one_line(f"# plan {plan.hash} | graph {plan.fingerprint} | mesh {plan.device_mesh} | hardware {plan.hardware}"),
        f"# predicted step {plan.predicted.step_time_s * 1e3:.4f} ms = compute {plan.predicted.compute_s * 1e3:.4f} ms"
        f" + communication {plan.predicted.communication_s * 1e3:.4f} ms",
    ]
    if plan.graph.autocast is not None:
        lines.append(one_line(f"# mixed precision: float32 parameters, computing in {plan.graph.autocast} (autocast's "
                              f"casts are statements below)"))
    lines += parameter_layouts(plan)
    lines.append("# passes:")
    # the program is the same whether its plan was solved now or loaded from the plan cache
    lines += [one_line(f"#   {r.name}: {r.note}") for r in plan.history if r.name != "cache"]
    return lines


def parameter_layouts(plan) -> list[str]:
    """Each parameter's solved layout as a table, the way a hand-written layer plan reads:
    ``fc1.weight  [4096, 1024]  R on dp, S(0) on tp`` (S(d): split along dim d; R: replicated)."""
    axes = plan.mesh.axis_names  # a pipeline's stages are laid out over the mesh beside pp
    rows = []
    for node, fqn in plan.graph.params.items():
        meta = plan.graph.node(node).outputs[0]
        placements = plan.out_spec(node).placements
        rows.append((fqn, shape_text(meta.shape), ", ".join(f"{p} on {axis}" for p, axis in zip(placements, axes))))
    if not rows:
        return []
    name_width, shape_width = (max(len(row[i]) for row in rows) for i in (0, 1))
    return ["# parameter layouts (S(d): split along dim d; R: replicated):"] + [
        one_line(f"#   {fqn:<{name_width}}  {shape:<{shape_width}}  {layout}") for fqn, shape, layout in rows]


class Sections:
    """The comments that open each phase of the step and each module's statements, for a plan's
    statements printed in order, forward's then backward's (lowering.schedule.Split)."""

    def __init__(self, plan):
        self.plan = plan
        self.phase: str | None = None
        self.module: str | None = None

    def before(self, statement, phase: str) -> list[str]:
        """The comments before ``statement``, which the ``phase`` program ("forward" or "backward") runs."""
        node = statement.node
        if node is None or node.op == "placeholder":
            return []
        lines = []
        if phase != self.phase:
            self.phase, self.module = phase, None
            lines += ["", f"# ---- {phase} ----"]
        module = self.plan.modules.get(node.name)
        if module is not None and module != self.module:
            self.module = module
            lines.append(one_line(f"# {module or '<model>'}"))
        return lines


def wrapped(opening: str, items: list[str], closing: str, width: int = 120) -> list[str]:
    """``opening`` + the items joined by commas + ``closing`` on one line when it fits in
    ``width``, else the items in rows under ``opening``, each row indented."""
    single = opening + ", ".join(items) + closing
    if len(single) <= width:
        return [single]
    rows, row = [], ""
    for piece in (item + "," for item in items):
        if row and len(row) + 1 + len(piece) > width - 4:
            rows.append(row)
            row = piece
        else:
            row = f"{row} {piece}" if row else piece
    return [opening] + indented(rows + [row]) + [closing.lstrip(", ")]  # the rows end with a comma


def indented(lines: list[str], prefix: str = "    ") -> list[str]:
    return [prefix + line if line else "" for line in lines]


def literal(value: Any, ref: Callable[[str], str], special: Callable[[dict], str | None]) -> str:
    """Python source for an IR argument; ``ref`` names tensor references, ``special`` prints dtypes etc."""
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            return ref(value["ref"])
        text = special(value)
        if text is not None:
            return text
        return "{" + ", ".join(f"{k!r}: {literal(v, ref, special)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v, ref, special) for v in value) + "]"
    if isinstance(value, float):
        if value != value:
            return "float('nan')"
        if value in (float("inf"), float("-inf")):
            return f"float('{value}')"
    return repr(value)


def local_call(plan, node) -> tuple[str, list]:
    """(the op this rank runs, its arguments), as the node's rule says (autopar.ops.kinds.Rule.local_call):
    size-like arguments (a view's shape, a grouped convolution's group count) become the local
    blocks', and a view runs as a reshape to its block's shape."""
    rule = rule_for(resolve_target(node.target))
    if rule is None:
        return node.target, list(node.args)
    strategy = plan.strategies[node.name]
    in_metas = [plan.graph.node(ref).outputs[0] for ref in node.refs()]
    call = OpCall(node.target, tuple(node.args), node.kwargs, tuple(m.shape for m in in_metas),
                  tuple(None if m is None else m.shape for m in node.outputs))
    local = LocalShapes(
        tuple(spec.local_shape(m.shape, plan.mesh) for spec, m in zip(strategy.in_specs, in_metas)),
        tuple(None if m is None else spec.local_shape(m.shape, plan.mesh)
              for spec, m in zip(strategy.out_specs, node.outputs)), strategy.in_specs)
    target, args = rule.local_call(call, local)
    return (target if isinstance(target, str) else str(target).replace("aten::", "aten.")), args


def kernel_axis(plan, node) -> str | None:
    """The name of the mesh axis whose ranks communicate inside the runtime kernel the node
    runs (autopar.ops.kinds.Rule.kernel_axis), or None where it runs a local op."""
    if node.op != "call" or node.target == "getitem" or node.name not in plan.strategies:
        return None
    rule = rule_for(resolve_target(node.target))
    if rule is None:
        return None
    axis = communicating_axis(rule, plan.strategies[node.name].in_specs, plan.mesh.shape)
    return None if axis is None else plan.mesh.axis_names[axis]


def kernel_modules(plan) -> list[str]:
    """The autopar.runtime modules whose communicating kernels the plan's nodes run."""
    return sorted({local_call(plan, n)[0].partition(".")[0] for n in plan.graph.nodes if kernel_axis(plan, n)})


def call_arguments(args: list, statement, special: Callable[[dict], str | None]) -> str:
    """``a, b, key=value``: a call statement's arguments (``args``: its positional ones as this
    rank passes them), tensor inputs named by the variables it reads."""
    refs = iter(statement.uses)  # the variables of the tensor inputs, in the layouts this op reads

    def ref(_name: str) -> str:
        return next(refs)

    text = [literal(a, ref, special) for a in args]
    text += [f"{k}={literal(v, ref, special)}" for k, v in statement.node.kwargs.items()]
    return ", ".join(text)


def shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def constant_note(plan, node) -> str:
    """What a float constant of ``node`` is, where a decomposition computed it and its digits do
    not say: ``4.76837158203125e-07 = 2/4194304, 4194304 = the elements of [4096, 1024]`` (a mean's
    gradient); "" for a constant written as people write it (``1e-05``, ``0.125``)."""
    notes = []
    for value in node.args:
        if isinstance(value, float) and math.isfinite(value) and len(repr(value)) > 8:
            note = _as_fraction(value, _global_shapes(plan, node))
            if note:
                notes.append(f"{value!r} = {note}")
    return "; ".join(notes)


def _global_shapes(plan, node) -> list[tuple]:
    """The global shapes of ``node``'s tensor inputs and outputs."""
    metas = [plan.graph.node(ref).outputs[0] for ref in node.refs()] + list(node.outputs)
    return [tuple(m.shape) for m in metas if m is not None and all(isinstance(d, int) for d in m.shape)]


def _as_fraction(value: float, shapes: list[tuple]) -> str:
    """``k/n`` for a small integer ``k`` and ``n`` the element count or a size of one of
    ``shapes`` (the usual origin: a mean divides by the elements it averages); else "" """
    for shape in shapes:
        candidates = [(math.prod(shape), f"the elements of {shape_text(shape)}")] + \
            [(d, f"dim {i} of {shape_text(shape)}") for i, d in enumerate(shape)]
        for n, what in candidates:
            k = value * n
            if n > 1 and k == round(k) and 0 < abs(k) <= 8:
                return f"{round(k)}/{n}, {n} = {what}"
    return ""
