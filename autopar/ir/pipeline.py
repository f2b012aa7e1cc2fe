"""A plan's pipeline: its stages, schedule and micro-batches, as pure data with a JSON round trip.

The stages are contiguous ranges of units (the part of the model before its repeated layers,
each layer, the part after), each priced for one micro-batch on one device of its stage; the
schedule is one of torch.distributed.pipelining's, named by its class without "Schedule".
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from autopar.ir.bubbles import BubbleFill


class ActionKind(StrEnum):
    """What a schedule's action runs for one stage and micro-batch."""

    F = "F"  # forward
    B = "B"  # full backward
    I = "I"  # noqa: E741 - the input gradient (a zero-bubble schedule's split backward), as torch names it
    W = "W"  # the weight gradient


class Action(NamedTuple):
    """One action of a pipeline schedule: ``stage``'s ``kind`` on ``microbatch``; printed (and
    stored in plan files) as "3F1"."""

    stage: int
    kind: ActionKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{ActionKind(self.kind).value}{self.microbatch}"

    @staticmethod
    def parse(label: str) -> Action:
        """The action ``str(action)`` printed, e.g. "3F1"."""
        stage, kind, microbatch = re.fullmatch(r"(\d+)([FBIW])(\d+)", label).groups()
        return Action(int(stage), ActionKind(kind), int(microbatch))


@dataclass(frozen=True)
class UnitCost:
    """One unit of the chain for one micro-batch on one device: compute (with its blocking
    collectives), the gradient syncs it starts once a step, and bytes."""
    name: str
    forward_s: float
    backward_input_s: float  # the work the input gradient needs (a zero-bubble schedule's I)
    backward_weight_s: float  # the weight gradients' own work (W)
    sync_s: float  # its gradients' syncs into their parameters' layouts, once a step
    parameter_bytes: float  # parameters and their gradients
    optimizer_bytes: float
    activation_bytes: float  # what one micro-batch keeps for backward
    send_bytes: float  # what crosses to the next unit, forward (and its gradient, backward)
    parameter_elements: float = 0.0  # its parameters' elements, which an optimizer steps

    @property
    def static_bytes(self) -> float:
        return self.parameter_bytes + self.optimizer_bytes


@dataclass(frozen=True)
class Stage:
    index: int
    rank: int  # its coordinate on the pp axis
    units: tuple[str, ...]
    forward_s: float  # per micro-batch
    backward_input_s: float
    backward_weight_s: float
    send_s: float  # P2P of its output to the next stage (and of the gradient back)
    sync_s: float  # its gradient syncs, once a step
    parameter_bytes: float
    optimizer_bytes: float
    activation_bytes: float  # per micro-batch in flight
    in_flight: int  # micro-batches the schedule keeps on it at once

    @property
    def backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s


@dataclass(frozen=True)
class Block:
    """One action of the simulated schedule: what the report draws."""
    rank: int
    action: Action
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Candidate:
    """A schedule the search weighed: its predicted step time, or why it was ruled out."""
    schedule: str
    microbatches: int
    virtual: int
    step_time_s: float  # inf when ruled out
    bubble_fraction: float
    note: str  # why ruled out, or "" for a priced candidate


@dataclass(frozen=True)
class StageOffload:
    """A pipeline whose stages keep their parameters, gradients and optimizer state in host
    memory, as FSDP2's CPUOffloadPolicy does per module: each action of a stage (F, I, W) brings
    the stage's parameters to the device and drops them when it ends, each W moves its gradients
    down (the last one brings the earlier micro-batches' sum up for the gradient syncs first),
    and the optimizer steps the host copies. Bytes and seconds are per pp rank, per step."""
    reason: str  # why the planner offloads (for explain)
    host_bytes: tuple[float, ...]  # its stages' parameters, gradients and optimizer state
    up_bytes: tuple[float, ...]  # host -> device: parameters for every action, gradient sums for the syncs
    down_bytes: tuple[float, ...]  # device -> host: every W's gradients
    optimizer_s: tuple[float, ...]  # the host's optimizer step over its stages' parameters

    @staticmethod
    def from_json(d: dict) -> StageOffload:
        return StageOffload(d["reason"], *(tuple(d[k]) for k in ("host_bytes", "up_bytes", "down_bytes",
                                                                  "optimizer_s")))


@dataclass(frozen=True)
class Pipeline:
    pp: int
    schedule: str
    microbatches: int
    virtual: int  # stages per rank
    stages: tuple[Stage, ...]
    step_time_s: float
    bubble_fraction: float  # of the ranks' time, no action running
    rank_peak_bytes: tuple[float, ...]  # per pp rank
    timeline: tuple[Block, ...]
    candidates: tuple[Candidate, ...] = ()  # every (schedule, micro-batches, virtual) weighed, best first
    # call node -> its unit's index in the chain (the stages' units, in order): where it runs
    node_units: dict = field(default_factory=dict)
    fill: BubbleFill | None = None  # the optimizer's deferred work placed in the bubbles (K-FAC)
    offload: StageOffload | None = None  # the stages' state in host memory

    def node_stages(self) -> dict[str, int]:
        """Call node -> the index of the stage that runs it."""
        stage_of_unit = [st.index for st in self.stages for _ in st.units]
        return {node: stage_of_unit[unit] for node, unit in self.node_units.items()}

    def to_json(self) -> dict:
        body = dataclasses.asdict(self)
        body["timeline"] = [{**b, "action": str(block.action)} for b, block in zip(body["timeline"], self.timeline)]
        return body

    @staticmethod
    def from_json(d: dict) -> Pipeline:
        d = dict(d)
        d["stages"] = tuple(Stage(**{**s, "units": tuple(s["units"])}) for s in d["stages"])
        d["rank_peak_bytes"] = tuple(d["rank_peak_bytes"])
        d["timeline"] = tuple(Block(**{**b, "action": Action.parse(b["action"])}) for b in d["timeline"])
        d["candidates"] = tuple(Candidate(**c) for c in d.get("candidates", ()))
        d["fill"] = BubbleFill.from_json(d["fill"]) if d.get("fill") else None
        d["offload"] = StageOffload.from_json(d["offload"]) if d.get("offload") else None
        return Pipeline(**d)

    def decisions(self) -> dict:
        """What the plan's hash names: the schedule, the micro-batches and the partition."""
        return {"pp": self.pp, "schedule": self.schedule, "microbatches": self.microbatches, "virtual": self.virtual,
                "stages": [list(s.units) for s in self.stages],
                "fill": None if self.fill is None else {"refresh": self.fill.refresh, "work": [
                    (w.name, w.phase, w.after) for w in self.fill.work]},
                **({"offload": True} if self.offload is not None else {})}
