"""The HTML report's pipeline timeline: one row per pp rank, each simulated action a block
(F, B, I, W coloured by kind, labelled with stage and micro-batch), the idle time between
them (the bubbles) shaded."""
from __future__ import annotations

from html import escape

from autopar.units import human_seconds

WIDTH, ROW, GAP, LABEL = 900, 26, 6, 60
KIND_COLOURS = {"F": "#3b7dd8", "B": "#2e9e5b", "I": "#2e9e5b", "W": "#8e5bd0"}
BUBBLE_COLOUR = "#e8ebef"


def pipeline_chart(plan) -> str:
    """The timeline section; empty for a plan without a pipeline."""
    pl = plan.pipeline
    if pl is None:
        return ""
    span = max(b.end_s for b in pl.timeline) or 1.0
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
            kind = b.action.rstrip("0123456789")[-1]
            title = f"{b.action}: {human_seconds(b.start_s)} to {human_seconds(b.end_s)}"
            rows.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW}" fill="{KIND_COLOURS[kind]}" '
                        f'stroke="#fff" stroke-width="0.5"><title>{escape(title)}</title></rect>')
            if w > 22:
                rows.append(f'<text x="{x + w / 2:.2f}" y="{y + ROW * 0.68:.1f}" font-size="10" fill="#fff" '
                            f'text-anchor="middle">{escape(b.action)}</text>')
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {k}' for k, c in
                      (("F forward", KIND_COLOURS["F"]), ("B / I backward (input gradient)", KIND_COLOURS["B"]),
                       ("W weight gradient", KIND_COLOURS["W"]), ("idle: bubble", BUBBLE_COLOUR)))
    return (f'<section class="pipeline"><h2>Pipeline <span>{escape(pl.schedule)}, {pl.microbatches} micro-batches, '
            f'bubble {pl.bubble_fraction:.1%}, step {escape(human_seconds(pl.step_time_s))}</span></h2>'
            f'<p>{legend}</p><svg viewBox="0 0 {WIDTH} {height}" width="100%" role="img" '
            f'aria-label="pipeline timeline">{"".join(rows)}</svg></section>')
