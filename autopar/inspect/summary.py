"""Plan.summary(): what the plan decided and what it costs, as text."""
from __future__ import annotations

from collections import Counter

from autopar.backends.printer import shape_text
from autopar.inspect.offload_view import offload_lines
from autopar.inspect.pipeline_view import pipeline_lines
from autopar.inspect.plan_layers import TOP_LEVEL, module_rows
from autopar.ops.attention import FORWARD as ATTENTION_FORWARD
from autopar.ops.attention import SDPA_FORWARD, key_spec, keys_gathered
from autopar.ops.kinds import communicating_axis
from autopar.ops.moe import MOE_FORWARD, layout_text
from autopar.units import human_bytes, human_seconds

_MAX_ROWS = 40
_MAX_FORMULAS = 5  # largest collectives shown with their byte formulas
_MAX_SITES = 4  # module paths listed per fallback op
_METADATA_OPS = ("getitem", "aten.view.", "aten._unsafe_view.", "aten.reshape.", "aten.t.", "aten.transpose.",
                 "aten.permute.", "aten.expand.", "aten.detach.", "aten.unsqueeze.", "aten.squeeze.", "aten.alias.")


def _precision_lines(plan) -> list[str]:
    if plan.graph.autocast is None:
        return []
    wire = sorted({r.wire_dtype for r in plan.redistributions if r.wire_dtype is not None})
    return [f"mixed precision: float32 parameters, computing in {plan.graph.autocast}"
            + (f", gradient syncs moving {', '.join(wire)}" if wire else "")]


def summarize(plan) -> str:
    g, p = plan.graph, plan.predicted
    n_forward = sum(1 for n in g.nodes if n.op == "call" and n.phase == "forward")
    n_calls = sum(1 for n in g.nodes if n.op == "call")
    axes = ", ".join(plan.mesh.axis_names)
    s = plan.solver
    out = [
        f"autopar plan {plan.hash}: mesh {plan.device_mesh} on {plan.hardware}, graph {plan.fingerprint} "
        f"({n_calls} ops: {n_forward} forward, {n_calls - n_forward} backward)",
        f"solver: {s.backend} {s.status} in {s.seconds:.2f} s ({s.n_variables} variables), "
        f"objective {human_seconds(s.objective_s)}, gap {s.gap:.2%}",
        *[f"mesh search: {r.note}" for r in plan.history if r.name == "mesh_search"],
        *[f"plan cache: {r.note}" for r in plan.history if r.name == "cache"],
        *_precision_lines(plan),
        _step_time_line(plan),
        f"peak memory per device: {human_bytes(p.peak_memory_bytes)} = "
        + " + ".join(f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in p.memory_bytes.items() if v),
        _recompute_line(plan),
        *_moe_lines(plan),
        *_sequence_split_lines(plan),
        *offload_lines(plan),
        *pipeline_lines(plan),
        "",
        f"by module (compute per step; parameters with their placement per mesh axis: {axes}):",
    ]
    out += _module_lines(plan)

    ops = [n for n in g.nodes if n.op == "call" and n.phase == "forward" and not n.target.startswith(_METADATA_OPS)]
    ops.sort(key=lambda n: -plan.strategies[n.name].compute_s)
    out += ["", f"forward compute ops, costliest first ({len(ops)}):"]
    for n in ops[:_MAX_ROWS]:
        st = plan.strategies[n.name]
        shape = shape_text(n.outputs[0].shape) if n.outputs and n.outputs[0] else "-"
        out.append(f"  {n.name:<28} {n.target:<44} {shape:<16} {', '.join(str(x) for x in st.out_specs):<14} "
                   f"{human_seconds(st.compute_s)}")
    if len(ops) > _MAX_ROWS:
        out.append(f"  ... {len(ops) - _MAX_ROWS} more")

    coll = plan.collectives()
    phases = Counter(r.phase for r, _ in coll)
    out += ["", f"collectives ({len(coll)}: {phases.get('forward', 0)} forward, {phases.get('backward', 0)} backward):"]
    if coll:
        out.append(f"  {'phase':<9} {'kind':<15} {'axis':<6} {'tensor':<28} {'bytes':>10} {'time':>10}")
    for r, i in sorted(coll, key=lambda c: -c[0].step_seconds[c[1]])[:_MAX_ROWS]:
        step = r.steps[i]
        out.append(f"  {r.phase:<9} {step.kind:<15} {plan.mesh.axis_names[step.axis]:<6} {r.value:<28} "
                   f"{human_bytes(r.step_bytes[i]):>10} {human_seconds(r.step_seconds[i]):>10}")
    if len(coll) > _MAX_ROWS:
        out.append(f"  ... {len(coll) - _MAX_ROWS} more")
    out += _formula_lines(plan, coll)

    sites = plan.fallback_sites
    out += ["", "fallback ops (no sharding rule; replicated): " + ("" if sites else "none")]
    for op, modules in sites.items():
        distinct = sorted(set(modules))
        more = f" and {len(distinct) - _MAX_SITES} more" if len(distinct) > _MAX_SITES else ""
        where = ", ".join(distinct[:_MAX_SITES]) + more
        out.append(f"  {op} x{len(modules)} in {where}")
    return "\n".join(out)


def _step_time_line(plan) -> str:
    p = plan.predicted
    return (f"predicted step time: {human_seconds(p.step_time_s)} = compute {human_seconds(p.compute_s)} "
            f"+ communication {human_seconds(p.communication_s)}"
            + (f" + pipeline bubbles and P2P waits {human_seconds(p.bubble_s)}" if plan.pipeline else "")
            + (f" (and {human_seconds(p.hidden_communication_s)} of communication hidden under compute: gradient "
               f"syncs, prefetched gathers)" if p.hidden_communication_s else "")
            + f"; {p.sharded_flops_fraction:.0%} of FLOPs sharded")


def _module_lines(plan) -> list[str]:
    rows = [r for r in module_rows(plan) if r.params or r.forward_s or r.backward_s]
    width = max((len(f) for r in rows for f, _, _ in r.params), default=10)
    out = []
    for row in rows:
        moved = sum(r.step_bytes[i] for r, i in row.collectives)
        seconds = sum(r.step_seconds[i] for r, i in row.collectives)
        collectives = f", {len(row.collectives)} collectives ({human_bytes(moved)}, {human_seconds(seconds)})" \
            if row.collectives else ""
        out.append(f"  {row.path or TOP_LEVEL}: forward {human_seconds(row.forward_s)}, backward "
                   f"{human_seconds(row.backward_s)}{collectives}")
        out += [f"    {fqn:<{width}}  {shape_text(shape):<16} {spec}" for fqn, shape, spec in row.params]
    return out


def _recompute_line(plan) -> str:
    if plan.prefetch:
        return ("recomputation: none; parameter all-gathers start a layer ahead (prefetched, as FSDP does: the "
                "budget holds two layers' gathered parameters)")
    if not plan.recompute:
        return "recomputation: none (every forward value backward reads is kept)"
    shown = ", ".join(plan.recompute[:_MAX_SITES]) + (" ..." if len(plan.recompute) > _MAX_SITES else "")
    return (f"recomputation: {len(plan.recompute)} forward values computed again in backward "
            f"(+{human_seconds(plan.predicted.recompute_s)} per step): {shown}")


def _moe_lines(plan) -> list[str]:
    """Each mixture-of-experts layer's layout (autopar.ops.moe), layers of one layout together."""
    layers: dict[str, list[str]] = {}
    for n in plan.graph.nodes:
        if n.target == MOE_FORWARD:
            layout = layout_text(plan.strategies[n.name].in_specs, plan.mesh.axis_names)
            layers.setdefault(layout, []).append(plan.modules.get(n.name, n.name))
    if not layers:
        return []
    routing = "balanced routing assumed" if plan.moe_imbalance == 1.0 else \
        f"routing imbalance {plan.moe_imbalance:g} (busiest expert over the mean)"
    out = [f"mixture of experts: {sum(map(len, layers.values()))} layers, {routing}; plan.explain('moe') weighs "
           f"their layouts"]
    for layout, modules in layers.items():
        shown = ", ".join(modules[:_MAX_SITES]) + (f" and {len(modules) - _MAX_SITES} more"
                                                    if len(modules) > _MAX_SITES else "")
        out.append(f"  {layout}: {shown}")
    return out


def _sequence_split_lines(plan) -> list[str]:
    """Context parallelism (autopar.ops.attention): the attention calls that split their
    sequence, over which axis, and where their keys and values are gathered."""
    layers = [n for n in plan.graph.nodes if n.target == ATTENTION_FORWARD]
    split = [(n, communicating_axis(SDPA_FORWARD, plan.strategies[n.name].in_specs, plan.mesh.shape))
             for n in layers]
    split = [(n, axis) for n, axis in split if axis is not None]
    if not split:
        return []
    names = ", ".join(sorted({plan.mesh.axis_names[axis] for _, axis in split}))
    inside = sum(1 for n, axis in split if keys_gathered(key_spec(n.target, plan.strategies[n.name].in_specs), axis))
    forms = [f"{count} with their keys and values {how}" for count, how in
             ((inside, "gathered inside the kernel"), (len(split) - inside, "gathered by the plan's moves")) if count]
    return [f"context parallel: {len(split)} of {len(layers)} attention calls split their sequence over {names} "
            f"in contiguous blocks, {', '.join(forms)}; plan.explain('attention') weighs their layouts"]


def _formula_lines(plan, coll) -> list[str]:
    f = plan.formula
    if f is None:
        return []
    sizes = ", ".join(f"{k}={v}" for k, v in f.sizes.items())
    out = ["", f"as formulas of {', '.join(f.sizes)} (planned at {sizes}; plan.evaluate(...) re-prices):",
           f"  step time (s): {_short(f.step_time_s)}"]
    largest = sorted(coll, key=lambda c: -c[0].step_bytes[c[1]])[:_MAX_FORMULAS]
    for r, i in largest:
        out.append(f"  {r.steps[i].kind}[{plan.mesh.axis_names[r.steps[i].axis]}] of {r.value}: "
                   f"{f.collective_bytes[f'{r.id}.{i}']} bytes")
    return out


def _short(expr, limit: int = 160) -> str:
    text = str(expr.evalf(4))
    return text if len(text) <= limit else text[:limit] + " ... (plan.cost_formula() has it all)"
