"""The HTML report's pipeline timeline: one row per pp rank, each simulated action a block
(F, B, I, W coloured by kind, labelled with stage and micro-batch), the idle time between
them (the bubbles) shaded."""
from __future__ import annotations

from html import escape

from autopar.units import human_seconds

WIDTH, ROW, GAP, LABEL = 900, 26, 6, 60
KIND_COLOURS = {"F": "#3b7dd8", "B": "#2e9e5b", "I": "#2e9e5b", "W": "#8e5bd0"}
FILL_COLOUR = "#e0a030"  # the optimizer's work placed in a bubble (K-FAC), drawn in its first step
BUBBLE_COLOUR = "#e8ebef"


def pipeline_chart(plan) -> str:
    """The timeline section; empty for a plan without a pipeline."""
    pl = plan.pipeline
    if pl is None:
        return ""
    fill = [w for w in pl.fill.work if w.phase == 0] if pl.fill is not None else []
    span = max([b.end_s for b in pl.timeline] + [w.end_s for w in fill]) or 1.0
    scale = (WIDTH - LABEL) / span
    height = pl.pp * (ROW + GAP)
    rows = []
    for rank in range(pl.pp):
        y = rank * (ROW + GAP)
        rows.append(f'<text x="0" y="{y + ROW * 0.7:.1f}" font-size="12">rank {rank}</text>')
        rows.append(f'<rect x="{LABEL}" y="{y}" width="{WIDTH - LABEL}" height="{ROW}" fill="{BUBBLE_COLOUR}">'
                    f'<title>idle (bubble)</title></rect>')
        for b in (b for b in pl.timeline if b.rank == rank):
            x, w = LABEL + b.start_s * scale, max((b.end_s - b.start_s) * scale, 0.5)
            kind = b.action.kind.value
            title = f"{b.action}: {human_seconds(b.start_s)} to {human_seconds(b.end_s)}"
            rows.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW}" fill="{KIND_COLOURS[kind]}" '
                        f'stroke="#fff" stroke-width="0.5"><title>{escape(title)}</title></rect>')
            if w > 22:
                rows.append(f'<text x="{x + w / 2:.2f}" y="{y + ROW * 0.68:.1f}" font-size="10" fill="#fff" '
                            f'text-anchor="middle">{escape(str(b.action))}</text>')
        rows += [_filled(w, y, scale) for w in fill if w.rank == rank]
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {k}' for k, c in
                      (("F forward", KIND_COLOURS["F"]), ("B / I backward (input gradient)", KIND_COLOURS["B"]),
                       ("W weight gradient", KIND_COLOURS["W"]), ("idle: bubble", BUBBLE_COLOUR))
                      + ((("K-FAC work in a bubble (first step of the cycle; past the step's end: after it)",
                           FILL_COLOUR),) if fill else ()))
    return (f'<section class="pipeline"><h2>Pipeline <span>{escape(pl.schedule)}, {pl.microbatches} micro-batches, '
            f'bubble {pl.bubble_fraction:.1%}, step {escape(human_seconds(pl.step_time_s))}</span></h2>'
            f'<p>{legend}</p>{_fill_note(pl.fill)}<svg viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
            f'aria-label="pipeline timeline">{"".join(rows)}</svg></section>')


def _filled(work, y: float, scale: float) -> str:
    x, w = LABEL + work.start_s * scale, max((work.end_s - work.start_s) * scale, 0.5)
    title = f"{work.name} (after {work.after}): {human_seconds(work.start_s)} to {human_seconds(work.end_s)}"
    return (f'<rect class="filled" x="{x:.2f}" y="{y + ROW * 0.25:.1f}" width="{w:.2f}" height="{ROW * 0.5:.1f}" '
            f'fill="{FILL_COLOUR}"><title>{escape(title)}</title></rect>')


def _fill_note(fill) -> str:
    if fill is None:
        return ""
    return (f"<p>K-FAC: curvature every {fill.refresh} step(s); step first-order "
            f"{escape(human_seconds(fill.step_first_order_s))}, unfilled {escape(human_seconds(fill.step_unfilled_s))}"
            f", filled {escape(human_seconds(fill.step_filled_s))}; bubble {fill.bubble_before:.1%} &rarr; "
            f"{fill.bubble_after:.1%}</p>")
