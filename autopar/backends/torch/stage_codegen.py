"""Torch backend for a pipelined plan: a forward and a backward program per stage.

``forward_<k>(rt, placeholders..., received...)`` runs stage k's part of one micro-batch on this
rank's blocks and returns ``(loss or None, [sent...], [saved...])``: what goes to stage k+1
(autopar.lowering.stages.Slot, carriers included) and what its backward reads.
``backward_input_<k>(rt, placeholders..., saved, grads_in, grad_loss)`` takes the backward
values stage k+1 sent back (``grads_in``; on the last stage ``grad_loss`` seeds the loss
instead), computes what stage k-1 waits for and returns ``([sent back...], [kept...])``;
``backward_weight_<k>(rt, placeholders..., kept, grad_loss, sync, unsynced, curvature)`` computes
the weight gradients from ``kept`` and returns ``{parameter name: gradient}``: zero-bubble
schedules run it later, in a bubble. Under K-FAC it also puts into ``curvature`` (when given) the
two operands of each preconditioned weight's gradient matmul, from which the runtime computes
the weight's curvature factors (autopar.lowering.curvature). ``sync`` is False on every micro-batch but a stage's
last: those return local gradients, which the last adds before its gradient collectives (as
DDP's no_sync accumulates them). The schedule that calls these is
torch.distributed.pipelining's (autopar.runtime.pipeline).
"""
from __future__ import annotations

import torch

from autopar.backends.printer import Sections, header, indented, one_line, torch_name, wrapped
from autopar.backends.torch.codegen import (
    ACCUMULATE_SOURCE,
    BackwardBody,
    StatementPrinter,
    is_loss_seed,
    module_preamble,
    seed_lines,
)
from autopar.errors import AutoparError
from autopar.lowering.curvature import curvature_layers
from autopar.lowering.naming import readable
from autopar.lowering.schedule import Split
from autopar.lowering.stages import StageProgram, stage_programs
from autopar.units import human_seconds


def emit_torch_pipeline(plan) -> str:
    named = readable(plan)
    pipeline = named.pipeline
    lines = header(plan, "autopar: per-rank pipeline stages for torch.distributed.pipelining (generated; do not "
                         "edit)")
    lines += [
        f"# {one_line(pipeline.schedule)} with {pipeline.microbatches} micro-batches on {pipeline.pp} ranks"
        f"{f' x {pipeline.virtual} stages each' if pipeline.virtual > 1 else ''}; "
        f"predicted step {human_seconds(pipeline.step_time_s)}, bubble {pipeline.bubble_fraction:.1%}",
        "# forward_<k>(rt, placeholders..., received...) -> (loss or None, [sent...], [saved...])",
        "# backward_input_<k>(rt, placeholders..., saved, grads_in, grad_loss) -> ([sent back...], [kept...])",
        "# backward_weight_<k>(rt, placeholders..., kept, grad_loss, sync, unsynced, curvature) -> "
        "{parameter name: gradient}",
    ] + ([f"# the stages' parameters, gradients and optimizer state live in host memory "
          f"({one_line(pipeline.offload.reason)}): the runner passes each program its stage's parameters "
          f"brought up for that call and moves the gradients down (autopar.runtime.stage_offload)"]
         if pipeline.offload is not None else []) + module_preamble(plan)
    printer = StatementPrinter(named)
    captured = _captured_weights(named)
    for stage in stage_programs(named):
        lines += ["", ""] + _forward(named, printer, stage)
        lines += ["", ""] + _backward(named, printer, stage, captured)
    lines += ["", "", *ACCUMULATE_SOURCE.splitlines()]
    return "\n".join(lines) + "\n"


def _forward(plan, printer: StatementPrinter, stage: StageProgram) -> list[str]:
    st = plan.pipeline.stages[stage.index]
    received = [s.var for s in stage.receives]
    lines = [one_line(f"# ==== stage {stage.index} (pipeline rank {st.rank}): {_units(st.units)} ====")]
    lines += wrapped(f"def forward_{stage.index}(", ["rt", *stage.placeholders, *received], "):")
    body = [f"# received from stage {stage.index - 1}: {_slots(stage.receives)}"] if received else []
    sections = Sections(plan)
    for s in stage.forward[:-1]:
        body += sections.before(s, "forward") + printer.lines(s)
    for slot in stage.sends:
        if slot.carrier:  # sent only for its gradient slot, which brings a backward value back
            dtype = torch_name(torch.dtype, slot.dtype)
            body.append(f"{slot.var} = torch.zeros({list(slot.shape)}, dtype={dtype}, device=rt.device)"
                        f"  # carries {slot.carries} back")
    sends = [s.var for s in stage.sends]
    body += ["return ("] + indented([f"{stage.loss or 'None'},"] + wrapped("[", sends, "],  # to the next stage")
                                    + wrapped("[", list(stage.saved), "],  # saved for backward")
                                    + wrapped("[", list(stage.values), "],  # the model's other outputs")) + [")"]
    return lines + indented(body)


def _backward(plan, printer: StatementPrinter, stage: StageProgram, captured: dict) -> list[str]:
    args = [p for p in stage.placeholders if p not in stage.inputs]
    lines = wrapped(f"def backward_input_{stage.index}(", ["rt", *args, "saved", "grads_in", "grad_loss"], "):")
    body = wrapped("[", list(stage.grads_in), "] = grads_in  # from the next stage") if stage.grads_in else []
    body += wrapped("[", list(stage.saved), "] = saved  # the values forward kept for backward") if stage.saved else []
    body += ["saved.clear()  # held here alone now: each is freed after its last use"]
    sections = Sections(plan)
    for s in stage.backward_input[:-1]:
        body += sections.before(s, "backward") + (seed_lines(s) if is_loss_seed(plan, s) else printer.lines(s))
    body += ["return ("] + indented(wrapped("[", list(stage.grads_out), "],  # to the stage before")
                                    + wrapped("[", list(stage.kept), "],  # for the weight gradients")) + [")"]
    lines += indented(body)
    weight = BackwardBody(plan, printer, Sections(plan), stage.gradients, _curvature_captures(stage, captured))
    if weight.shared:
        raise AutoparError(f"the gradient syncs of {', '.join(weight.shared)} are read by backward too, so they "
                           f"cannot wait for a stage's last micro-batch; plan this model without 'pp'")
    lines += ["", ""] + wrapped(f"def backward_weight_{stage.index}(",
                                ["rt", *args, "saved", "grad_loss", "sync", "unsynced", "curvature"], "):")
    return lines + indented(weight.lines(Split([], stage.backward_weight, stage.kept)))


def _captured_weights(plan) -> dict[str, str]:
    """Under K-FAC: each preconditioned weight's gradient matmul -> the weight (none without)."""
    fill = plan.pipeline.fill
    if fill is None or fill.optimizer != "kfac":
        return {}
    return {layer.gradient_mm: layer.weight for layer in curvature_layers(plan)[0]}


def _curvature_captures(stage: StageProgram, captured: dict) -> dict[str, list[str]]:
    """Before each of the stage's captured gradient matmuls: the lines that hand its two operands
    to the runtime, for the weight's curvature factors."""
    return {s.defines: ["if curvature is not None:  # K-FAC: this weight's gradient matmul's operands",
                        f"    curvature[{captured[s.defines]!r}] = ({s.uses[0]}, {s.uses[1]})"]
            for s in stage.backward_weight if s.kind == "call" and s.defines in captured}


def _slots(slots) -> str:
    return ", ".join(f"{s.var} {list(s.shape)}" + (f" (brings {s.carries} back)" if s.carries else "")
                     for s in slots)


def _units(units) -> str:
    return units[0] if len(units) == 1 else f"{units[0]} .. {units[-1]}"
