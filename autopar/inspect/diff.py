"""autopar.diff: where two plans of the same model differ, and what each difference costs.

A difference is a node whose chosen strategy (its input and output layouts) differs, or
whose value is moved by other collectives. Its cost delta is the node's compute time plus
the time of the collectives that move its output, in plan b less plan a, as the plans
predicted them (so the deltas add up to the change in compute and exposed-or-not
communication, before overlap).
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import PlanMismatchError
from autopar.units import human_bytes, human_seconds


@dataclass(frozen=True)
class NodeDifference:
    node: str
    role: str  # the parameter's name for a parameter, else the op
    layout_a: str
    layout_b: str
    collectives_a: tuple[str, ...]  # "kind[axis]" of each step moving this node's output
    collectives_b: tuple[str, ...]
    delta_s: float  # plan b's compute + collective time for this node, less plan a's


@dataclass(frozen=True)
class PlanDiff:
    differences: tuple[NodeDifference, ...]  # largest |delta| first
    step_time_delta_s: float
    peak_memory_delta_bytes: float

    def __bool__(self) -> bool:
        return bool(self.differences)

    def __str__(self) -> str:
        if not self.differences:
            return "the plans make the same decisions"
        lines = [f"{len(self.differences)} nodes differ; step time {_signed_seconds(self.step_time_delta_s)}, "
                 f"peak memory {'+' if self.peak_memory_delta_bytes >= 0 else '-'}"
                 f"{human_bytes(abs(self.peak_memory_delta_bytes))} (b - a)"]
        for d in self.differences:
            lines.append(f"  {d.node:<28} {d.role:<36} {d.layout_a} -> {d.layout_b}  {_signed_seconds(d.delta_s)}")
            if d.collectives_a != d.collectives_b:
                lines.append(f"  {'':<28} collectives {', '.join(d.collectives_a) or 'none'} -> "
                             f"{', '.join(d.collectives_b) or 'none'}")
        return "\n".join(lines)


def diff(a, b) -> PlanDiff:
    """The differences from plan ``a`` to plan ``b`` (both autopar.Plan of the same model)."""
    if a.fingerprint != b.fingerprint:
        raise PlanMismatchError(f"the plans are of different graphs ({a.fingerprint} vs {b.fingerprint}): "
                                f"diff compares two plans of the same model and inputs")
    moves_a, moves_b = _moves(a), _moves(b)
    out = []
    for node in a.graph.nodes:
        name = node.name
        if name not in a.strategies or name not in b.strategies:
            continue
        sa, sb = a.strategies[name], b.strategies[name]
        same_layout = sa.in_specs == sb.in_specs and sa.out_specs == sb.out_specs
        if same_layout and moves_a.get(name, ()) == moves_b.get(name, ()):
            continue
        delta = sb.compute_s - sa.compute_s + _seconds(moves_b.get(name, ())) - _seconds(moves_a.get(name, ()))
        role = a.graph.params.get(name) or a.graph.buffers.get(name) or node.target
        out.append(NodeDifference(name, role, _layout(sa), _layout(sb), _kinds(moves_a.get(name, ()), a),
                                  _kinds(moves_b.get(name, ()), b), delta))
    out.sort(key=lambda d: -abs(d.delta_s))
    return PlanDiff(tuple(out), b.predicted.step_time_s - a.predicted.step_time_s,
                    b.predicted.peak_memory_bytes - a.predicted.peak_memory_bytes)


def _moves(plan) -> dict:
    """node -> ((kind, axis, seconds), ...) of every step that moves its output, in a stable order."""
    out: dict[str, list] = {}
    for r in plan.redistributions:
        for step, seconds in zip(r.steps, r.step_seconds):
            out.setdefault(r.value, []).append((step.kind, step.axis, step.dim, str(r.dst), seconds))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def _seconds(moves) -> float:
    return sum(m[-1] for m in moves)


def _kinds(moves, plan) -> tuple[str, ...]:
    return tuple(f"{kind}[{plan.mesh.axis_names[axis]}]" for kind, axis, *_ in moves)


def _layout(strategy) -> str:
    return ", ".join(str(s) for s in strategy.out_specs)


def _signed_seconds(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + human_seconds(abs(seconds))
