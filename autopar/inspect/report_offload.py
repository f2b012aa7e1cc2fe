"""The HTML report's offload section: the figures (chunks in host memory, fetches, the time
offloading adds), the chunk bytes on the device over the step's statements, and one row per
chunk with a bar for each span of statements during which it is on the device."""
from __future__ import annotations

from html import escape
from itertools import groupby

from autopar.inspect.offload_view import optimizer_text
from autopar.units import human_bytes, human_seconds

WIDTH, LABEL, RIGHT = 1000, 380, 10  # the statement axis runs from LABEL to WIDTH - RIGHT
CHART, ROW, GAP = 110, 11, 3  # the device-bytes panel's height; a residence row and the space below it
MAX_ROWS = 40  # chunk rows drawn; the rest are counted
MAX_LABEL = 70  # characters of a row's label
BAR_COLOUR, ROW_COLOUR = "#3b7dd8", "#eef1f5"


def offload_section(plan) -> str:
    """The offload section; empty for a plan that offloads nothing."""
    o = plan.offload
    if o is None:
        return ""
    statements = max(len(o.device_bytes), 1)
    rows = [_chunk_row(o, c, statements, CHART + 18 + k * (ROW + GAP)) for k, c in enumerate(o.chunks[:MAX_ROWS])]
    height = CHART + 18 + len(rows) * (ROW + GAP) + 30
    more = (f"<p>… {len(o.chunks) - MAX_ROWS} more chunks (plan.explain('chunk N') for one)</p>"
            if len(o.chunks) > MAX_ROWS else "")
    return (f'<section class="offload"><h2>Offload <span>{len(o.chunks)} chunks, adds '
            f'{escape(human_seconds(o.added_s))} per step</span></h2>{_figures(o)}'
            f'<p>{escape(o.reason)}</p><svg viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
            f'aria-label="offloaded chunks on the device">{_device_panel(o, statements)}'
            f'{_statement_axis(statements, height)}{"".join(rows)}</svg>{more}</section>')


def _figures(o) -> str:
    moved = o.fetches * o.chunk_bytes
    step = optimizer_text(o.optimizer)
    figures = [f"{len(o.chunks)} chunks × {human_bytes(o.chunk_bytes)} in host memory",
               f"host {human_bytes(o.host_bytes)} per device (parameters, gradients, optimizer state)",
               f"at most {o.slots} on the device",
               f"{o.fetches} fetches per step, {human_bytes(moved)} host → device",
               f"adds {human_seconds(o.added_s)} per step: waits for fetches {human_seconds(o.exposed_s)} + {step}"]
    return '<p class="figures">' + " · ".join(escape(f) for f in figures) + "</p>"


def _x(k: float, statements: int) -> float:
    return LABEL + (WIDTH - LABEL - RIGHT) * k / statements


def _device_panel(o, statements: int) -> str:
    """Chunk bytes on the device per statement, a step curve; the slots' bytes and the host's as rules."""
    cap = o.slots * o.chunk_bytes
    top = max(max(o.device_bytes, default=0), cap, 1) * 1.15

    def y(b: float) -> float:
        return 8 + (CHART - 8) * (1 - b / top)

    points, k = [], 0
    for value, run in groupby(o.device_bytes):
        n = len(list(run))
        points += [(_x(k, statements), y(value)), (_x(k + n, statements), y(value))]
        k += n
    line = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    parts = [f'<text x="0" y="{CHART * 0.4:.0f}" font-size="12">chunk bytes on the device</text>',
             _rule(y(0), human_bytes(0), "grid"), _rule(y(cap), f"{o.slots} × {human_bytes(o.chunk_bytes)}", "held")]
    parts += [_rule(y(k * o.chunk_bytes), "", "grid") for k in (range(1, o.slots) if o.slots <= 16 else ())]
    if points:
        parts.append(f'<polygon points="{LABEL},{y(0):.1f} {line} {_x(statements, statements):.1f},{y(0):.1f}" '
                     f'fill="{BAR_COLOUR}33"/><polyline points="{line}" fill="none" stroke="{BAR_COLOUR}" '
                     f'stroke-width="1.5"/>')
    host = f"host memory all step: {human_bytes(o.host_bytes)} per device"
    if o.host_bytes <= top:
        parts.append(_rule(y(o.host_bytes), host, "capacity"))
    else:  # a rule would flatten the curve: the constant as a label
        parts.append(f'<text x="0" y="{CHART * 0.4 + 16:.0f}" class="ax">{escape(host)} (off the scale)</text>')
    return "".join(parts)


def _rule(y: float, label: str, style: str) -> str:
    return (f'<line x1="{LABEL}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="{style}"/>'
            f'<text x="{LABEL - 6}" y="{y + 4:.1f}" class="ax" text-anchor="end">{escape(label)}</text>')


def _chunk_row(o, chunk, statements: int, y: float) -> str:
    spans = o.residence(chunk.index, statements)
    label = _label(chunk)
    names = ", ".join(chunk.params[:20]) + (f", … {len(chunk.params) - 20} more" if len(chunk.params) > 20 else "")
    bars = "".join(
        f'<rect x="{_x(a, statements):.2f}" y="{y}" width="{max(_x(b, statements) - _x(a, statements), 0.5):.2f}" '
        f'height="{ROW}" fill="{BAR_COLOUR}"><title>chunk {chunk.index} on the device from statement {a} until '
        f"statement {b}</title></rect>" for a, b in spans)
    return (f'<g class="chunk"><text x="0" y="{y + ROW - 2}" class="ax"><title>{escape(names)}</title>'
            f'{escape(label)}</text><rect x="{LABEL}" y="{y}" width="{WIDTH - LABEL - RIGHT}" height="{ROW}" '
            f'fill="{ROW_COLOUR}" fill-opacity="0.7"/>{bars}</g>')


def _label(chunk) -> str:
    """"chunk k: first param … (n params, used/capacity)", the name cut on its left to fit."""
    n = len(chunk.params)
    tail = (f"{' …' if n > 1 else ''} ({n} param{'s' if n != 1 else ''}, "
            f"{human_bytes(chunk.used_bytes)}/{human_bytes(chunk.nbytes)})")
    head = f"chunk {chunk.index}: "
    first = chunk.params[0] if chunk.params else ""
    room = MAX_LABEL - len(head) - len(tail)
    if len(first) > room:
        first = "…" + first[len(first) - room + 1:]
    return head + first + tail


def _statement_axis(statements: int, height: float) -> str:
    ticks = sorted({round(statements * k / 4) for k in range(5)})
    marks = "".join(f'<line x1="{_x(t, statements):.1f}" x2="{_x(t, statements):.1f}" y1="{CHART + 12}" '
                    f'y2="{height - 24}" class="grid"/><text x="{_x(t, statements):.1f}" y="{height - 14}" '
                    f'class="ax" text-anchor="middle">{t}</text>' for t in ticks)
    return marks + (f'<text x="{_x(statements / 2, statements):.1f}" y="{height - 2}" class="ax" '
                    f'text-anchor="middle">statements of the step (forward, then backward); a bar: the chunk is on '
                    f"the device</text>")
