"""`autopar report --html`: a plan as one self-contained HTML page.

Inline CSS, SVG and vanilla JS only, so the file opens offline and can be attached to
a bug report: the header facts, the step-time breakdown, the per-device memory
timeline, the model's modules as a collapsible tree (every parameter and op coloured
by its placement on each mesh axis, collectives marked on the op whose output they
move), the costliest collectives and the fallback ops. The page works without JS;
the script adds the memory chart's read-out, a filter and expand/collapse buttons.
"""
from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from html import escape
from importlib import resources

from autopar.backends.printer import shape_text
from autopar.cost_models.hardware import PRESETS
from autopar.errors import AutoparError
from autopar.inspect.plan_layers import TOP_LEVEL, node_modules
from autopar.inspect.report_offload import offload_section
from autopar.inspect.report_pipeline import pipeline_chart
from autopar.inspect.trace import predicted_trace
from autopar.ir.placement import Partial, Shard, Spec
from autopar.ops.moe import KERNEL_OPS, MOE_FORWARD, expert_axis, layout_text
from autopar.units import human_bytes, human_seconds

MAX_COLLECTIVE_ROWS = 50
MAX_TIMELINE_POINTS = 1200  # longer timelines keep each bucket's largest value, so the peak survives
SHARD_COLOURS = ("#3b7dd8", "#2e9e5b", "#8e5bd0", "#1597a5", "#d3548f", "#8a6d3b")  # by tensor dim
PARTIAL_COLOUR, REPLICATED_COLOUR = "#f0a030", "#cfd6df"
OPEN_LEVELS = 3  # module tree levels open when the page loads (see _module_html)


def render_html(plan) -> str:
    body = "".join([_header(plan), '<div class="charts">', _step_time_chart(plan), _memory_chart(plan), "</div>",
                    offload_section(plan), pipeline_chart(plan), _tree(plan), _collectives_table(plan),
                    _fallbacks(plan)])
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>autopar plan {escape(plan.hash)}</title><script>{_ERROR_HOOK}</script>"
            f"<style>{_CSS}{_placement_css()}</style></head>\n<body>{body}<script>{_JS}</script></body></html>\n")


# ---- header and charts -------------------------------------------------------------------
def _header(plan) -> str:
    p, s = plan.predicted, plan.solver
    n_calls = sum(1 for n in plan.graph.nodes if n.op == "call")
    coll = plan.collectives()
    facts = [
        ("step time", human_seconds(p.step_time_s), f"compute {human_seconds(p.compute_s)} + exposed "
                                                     f"communication {human_seconds(p.communication_s)}"),
        ("peak memory / device", human_bytes(p.peak_memory_bytes), _device_memory_note(plan)),
        ("mesh", str(plan.mesh), f"{plan.mesh.size} devices of {plan.hardware}"),
        ("solver", f"{s.backend} {s.status}", f"gap {s.gap:.2%}, {s.seconds:.1f} s, {s.n_variables} variables"),
        ("sharded", f"{p.sharded_flops_fraction:.0%}", "of the step's FLOPs"),
        ("collectives", str(len(coll)), f"{human_bytes(sum(r.step_bytes[i] for r, i in coll))} moved"),
    ]
    cards = "".join(f'<div class="card"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div>'
                    f'<div class="n">{escape(n)}</div></div>' for k, v, n in facts)
    return (f'<header><h1>autopar plan <code>{escape(plan.hash)}</code></h1><p class="sub">graph '
            f'{escape(plan.fingerprint)}: {n_calls} ops; {_recompute_note(plan)}; {_trace_link(plan)}</p>'
            f'<div class="cards">{cards}</div></header>')


def _trace_link(plan) -> str:
    """A download of the predicted step as a Chrome trace (autopar.inspect.trace), for Perfetto."""
    try:
        trace = json.dumps(predicted_trace(plan))
    except AutoparError as exc:
        return f"no predicted trace: {escape(str(exc))}"
    data = base64.b64encode(trace.encode()).decode()
    return (f'<a class="trace" download="autopar-{escape(plan.hash)}-predicted-trace.json" '
            f'href="data:application/json;base64,{data}">the predicted step as a Chrome trace</a> '
            f'(open it in ui.perfetto.dev)')


def _device_memory_note(plan) -> str:
    capacity = _capacity(plan)
    return f"of {human_bytes(capacity)} ({plan.predicted.peak_memory_bytes / capacity:.1%})" if capacity else ""


def _capacity(plan):
    hardware = PRESETS.get(plan.hardware)  # a calibrated or custom spec is known by name only
    return hardware.memory_bytes if hardware else None


def _recompute_note(plan) -> str:
    if not plan.recompute:
        return "no recomputation"
    return f"{len(plan.recompute)} forward values recomputed in backward"


def _step_time_chart(plan) -> str:
    p = plan.predicted
    segments = [("compute", p.compute_s - p.recompute_s, "#3b7dd8"), ("recompute", p.recompute_s, "#8e5bd0"),
                ("exposed communication", p.communication_s, "#d9453b")]
    width, x0 = 560.0, 92.0
    scale = (width - x0 - 10) / max(p.step_time_s, 1e-30)
    shapes, x = ['<text x="0" y="38" class="ax">step</text>'], x0
    for name, seconds, colour in segments:
        if seconds > 0:
            shapes.append(_rect(x, 16, seconds * scale, 34, colour, f"{name}: {human_seconds(seconds)}"))
            x += seconds * scale
    if p.hidden_communication_s > 0:  # it runs beside backward, which is the end of compute
        end = x0 + p.compute_s * scale
        shapes.append('<text x="0" y="70" class="ax">under backward</text>' + _rect(
            end - p.hidden_communication_s * scale, 58, p.hidden_communication_s * scale, 16, "url(#hatch)",
            f"hidden communication: {human_seconds(p.hidden_communication_s)}"))
    legend = segments + [("hidden communication", p.hidden_communication_s, "#eb9a93")]
    items = "".join(f'<li><i style="background:{c}"></i>{escape(name)} <b>{escape(human_seconds(s))}</b></li>'
                    for name, s, c in legend)
    return (f'<section class="chart"><h2>Step time <span>{escape(human_seconds(p.step_time_s))}</span></h2>'
            f'<svg viewBox="0 0 {width:.0f} 84" role="img" aria-label="step time breakdown">'
            '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f6d3d0"/>'
            '<line x1="0" y1="0" x2="0" y2="6" stroke="#d9453b" stroke-width="3"/></pattern></defs>'
            + "".join(shapes) + f'</svg><ul class="legend">{items}</ul>{_collective_bars(plan)}</section>')


def _collective_bars(plan) -> str:
    """Collective time by mesh axis and kind, before overlap: which axis carries the traffic."""
    totals: dict[tuple, list] = {}
    for r, i in plan.collectives():
        entry = totals.setdefault((plan.mesh.axis_names[r.steps[i].axis], r.steps[i].kind), [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += r.step_bytes[i]
        entry[2] += r.step_seconds[i]
    if not totals:
        return "<h3>no collectives</h3>"
    longest = max(seconds for _, _, seconds in totals.values()) or 1.0
    rows = "".join(
        f'<tr><td>{escape(axis)}</td><td><span class="coll {escape(kind)}">{escape(kind)}</span> ×{count}</td>'
        f'<td class="barcell"><i class="{escape(kind)}" style="width:{100 * seconds / longest:.1f}%"></i></td>'
        f'<td class="t">{escape(human_bytes(nbytes))}</td><td class="t">{escape(human_seconds(seconds))}</td></tr>'
        for (axis, kind), (count, nbytes, seconds) in sorted(totals.items(), key=lambda kv: -kv[1][2]))
    return (f'<h3>collectives by mesh axis (before overlap)</h3><table class="bars"><tr><th>axis</th><th>kind</th>'
            f"<th></th><th>bytes</th><th>time</th></tr>{rows}</table>")


def _rect(x, y, w, h, fill, title) -> str:
    return (f'<rect x="{x:.2f}" y="{y}" width="{max(w, 0.5):.2f}" height="{h}" fill="{fill}">'
            f"<title>{escape(title)}</title></rect>")


def _memory_chart(plan) -> str:
    p = plan.predicted
    points = _downsample(list(p.memory_timeline))
    if not points:
        return '<section class="chart"><h2>Memory per device</h2><p>no timeline in this plan</p></section>'
    # the curve is the bytes live between statements; the peak also counts the buffers a statement
    # (a collective) holds while it runs, so it can lie above the curve
    peak = max(p.peak_memory_bytes, max(b for _, b in points))
    capacity = _capacity(plan)
    show_capacity = capacity is not None and capacity <= 2 * peak  # else it would flatten the curve
    axes = _Axes(top=_nice_top(max(peak, capacity if show_capacity else 0) * 1.08), n=len(points))
    held = sum(p.memory_bytes.get(k, 0) for k in ("parameters", "optimizer_state", "inputs"))
    parts = [_phase_band(axes, points, plan.graph.loss)] + [_grid_line(axes, k) for k in range(5)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (axes.xy(k, b) for k, (_, b) in enumerate(points)))
    parts.append(f'<polygon points="{axes.left},{axes.base_y} {line} {axes.right_x},{axes.base_y}" '
                 f'fill="#3b7dd833"/><polyline points="{line}" fill="none" stroke="#3b7dd8" stroke-width="1.5"/>')
    if held:
        parts.append(axes.labelled_rule(held, "held", "held all step (parameters, optimizer state, inputs) "
                                        f"{human_bytes(held)}", end=True))
    parts.append(_peak_marker(axes, points, peak))
    if show_capacity:
        parts.append(axes.labelled_rule(capacity, "capacity", f"device memory {human_bytes(capacity)}"))
    data = json.dumps({"points": points, "left": axes.left, "width": axes.span_x, "top": axes.top,
                       "height": axes.span_y, "pad": axes.top_pad}).replace("<", "\\u003c")
    note = f"; device memory {human_bytes(capacity)} is off the scale" if capacity and not show_capacity else ""
    return (f'<section class="chart"><h2>Memory per device <span>peak {escape(human_bytes(peak))}</span></h2>'
            f'<svg id="memory" viewBox="0 0 {axes.w:.0f} {axes.h:.0f}" role="img" aria-label="memory timeline">'
            + "".join(parts) + f'<line id="cursor" y1="{axes.top_pad}" y2="{axes.base_y}" class="cursor"/>'
            f'<text x="{axes.left + axes.span_x / 2:.0f}" y="{axes.h - 6:.0f}" class="ax" text-anchor="middle">'
            f'statements of the per-rank program, in order</text></svg><p class="readout" id="readout">live bytes '
            f'after each statement{escape(note)}</p><script type="application/json" id="timeline">{data}</script>'
            f'</section>')


@dataclass(frozen=True)
class _Axes:
    """The memory chart's frame: statement k and ``b`` bytes as SVG coordinates."""

    top: float  # bytes at the top of the chart
    n: int  # statements on the x axis
    w: float = 560.0
    h: float = 230.0
    left: float = 62.0
    right: float = 10.0
    bottom: float = 26.0
    top_pad: float = 10.0

    @property
    def span_x(self) -> float:
        return self.w - self.left - self.right

    @property
    def span_y(self) -> float:
        return self.h - self.bottom - self.top_pad

    @property
    def base_y(self) -> float:
        return self.top_pad + self.span_y

    @property
    def right_x(self) -> float:
        return self.left + self.span_x

    def xy(self, k: int, b: float) -> tuple[float, float]:
        return self.left + self.span_x * k / max(self.n - 1, 1), self.top_pad + self.span_y * (1 - b / self.top)

    def rule(self, y: float, style: str) -> str:
        """A horizontal line across the chart."""
        return f'<line x1="{self.left}" x2="{self.right_x}" y1="{y:.1f}" y2="{y:.1f}" class="{style}"/>'

    def labelled_rule(self, b: float, style: str, label: str, end: bool = False) -> str:
        y = self.xy(0, b)[1]
        x, anchor = (self.right_x - 4, ' text-anchor="end"') if end else (self.left + 4, "")
        return self.rule(y, style) + f'<text x="{x}" y="{y - 4:.1f}" class="ax"{anchor}>{escape(label)}</text>'


def _phase_band(axes: _Axes, points, loss: str) -> str:
    """Backward shaded from the statement that computes the loss on."""
    loss_at = next((k for k, (var, _) in enumerate(points) if var == loss), None)
    if loss_at is None:
        return ""
    x_loss = axes.xy(loss_at, 0)[0]
    return (f'<rect x="{x_loss:.1f}" y="{axes.top_pad}" width="{axes.right_x - x_loss:.1f}" height="{axes.span_y}" '
            f'fill="#f3f0fa"/><text x="{x_loss + 4:.1f}" y="{axes.base_y - 5}" class="ax">backward</text>'
            f'<text x="{axes.left + 4}" y="{axes.base_y - 5}" class="ax">forward</text>')


def _grid_line(axes: _Axes, k: int) -> str:
    value = axes.top * k / 4
    y = axes.xy(0, value)[1]
    return axes.rule(y, "grid") + (f'<text x="{axes.left - 6}" y="{y + 4:.1f}" class="ax" text-anchor="end">'
                                   f"{escape(human_bytes(value))}</text>")


def _peak_marker(axes: _Axes, points, peak: float) -> str:
    highest = max(range(len(points)), key=lambda k: points[k][1])
    (name, highest_bytes), peak_y = points[highest], axes.xy(0, peak)[1]
    px, py = axes.xy(highest, highest_bytes)
    label = f"peak {human_bytes(peak)} after {name}" if peak - highest_bytes < 0.005 * peak else \
        f"peak {human_bytes(peak)} while a collective runs; {human_bytes(highest_bytes)} after {name}"
    return (axes.rule(peak_y, "peak") + f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="#d9453b"/>'
            f'<text x="{axes.right_x - 4}" y="{peak_y - 6:.1f}" class="ax peak-label" text-anchor="end">'
            f"{escape(label)}</text>")


def _nice_top(value: float) -> float:
    """The chart's top: four grid steps, each a round number of bytes in the unit human_bytes
    prints it in (300 KB, 2.5 GB), together at or above ``value``."""
    step = max(value, 4.0) / 4
    unit = 1024.0 ** min(4, int(math.log(step, 1024)))
    magnitude = 10 ** math.floor(math.log10(step / unit))
    factor = next(m for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * magnitude * unit >= step * (1 - 1e-9))
    return 4 * factor * magnitude * unit


def _downsample(timeline: list) -> list:
    if len(timeline) <= MAX_TIMELINE_POINTS:
        return [(str(v), float(b)) for v, b in timeline]
    size = len(timeline) / MAX_TIMELINE_POINTS
    buckets = (timeline[int(k * size):int((k + 1) * size)] for k in range(MAX_TIMELINE_POINTS))
    return [(str(v), float(b)) for v, b in (max(bucket, key=lambda t: t[1]) for bucket in buckets if bucket)]


# ---- the module tree ---------------------------------------------------------------------
class _Module:
    def __init__(self, path: str):
        self.path, self.children, self.params, self.forward, self.backward = path, {}, [], [], []

    def walk(self):
        yield self
        for child in self.children.values():
            yield from child.walk()


def _build_tree(plan) -> _Module:
    where = node_modules(plan)
    root = _Module("")

    def module(path: str) -> _Module:
        node, parts = root, path.split(".") if path else []
        for depth, part in enumerate(parts):
            node = node.children.setdefault(part, _Module(".".join(parts[:depth + 1])))
        return node

    for ph in plan.graph.params:
        module(where[ph]).params.append(ph)
    for n in plan.graph.nodes:
        if n.op == "call" and n.name in plan.strategies:
            (module(where[n.name]).forward if n.phase == "forward" else module(where[n.name]).backward).append(n)
    return root


def _tree(plan) -> str:
    moves: dict[str, list] = {}
    for r, i in plan.collectives():
        moves.setdefault(r.value, []).append((r, i))
    root = _build_tree(plan)
    legend = _placement_legend(plan)
    return ('<section class="tree"><h2>Layers</h2><div class="tools"><input id="filter" type="search" '
            'placeholder="filter by name, op or placement"><button id="expand">expand all</button>'
            f'<button id="collapse">collapse all</button></div>{legend}'
            + _module_html(plan, root, moves, 0, True) + "</section>")


def _module_html(plan, mod: _Module, moves: dict, level: int, is_open: bool) -> str:
    """A module and everything under it. The page opens the top ``OPEN_LEVELS`` levels (a module
    with one child adds no level: wrappers do not hide the model) and the first layer of every
    open stack of numbered layers, at any level; the others stay closed."""
    members = list(mod.walk())
    fwd = sum(plan.strategies[n.name].compute_s for m in members for n in m.forward)
    bwd = sum(plan.strategies[n.name].compute_s for m in members for n in m.backward)
    coll = [c for m in members for n in m.forward + m.backward for c in moves.get(n.name, ())] + \
        [c for m in members for ph in m.params for c in moves.get(ph, ())]
    name = mod.path.rpartition(".")[2] if mod.path else TOP_LEVEL
    chips = "".join(_spec_html(plan, plan.out_spec(ph)) for ph in mod.params)
    badge = (f'<span class="cbadge" title="collectives moving values of this module">{len(coll)} collective'
             f'{"s" if len(coll) > 1 else ""}, '
             f'{escape(human_seconds(sum(r.step_seconds[i] for r, i in coll)))}</span>') if coll else ""
    summary = (f'<summary><b>{escape(name)}</b> <span class="path">{escape(mod.path)}</span> {chips}'
               f'<span class="stats">fwd {escape(human_seconds(fwd))} · bwd {escape(human_seconds(bwd))}</span>'
               f"{badge}{_moe_badge(plan, mod)}</summary>")
    body = f'<table class="ops">{"".join(_param_row(plan, ph, moves) for ph in mod.params)}</table>' \
        if mod.params else ""
    child_level = level + (len(mod.children) > 1)
    body += "".join(_module_html(plan, child, moves, child_level, is_open and (
        part == "0" or (not part.isdigit() and child_level < OPEN_LEVELS))) for part, child in mod.children.items())
    if mod.forward:
        body += f'<table class="ops">{"".join(_op_row(plan, n, moves) for n in mod.forward)}</table>'
    if mod.backward:
        own_bwd = sum(plan.strategies[n.name].compute_s for n in mod.backward)
        rows = "".join(_op_row(plan, n, moves) for n in mod.backward)
        body += (f'<details class="bw"><summary>backward: {len(mod.backward)} ops, {escape(human_seconds(own_bwd))}'
                 f'</summary><table class="ops">{rows}</table></details>')
    return f'<details class="mod"{" open" if is_open else ""}>{summary}<div class="body">{body}</div></details>'


def _moe_badge(plan, mod: _Module) -> str:
    """A mixture-of-experts layer's mark: its layout (autopar.ops.moe), on the module that runs it."""
    layers = [n for n in mod.forward if n.target == MOE_FORWARD]
    if not layers:
        return ""
    layout = layout_text(plan.strategies[layers[0].name].in_specs, plan.mesh.axis_names)
    return (f'<span class="moe" title="a mixture-of-experts layer, captured as one op; plan.explain(\'moe\') '
            f'weighs its layouts">MoE: {escape(layout)}</span>')


def _param_row(plan, ph: str, moves: dict) -> str:
    fqn = plan.graph.params[ph]
    shape = plan.graph.node(ph).outputs[0].shape
    grads = [g for g, owner in plan.graph.grads.items() if owner == fqn]
    syncs = "".join(_collective_html(plan, r, i, "gradient ") for g in grads for r, i in moves.get(g, ()))
    return (f'<tr class="row param" data-name="{escape(fqn)}"><td class="name">{escape(fqn.rpartition(".")[2])}</td>'
            f'<td class="target">parameter</td><td>{escape(shape_text(shape))}</td>'
            f"<td>{_spec_html(plan, plan.out_spec(ph))}</td><td></td>"
            f'<td>{"".join(_collective_html(plan, r, i) for r, i in moves.get(ph, ()))}{syncs}</td></tr>')


def _op_row(plan, n, moves: dict) -> str:
    strategy = plan.strategies[n.name]
    shape = shape_text(n.outputs[0].shape) if n.outputs and n.outputs[0] else ""
    op = n.target.removeprefix("aten.").removesuffix(".default")
    return (f'<tr class="row op" data-name="{escape(n.name)} {escape(op)}"><td class="name">{escape(n.name)}</td>'
            f'<td class="target">{escape(op)}</td><td>{escape(shape)}</td>'
            f'<td>{"".join(_spec_html(plan, s) for s in strategy.out_specs)}</td>'
            f'<td class="t">{escape(human_seconds(strategy.compute_s))}</td>'
            f'<td>{"".join(_collective_html(plan, r, i) for r, i in moves.get(n.name, ()))}'
            f"{_inner_all_to_all(plan, n)}</td></tr>")


def _inner_all_to_all(plan, n) -> str:
    """An expert-parallel MoE op's own all-to-alls, which run inside it (priced in its time)."""
    axis = expert_axis(plan.strategies[n.name].in_specs) if n.target in KERNEL_OPS else None
    if axis is None:
        return ""
    name = plan.mesh.axis_names[axis]
    return (f'<span class="coll all_to_all" title="tokens to their experts\' ranks and back, inside the op (its '
            f'time includes them)">⇄ all_to_all[{escape(name)}] inside</span>')


def _collective_html(plan, r, i: int, what: str = "") -> str:
    step = r.steps[i]
    axis = plan.mesh.axis_names[step.axis]
    title = (f"{what}{step.kind} over {axis} in {r.phase}: moves {r.value} from {r.src} to {r.dst} for "
             f"{', '.join(r.consumers)}")
    return (f'<span class="coll {escape(step.kind)}" title="{escape(title)}">⇄ {escape(what)}{escape(step.kind)}'
            f'[{escape(axis)}] {escape(human_bytes(r.step_bytes[i]))} · {escape(human_seconds(r.step_seconds[i]))}'
            "</span>")


def _spec_html(plan, spec: Spec) -> str:
    """One chip per mesh axis, coloured by the placement on it."""
    return '<span class="spec">' + "".join(
        f'<span class="pl {_placement_class(p)}" title="{escape(axis)}: {escape(_placement_words(p))}">'
        f"{escape(str(p))}</span>" for axis, p in zip(plan.mesh.axis_names, spec.placements)) + "</span>"


def _placement_class(p) -> str:
    if isinstance(p, Shard):
        return f"pl-s{min(p.dim, len(SHARD_COLOURS) - 1)}"
    return "pl-p" if isinstance(p, Partial) else "pl-r"


def _placement_words(p) -> str:
    if isinstance(p, Shard):
        return f"sharded on tensor dim {p.dim}"
    return "partial sums" if isinstance(p, Partial) else "replicated"


def _placement_legend(plan) -> str:
    seen = {p for s in plan.strategies.values() for spec in s.out_specs for p in spec.placements}
    ordered = sorted(seen, key=lambda p: (not isinstance(p, Shard), getattr(p, "dim", 0), str(p)))
    axes = ", ".join(plan.mesh.axis_names)
    items = "".join(f'<li><span class="pl {_placement_class(p)}">{escape(str(p))}</span> '
                    f"{escape(_placement_words(p))}</li>" for p in ordered)
    kinds = "".join(f'<li><span class="coll {k}">⇄ {k}</span></li>'
                    for k in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"))
    return (f'<div class="legend-box"><span>placements, one chip per mesh axis ({escape(axes)}):</span>'
            f'<ul class="legend">{items}</ul><span>collectives, on the op whose output they move:</span>'
            f'<ul class="legend">{kinds}</ul></div>')


def _placement_css() -> str:
    rules = [f".pl-s{k}{{background:{c};color:#fff}}" for k, c in enumerate(SHARD_COLOURS)]
    return "".join(rules) + f".pl-p{{background:{PARTIAL_COLOUR}}}.pl-r{{background:{REPLICATED_COLOUR}}}"


# ---- tables ----------------------------------------------------------------------------------
def _collectives_table(plan) -> str:
    coll = sorted(plan.collectives(), key=lambda c: -c[0].step_seconds[c[1]])
    where = node_modules(plan)
    rows = "".join(
        f"<tr><td>{escape(r.phase)}</td><td><span class=\"coll {escape(r.steps[i].kind)}\">{escape(r.steps[i].kind)}"
        f"</span></td><td>{escape(plan.mesh.axis_names[r.steps[i].axis])}</td><td>{escape(r.value)}</td>"
        f"<td>{escape(where.get(r.value, '') or TOP_LEVEL)}</td>"
        f"<td>{_spec_html(plan, r.src)} → {_spec_html(plan, r.dst)}</td>"
        f'<td class="t">{escape(human_bytes(r.step_bytes[i]))}</td>'
        f'<td class="t">{escape(human_seconds(r.step_seconds[i]))}</td></tr>' for r, i in coll[:MAX_COLLECTIVE_ROWS])
    more = f"<p>… and {len(coll) - MAX_COLLECTIVE_ROWS} more</p>" if len(coll) > MAX_COLLECTIVE_ROWS else ""
    return (f'<section><h2>Collectives <span>{len(coll)}, costliest first</span></h2><table class="list"><tr>'
            "<th>phase</th><th>kind</th><th>axis</th><th>tensor</th><th>module</th><th>layout</th><th>bytes</th>"
            f"<th>time</th></tr>{rows}</table>{more}</section>")


def _fallbacks(plan) -> str:
    sites = plan.fallback_sites
    items = "".join(f"<li><code>{escape(op)}</code> ×{len(mods)} in {escape(', '.join(sorted(set(mods))))}</li>"
                    for op, mods in sites.items())
    return (f"<section><h2>Fallback ops <span>no sharding rule; replicated</span></h2>"
            f"{f'<ul>{items}</ul>' if items else '<p>none</p>'}</section>")


# ---- inlined assets (package data: autopar/inspect/static) --------------------------------
def _asset(name: str) -> str:
    return resources.files("autopar.inspect").joinpath("static", name).read_text()


# first thing on the page: any script error lands in an attribute that a headless check can read
_ERROR_HOOK = _asset("error_hook.js")
_CSS = _asset("report.css")
_JS = _asset("report.js")
