"""`autopar show`: a plan in the terminal as tables, one row per module of the model.

The module of each node is the innermost module it comes from (``plan.modules``); a
parameter belongs to the module that owns it, an input to the model itself (shown as
"<model>"). ``autopar.inspect.report_html`` draws the same grouping as a tree.
"""
from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from autopar.backends.printer import shape_text
from autopar.inspect.plan_layers import TOP_LEVEL, module_rows, node_modules
from autopar.ir.placement import Partial, Shard, Spec
from autopar.units import human_bytes, human_seconds

MAX_COLLECTIVE_ROWS = 30


def spec_text(spec: Spec) -> Text:
    """``(S(0), R)`` with each placement coloured: sharded green, partial yellow, replicated dim."""
    text = Text("(")
    for k, p in enumerate(spec.placements):
        style = "green" if isinstance(p, Shard) else "yellow" if isinstance(p, Partial) else "dim"
        text.append(str(p), style=style)
        text.append(", " if k < len(spec.placements) - 1 else ")")
    return text


def render_plan(plan, console: Console) -> None:
    console.print(_header(plan))
    if plan.pipeline is not None:
        console.print(_stages_table(plan))
    console.print(_layers_table(plan))
    console.print(_collectives_table(plan))
    sites = plan.fallback_sites
    console.print("fallback ops (no sharding rule; replicated): " + ("none" if not sites else ""))
    for op, modules in sites.items():
        console.print(Text(f"  {op} x{len(modules)} in {', '.join(sorted(set(modules)))}"))


def _header(plan) -> Panel:
    p, s = plan.predicted, plan.solver
    n_calls = sum(1 for n in plan.graph.nodes if n.op == "call")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("mesh", Text(f"{plan.device_mesh} on {plan.hardware}"))
    grid.add_row("graph", f"{plan.fingerprint} ({n_calls} ops)")
    grid.add_row("solver", f"{s.backend} {s.status} in {s.seconds:.2f} s, gap {s.gap:.2%}")
    hidden = f"; {human_seconds(p.hidden_communication_s)} of communication hidden under compute" \
        if p.hidden_communication_s else ""
    recompute = f", of it recompute {human_seconds(p.recompute_s)}" if p.recompute_s else ""
    grid.add_row("step time", f"{human_seconds(p.step_time_s)} = compute {human_seconds(p.compute_s)}{recompute} "
                              f"+ communication {human_seconds(p.communication_s)}{hidden}")
    grid.add_row("peak memory", f"{human_bytes(p.peak_memory_bytes)} per device = " + " + ".join(
        f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in p.memory_bytes.items() if v))
    grid.add_row("sharded", f"{p.sharded_flops_fraction:.0%} of FLOPs")
    return Panel(grid, title=f"autopar plan {plan.hash}", title_align="left", highlight=False)


def _stages_table(plan) -> Table:
    pl = plan.pipeline
    table = Table(title=f"pipeline: {pl.schedule}, {pl.microbatches} micro-batches, bubble {pl.bubble_fraction:.1%} "
                        f"(times per micro-batch on one device of the stage)", title_justify="left", highlight=False)
    for name in ("stage", "rank", "units", "F", "I", "W", "send", "in flight", "memory"):
        table.add_column(name, justify="left" if name == "units" else "right", overflow="fold")
    for st in pl.stages:
        memory = st.parameter_bytes + st.optimizer_bytes + st.in_flight * st.activation_bytes
        table.add_row(str(st.index), str(st.rank), ", ".join(st.units), human_seconds(st.forward_s),
                      human_seconds(st.backward_input_s), human_seconds(st.backward_weight_s),
                      human_seconds(st.send_s), str(st.in_flight), human_bytes(memory))
    return table


def _layers_table(plan) -> Table:
    axes = ", ".join(plan.mesh.axis_names)
    table = Table(title=f"layers (placements per mesh axis: {axes})", title_justify="left", highlight=False)
    table.add_column("module", overflow="fold")
    table.add_column("parameters")
    table.add_column("fwd", justify="right")
    table.add_column("bwd", justify="right")
    table.add_column("collectives")
    for row in module_rows(plan):
        params = Text("\n").join(
            Text(f"{fqn.rpartition('.')[2]} {shape_text(shape)} ") + spec_text(spec) for fqn, shape, spec in row.params)
        table.add_row(Text(row.path or TOP_LEVEL), params, human_seconds(row.forward_s), human_seconds(row.backward_s),
                      _collectives_cell(plan, row.collectives))
    return table


def _collectives_cell(plan, collectives) -> Text:
    if not collectives:
        return Text()
    kinds = Counter(f"{r.steps[i].kind}[{plan.mesh.axis_names[r.steps[i].axis]}]" for r, i in collectives)
    total_bytes = sum(r.step_bytes[i] for r, i in collectives)
    total_s = sum(r.step_seconds[i] for r, i in collectives)
    return Text(f"{len(collectives)}: {human_bytes(total_bytes)}, {human_seconds(total_s)}\n"
                + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items()))


def _collectives_table(plan) -> Table:
    coll = sorted(plan.collectives(), key=lambda c: -c[0].step_seconds[c[1]])
    total = sum(r.step_seconds[i] for r, i in coll)
    table = Table(title=f"collectives ({len(coll)}, {human_seconds(total)} before overlap), costliest first",
                  title_justify="left", highlight=False)
    for name in ("phase", "kind", "axis", "tensor", "module"):
        table.add_column(name, overflow="fold")
    table.add_column("bytes", justify="right")
    table.add_column("time", justify="right")
    where = node_modules(plan)
    for r, i in coll[:MAX_COLLECTIVE_ROWS]:
        step = r.steps[i]
        cells = (r.phase, step.kind, plan.mesh.axis_names[step.axis], r.value, where.get(r.value, "") or TOP_LEVEL,
                 human_bytes(r.step_bytes[i]), human_seconds(r.step_seconds[i]))
        table.add_row(*map(Text, cells))
    if len(coll) > MAX_COLLECTIVE_ROWS:
        table.add_row("...", f"{len(coll) - MAX_COLLECTIVE_ROWS} more", "", "", "", "", "")
    return table
