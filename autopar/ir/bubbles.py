"""Work placed in a pipeline's bubbles (PipeFisher, Osawa et al. 2023), as pure data.

A pipelined step leaves ranks idle; the work an optimizer can defer — K-FAC's curvature factors
of each micro-batch, their reduction over the stage's devices, the factors' inversion, the
gradients' preconditioning — runs in those gaps. Each piece runs right after one of the
schedule's actions on its rank (``after``, e.g. "1W3"), or past the step's end ("tail") when no
gap holds it; work that needs nothing of the step (an inversion of factors an earlier step
computed) may also run at its ``START``, while the rank waits for its first input, and any work
at its ``END``, once the rank's schedule has returned while others finish. Curvature is
refreshed once every ``refresh`` steps, its work spread over the cycle's steps (phases);
preconditioning runs every step.
"""
from __future__ import annotations

from dataclasses import dataclass

TAIL = "tail"  # runs after the rank's last action of the step: it lengthens the step
START = "start"  # runs as the step starts, while the rank waits for its first input
END = "end"  # runs when the rank's schedule has returned, while other ranks finish the step
# K-FAC's kinds of deferred work
FACTOR, REDUCE, INVERT, PRECONDITION = "factor", "reduce", "invert", "precondition"


@dataclass(frozen=True)
class Work:
    name: str  # e.g. "factor blocks.0.fc.weight mb2"
    kind: str  # FACTOR | REDUCE | INVERT | PRECONDITION
    stage: int
    rank: int  # its coordinate on the pp axis
    phase: int  # the step of the refresh cycle it runs in
    after: str  # the action whose end it follows, or START, END, TAIL
    start_s: float
    end_s: float
    layers: tuple[str, ...]  # the weights it works on
    microbatch: int = -1  # a factor's micro-batch


@dataclass(frozen=True)
class BubbleFill:
    optimizer: str  # "kfac"
    refresh: int  # steps per curvature refresh (the factors' and inverses' cycle)
    margin_s: float  # idle time every gap keeps free, so the filled work never delays the pipeline
    layers: tuple[str, ...]  # the weights K-FAC preconditions
    first_order: tuple[str, ...]  # the parameters it updates with their plain gradient (biases, norms, ...)
    work: tuple[Work, ...]
    step_first_order_s: float  # the pipeline's step without the optimizer's work
    step_unfilled_s: float  # with every piece of it after the step (same refresh), per step on average
    step_filled_s: float  # with the work placed in the bubbles, per step on average
    bubble_before: float  # share of the ranks' time idle, without the work
    bubble_after: float  # with the work in the bubbles
    factor_bytes: float  # factors and inverses held per pp rank, at most

    @staticmethod
    def from_json(d: dict) -> BubbleFill:
        d = dict(d)
        d["layers"], d["first_order"] = tuple(d["layers"]), tuple(d["first_order"])
        d["work"] = tuple(Work(**{**w, "layers": tuple(w["layers"])}) for w in d["work"])
        return BubbleFill(**d)
