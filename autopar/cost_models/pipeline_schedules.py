"""The action lists of torch.distributed.pipelining's schedules: what each pipeline rank runs, in order.

The simulator (autopar.cost_models.pipeline_sim) prices the order torch's runtime executes.
The multi-stage schedules (interleaved, zero-bubble, DualPipeV) run their ``pipeline_order``,
so those lists come from torch's own classes, built on stand-in stages: a schedule computes
its order from the stage count, the ranks and the micro-batch count alone. GPipe and 1F1B run
a loop of their own instead (torch 2.13's ``Schedule1F1B.pipeline_order`` is not what its loop
runs: its last rank's forwards are numbered from 1), so their lists follow that loop: GPipe
every forward then every backward; 1F1B ``min(m, p - s)`` forwards on stage s, then
backward and forward alternately, then the remaining backwards.

Actions (autopar.ir.pipeline.Action) are F (forward), B (full backward), I (input gradient) and
W (weight gradient) of one stage on one micro-batch; DualPipeV's overlapped F+B pairs are listed as their parts, which
torch's runtime runs one after the other.
"""
from __future__ import annotations

import types

from torch import nn

from autopar.errors import AutoparError
from autopar.ir.pipeline import Action, ActionKind

# schedule name (torch's class name without "Schedule") -> the stages per rank it can hold.
# InterleavedZeroBubble on one stage per rank is ZB-H1 (Qi et al. 2023).
SCHEDULES = {
    "GPipe": (1,),
    "1F1B": (1,),
    "Interleaved1F1B": (2, 4),
    "InterleavedZeroBubble": (1, 2),
    "ZBVZeroBubble": (2,),
    "DualPipeV": (2,),
}
# schedules whose two stages per rank run in a V: rank r holds stages r and 2p-1-r
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
COMPUTE_KINDS = tuple(kind.value for kind in ActionKind)


def check_schedule(name: str) -> None:
    if name not in SCHEDULES:
        raise AutoparError(f"unknown pipeline schedule {name!r}; use one of {', '.join(map(repr, SCHEDULES))} "
                           f"(torch.distributed.pipelining's class names without 'Schedule')")


def virtual_choices(name: str) -> tuple[int, ...]:
    """The numbers of stages per rank schedule ``name`` runs."""
    check_schedule(name)
    return SCHEDULES[name]


def stage_ranks(name: str, pp: int, virtual: int) -> tuple[int, ...]:
    """Stage index -> the pipeline rank that runs it (torch's mapping: looped, or a V)."""
    if virtual not in virtual_choices(name):
        raise AutoparError(f"schedule {name} runs {' or '.join(map(str, virtual_choices(name)))} stages per rank, "
                           f"not {virtual}")
    if name in V_SHAPED:
        return tuple(s if s < pp else 2 * pp - 1 - s for s in range(2 * pp))
    return tuple(s % pp for s in range(pp * virtual))


def action_lists(name: str, pp: int, microbatches: int, virtual: int = 1) -> dict[int, list[Action]]:
    """Rank -> the compute actions torch's ``Schedule<name>`` runs there, in order, with
    ``virtual`` stages per rank. A combination the schedule refuses (too few micro-batches for
    its rounds) is an AutoparError that says why."""
    ranks = stage_ranks(name, pp, virtual)  # an unknown schedule or stage count fails here
    # imported here: torch's pipelining package takes most of a second to load, which planning
    # a model without a pipeline, or running a program, never needs
    from torch.distributed.pipelining import schedules as torch_schedules

    cls, n = getattr(torch_schedules, f"Schedule{name}"), len(ranks)
    if microbatches < 1:
        raise AutoparError(f"a pipeline needs at least one micro-batch, got microbatches={microbatches}")
    if name == "GPipe":
        return {s: [Action(s, kind, i) for kind in (ActionKind.F, ActionKind.B) for i in range(microbatches)]
                for s in range(pp)}
    if name == "1F1B":
        return {s: _one_forward_one_backward(s, pp, microbatches) for s in range(pp)}
    try:
        mine = [s for s in range(n) if ranks[s] == 0]
        order = cls([_stand_in(n, pp, 0, s) for s in mine], microbatches, loss_fn=_no_loss).pipeline_order
    except (ValueError, RuntimeError, AssertionError) as exc:
        raise AutoparError(f"schedule {name} cannot run {microbatches} micro-batches on {pp} pipeline ranks: "
                           f"{exc}") from exc
    return {rank: [a for item in order[rank] for a in _compute_actions(item)] for rank in range(pp)}


def _one_forward_one_backward(stage: int, pp: int, m: int) -> list[Action]:
    """Schedule1F1B's loop on ``stage``: warm-up forwards, then one backward and one forward."""
    warmup = min(m, pp - stage)
    order = [Action(stage, ActionKind.F, i) for i in range(warmup)]
    for i in range(m):
        order.append(Action(stage, ActionKind.B, i))
        if warmup + i < m:
            order.append(Action(stage, ActionKind.F, warmup + i))
    return order


def _stand_in(num_stages: int, pp: int, rank: int, index: int):
    """What a schedule's constructor reads of a PipelineStage."""
    return types.SimpleNamespace(num_stages=num_stages, group_size=pp, group_rank=rank, stage_index=index,
                                 is_first=index == 0, is_last=index == num_stages - 1, submod=nn.Module(),
                                 stage_index_to_group_rank=None)


def _no_loss(output, target):  # a schedule with a loss function is a training schedule (it has backward)
    return output


def _compute_actions(item) -> list[Action]:
    """Our actions for one entry of torch's order: none for an idle slot or a communication or
    gradient-reduction step, the parts of an overlapped pair in order."""
    if item is None:
        return []
    parts: tuple | None = item.sub_actions
    if parts is not None:
        return [a for part in parts for a in _compute_actions(part)]
    kind = item.computation_type.value
    if kind not in COMPUTE_KINDS:
        return []
    return [Action(item.stage_index, ActionKind(kind), item.microbatch_index)]
