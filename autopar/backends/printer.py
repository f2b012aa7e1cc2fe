"""Source printing shared by the backends: headers, argument literals, comments."""
from __future__ import annotations

from typing import Any, Callable


def header(plan, title: str) -> list[str]:
    lines = [
        f"# {title}",
        f"# plan {plan.hash} | graph {plan.fingerprint} | mesh {plan.mesh} | hardware {plan.hardware}",
        f"# predicted step {plan.predicted.step_time_s * 1e3:.4f} ms = compute {plan.predicted.compute_s * 1e3:.4f} ms"
        f" + communication {plan.predicted.communication_s * 1e3:.4f} ms",
        "# passes:",
    ]
    lines += [f"#   {r.name}: {r.note}" for r in plan.history]
    return lines


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


def shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
