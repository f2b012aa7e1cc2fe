"""Source printing shared by the backends: headers, argument literals, comments."""
from __future__ import annotations

from typing import Any, Callable

from autopar.ir.graph import resolve_target
from autopar.ops.table import rule_for


def header(plan, title: str) -> list[str]:
    lines = [
        f"# {title}",
        f"# plan {plan.hash} | graph {plan.fingerprint} | mesh {plan.device_mesh} | hardware {plan.hardware}",
        f"# predicted step {plan.predicted.step_time_s * 1e3:.4f} ms = compute {plan.predicted.compute_s * 1e3:.4f} ms"
        f" + communication {plan.predicted.communication_s * 1e3:.4f} ms",
    ]
    if plan.graph.autocast is not None:
        lines.append(f"# mixed precision: float32 parameters, computing in {plan.graph.autocast} (autocast's casts are "
                     f"statements below)")
    lines.append("# passes:")
    # the program is the same whether its plan was solved now or loaded from the plan cache
    lines += [f"#   {r.name}: {r.note}" for r in plan.history if r.name != "cache"]
    return lines


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
            lines.append(f"# {module or '<model>'}")
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


def local_args(plan, node) -> list:
    """The op's arguments as this rank passes them: a shape argument (view, expand, ...) becomes
    the local block's shape."""
    rule = rule_for(resolve_target(node.target))
    args = list(node.args)
    if rule is not None and rule.shape_arg is not None and rule.shape_arg < len(args):
        args[rule.shape_arg] = list(plan.strategies[node.name].out_specs[0].local_shape(node.outputs[0].shape,
                                                                                         plan.mesh))
    return args


def call_arguments(plan, statement, special: Callable[[dict], str | None]) -> str:
    """``a, b, key=value``: a call statement's arguments, tensor inputs named by the variables it reads."""
    refs = iter(statement.uses)  # the variables of the tensor inputs, in the layouts this op reads

    def ref(_name: str) -> str:
        return next(refs)

    text = [literal(a, ref, special) for a in local_args(plan, statement.node)]
    text += [f"{k}={literal(v, ref, special)}" for k, v in statement.node.kwargs.items()]
    return ", ".join(text)


def shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
