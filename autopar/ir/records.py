"""The records a Plan carries: what each pass did, each redistribution, the predicted costs and
the solver's outcome. Pure data with JSON round trips."""
from __future__ import annotations

from dataclasses import dataclass

from autopar.ir.placement import Spec
from autopar.ir.redistribute import ASYNC_KINDS, COMMUNICATING, Step


@dataclass(frozen=True)
class PassRecord:
    name: str
    seconds: float
    note: str


@dataclass(frozen=True)
class SolverStats:
    backend: str
    status: str
    objective_s: float
    bound_s: float
    gap: float
    seconds: float
    n_variables: int
    # the wall-clock safety net stopped the solve: this plan depends on the machine's speed and load
    timed_out: bool = False


UPDATE = "update"  # the consumer of a buffer's new value: the runtime, which writes it into the buffer


@dataclass(frozen=True)
class Redistribution:
    id: str
    value: str  # the node whose output moves
    src: Spec
    dst: Spec
    steps: tuple[Step, ...]
    step_seconds: tuple[float, ...]
    step_bytes: tuple[float, ...]
    phase: str  # forward | backward
    consumers: tuple[str, ...]  # nodes reading the moved value; "output" for a final gradient, UPDATE for a buffer
    wire_dtype: str | None = None  # the dtype its collectives move (a gradient reduced in bf16), None: the value's

    @property
    def seconds(self) -> float:
        return sum(self.step_seconds)

    @property
    def is_async(self) -> bool:
        """A final gradient's sync whose first step the emitted program overlaps with backward."""
        return self.consumers == ("output",) and bool(self.steps) and self.steps[0].kind in ASYNC_KINDS

    @property
    def async_seconds(self) -> float:
        return self.step_seconds[0] if self.is_async else 0.0

    @property
    def communicates(self) -> bool:
        return any(s.kind in COMMUNICATING for s in self.steps)

    def to_json(self) -> dict:
        return {"id": self.id, "value": self.value, "src": self.src.to_json(), "dst": self.dst.to_json(),
                "steps": [[s.kind, s.axis, s.dim, s.src_dim] for s in self.steps],
                "step_seconds": list(self.step_seconds), "step_bytes": list(self.step_bytes),
                "phase": self.phase, "consumers": list(self.consumers), "wire_dtype": self.wire_dtype}

    @staticmethod
    def from_json(d: dict) -> Redistribution:
        return Redistribution(d["id"], d["value"], Spec.from_json(d["src"]), Spec.from_json(d["dst"]),
                              tuple(Step(*s) for s in d["steps"]), tuple(d["step_seconds"]),
                              tuple(d["step_bytes"]), d["phase"], tuple(d["consumers"]), d.get("wire_dtype"))


@dataclass(frozen=True)
class Predicted:
    step_time_s: float
    compute_s: float
    communication_s: float  # exposed: not hidden under backward compute
    memory_bytes: dict  # per device, by category, at the peak (autopar.lowering.memory.CATEGORIES)
    sharded_flops_fraction: float = 0.0  # share of the step's FLOPs split (not repeated) over some mesh axis
    total_flops: float = 0.0  # FLOPs of one training step of the whole model (forward and backward)
    hidden_communication_s: float = 0.0  # gradient syncs and prefetched gathers that run under compute
    memory_timeline: tuple = ()  # (variable, bytes live after the statement defining it), in program order
    recompute_s: float = 0.0  # forward ops and collectives run again in backward (counted in compute_s)
    bubble_s: float = 0.0  # a pipeline's idle time on its busiest rank (bubbles and P2P waits)

    @property
    def peak_memory_bytes(self) -> float:
        return sum(self.memory_bytes.values())
