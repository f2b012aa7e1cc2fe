"""A plan's pipeline as text: its stages and schedule (in the summary), and why this partition,
micro-batch count and schedule won (``plan.explain("pp")``)."""
from __future__ import annotations

import math
from collections import Counter

from autopar.ir.bubbles import TAIL
from autopar.lowering.curvature import MAX_FACTOR_WIDTH
from autopar.units import human_bytes, human_seconds

_RUNNERS_UP = 8


def pipeline_lines(plan) -> list[str]:
    """The summary's pipeline section; none for a plan without one."""
    pl = plan.pipeline
    if pl is None:
        return []
    virtual = f", {pl.virtual} stages per rank" if pl.virtual > 1 else ""
    out = ["", f"pipeline: {pl.pp} stages over pp (each on a mesh {plan.mesh}{virtual}), schedule {pl.schedule}, "
               f"{pl.microbatches} micro-batches; step {human_seconds(pl.step_time_s)}, bubble "
               f"{pl.bubble_fraction:.1%} of the ranks' time",
           f"  {'stage':<6} {'rank':<5} {'units':<40} {'F':>9} {'B (I + W)':>20} {'send':>9} {'in flight':>9} "
           f"{'memory':>10}"]
    for st in pl.stages:
        units = st.units[0] if len(st.units) == 1 else f"{st.units[0]} .. {st.units[-1]} ({len(st.units)})"
        memory = st.parameter_bytes + st.optimizer_bytes + st.in_flight * st.activation_bytes
        backward = f"{human_seconds(st.backward_input_s)} + {human_seconds(st.backward_weight_s)}"
        out.append(f"  {st.index:<6} {st.rank:<5} {units:<40} {human_seconds(st.forward_s):>9} {backward:>20} "
                   f"{human_seconds(st.send_s):>9} {st.in_flight:>9} {human_bytes(memory):>10}")
    out.append("  (F, B: one micro-batch on one device of the stage; memory: parameters, gradients, optimizer "
               "state and the activations in flight)")
    out.append("  peak per pp rank: " + ", ".join(human_bytes(b) for b in pl.rank_peak_bytes))
    return out + stage_offload_lines(pl.offload) + fill_lines(pl.fill)


def stage_offload_lines(offload) -> list[str]:
    """Where the stages keep their state in host memory: what each pp rank keeps and moves."""
    if offload is None:
        return []
    out = [f"  the stages' parameters, gradients and optimizer state in host memory ({offload.reason}): each "
           f"action brings its stage's parameters up, each W moves its gradients down, the host's optimizer steps "
           f"them (the memory column above is in host memory then; a rank's device holds one stage's parameters "
           f"and gradients at a time)"]
    for rank, host in enumerate(offload.host_bytes):
        out.append(f"    pp rank {rank}: {human_bytes(host)} in host memory; per step "
                   f"{human_bytes(offload.up_bytes[rank])} up, {human_bytes(offload.down_bytes[rank])} down, "
                   f"host optimizer {human_seconds(offload.optimizer_s[rank])}")
    return out


def fill_lines(fill) -> list[str]:
    """What fills the bubbles (K-FAC's work), and the step and bubble before and after."""
    if fill is None:
        return []
    in_gaps = [w for w in fill.work if w.after != TAIL]
    out = [f"  K-FAC in the bubbles: {len(fill.layers)} weights preconditioned, curvature refreshed every "
           f"{fill.refresh} step(s); {len(in_gaps)} of {len(fill.work)} pieces of its work fill bubbles, the rest "
           f"run after the step",
           f"    step: first-order {human_seconds(fill.step_first_order_s)}, K-FAC unfilled "
           f"{human_seconds(fill.step_unfilled_s)}, filled {human_seconds(fill.step_filled_s)} "
           f"({fill.step_filled_s / fill.step_first_order_s:.2f}x first-order); bubble {fill.bubble_before:.1%} -> "
           f"{fill.bubble_after:.1%}; factors {human_bytes(fill.factor_bytes)} per pp rank"]
    kinds = Counter((w.kind, w.after != TAIL) for w in fill.work)
    out.append("    " + ", ".join(f"{kind}: {kinds[kind, True]} in bubbles, {kinds[kind, False]} after"
                                  for kind in dict.fromkeys(w.kind for w in fill.work)))
    if fill.first_order:
        shown = ", ".join(fill.first_order[:6]) + (f" and {len(fill.first_order) - 6} more"
                                                    if len(fill.first_order) > 6 else "")
        out.append(f"    first-order (not linear weights, or a factor wider than {MAX_FACTOR_WIDTH}): {shown}")
    return out


def explain_pipeline(plan) -> str:
    """Why this plan's partition, micro-batch count and schedule: each candidate weighed, priced."""
    pl = plan.pipeline
    if pl is None:
        return f"plan {plan.hash} has no pipeline (its mesh {plan.mesh} has no 'pp' axis)"
    best = pl.candidates[0] if pl.candidates else None
    priced = [c for c in pl.candidates if math.isfinite(c.step_time_s)]
    ruled_out = [c for c in pl.candidates if not math.isfinite(c.step_time_s)]
    out = [f"pipeline of plan {plan.hash}: {pl.schedule}, {pl.microbatches} micro-batches, {pl.pp} ranks x "
           f"{pl.virtual} stages; {len(priced)} candidates priced, {len(ruled_out)} ruled out",
           "  each candidate: the stage partition of least fill-and-drain time under its memory (dynamic programming "
           "over layer boundaries), then the step simulated on the schedule's own action lists",
           f"  {'schedule':<24} {'micro-batches':>13} {'stages/rank':>11} {'step':>10} {'bubble':>7} {'vs best':>8}"]
    for c in priced[:_RUNNERS_UP]:
        ratio = c.step_time_s / best.step_time_s if best else 1.0
        mark = "->" if c is best else "  "
        out.append(f"{mark}{c.schedule:<24} {c.microbatches:>13} {c.virtual:>11} {human_seconds(c.step_time_s):>10} "
                   f"{c.bubble_fraction:>7.1%} {ratio:>7.2f}x")
    if len(priced) > _RUNNERS_UP:
        out.append(f"  ... {len(priced) - _RUNNERS_UP} more")
    out += [f"  ruled out: {c.schedule} with {c.microbatches} micro-batches ({c.virtual} stages/rank): {c.note}"
            for c in ruled_out]
    out.append("  partition: " + "; ".join(f"stage {st.index} (rank {st.rank}): {', '.join(st.units)}"
                                         for st in pl.stages))
    out.append(_why(pl, priced))
    out += stage_offload_lines(pl.offload) + fill_lines(pl.fill)
    return "\n".join(out)


def _why(pl, priced) -> str:
    if len(priced) < 2:
        return "  why: the only schedule that fits"
    runner_up = priced[1]
    return (f"  why: the least predicted step time; the runner-up, {runner_up.schedule} with {runner_up.microbatches} "
            f"micro-batches, takes {runner_up.step_time_s / priced[0].step_time_s - 1:.1%} longer "
            f"(bubble {runner_up.bubble_fraction:.1%} against {priced[0].bubble_fraction:.1%})")
