"""Pricing a pipeline whose stages keep their state in host memory (autopar.ir.pipeline.StageOffload).

A stage's parameters, their gradients and the optimizer state live in host memory; each of its
actions brings the stage's parameters up over the host link and drops them when it ends, as
FSDP2's CPU offload brings a module's parameters up for each forward and backward. So the
device holds, beside activations, one stage's parameters and gradients at a time, and every
action pays its copy: the runtime copies on the compute stream (autopar.runtime.stage_offload),
so the seconds are added to the action, not hidden under it. Once a step, the last W brings
the earlier micro-batches' gradient sum up for the gradient syncs, and the host's optimizer
steps the stage's parameters after the schedule ends.
"""
from __future__ import annotations

from autopar.cost_models.pipeline_sim import StageTimes
from autopar.ir.hardware import Link
from autopar.ir.pipeline import Stage, StageOffload, UnitCost


def unit_moves_s(unit: UnitCost, link: Link) -> float:
    """What one micro-batch's moves add to a unit's compute, for the stage partition: its
    parameters up for F, I and W, its gradients down after W (the links' latencies are the
    stage's, counted once per action in ``with_moves``)."""
    return 4 * (unit.parameter_bytes / 2) / link.bandwidth


def with_moves(times: StageTimes, stage: Stage, link: Link) -> StageTimes:
    """A stage's action times with its parameters brought up for each action and its gradients
    moved down after each W."""
    one_way = link.seconds(stage.parameter_bytes / 2)  # the gradients take as long down as the parameters up
    return StageTimes(times.forward_s + one_way, times.backward_input_s + one_way,
                      times.backward_weight_s + 2 * one_way, times.send_s)


def device_bytes(stages: list[Stage]) -> float:
    """What a rank's stages hold on the device besides activations: one stage's parameters and
    gradients at a time (its actions run one after another)."""
    return max(st.parameter_bytes for st in stages)


def stage_offload(stages: tuple[Stage, ...], units: list[list[UnitCost]], pp: int, m: int, hw,
                  reason: str) -> StageOffload:
    """The per-rank bytes and seconds of ``stages`` (each with its ``units``) offloaded."""
    host, up, down, optimizer = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
    for st, mine in zip(stages, units):
        half = st.parameter_bytes / 2  # the parameters; their gradients take as many bytes
        host[st.rank] += st.parameter_bytes + st.optimizer_bytes
        up[st.rank] += 3 * m * half + (half if m > 1 else 0.0)  # F, I, W; the gradient sum for the syncs
        down[st.rank] += m * half
        optimizer[st.rank] += sum(u.parameter_elements for u in mine) / hw.host_optimizer_rate_per_device
    return StageOffload(reason, tuple(host), tuple(up), tuple(down), tuple(optimizer))


def once_a_step_s(offload: StageOffload, rank: int, stages: list[Stage], m: int, link: Link) -> float:
    """What a rank adds after its schedule's last action: its stages' gradient sums brought up
    for the syncs (with several micro-batches) and the host's optimizer step."""
    sums = sum(link.seconds(st.parameter_bytes / 2) for st in stages) if m > 1 else 0.0
    return sums + offload.optimizer_s[rank]
