"""Pass, PassContext and the PassManager that checks, times and records passes."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from autopar.constraints import Constraints
from autopar.cost_models.model import CostModel
from autopar.errors import AutoparError
from autopar.mesh import Mesh
from autopar.program import Program


@dataclass(frozen=True)
class PassRecord:
    name: str
    seconds: float
    note: str


@dataclass
class PassContext:
    mesh: Mesh
    cost: CostModel
    options: dict[str, Any] = field(default_factory=dict)
    progress: Optional[Callable[[str], None]] = None
    constraints: Constraints = field(default_factory=Constraints)  # what passes ask of the sharding solve

    def report(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)


class Pass:
    """A pass reads side tables named in ``requires`` and writes those in ``provides``.

    ``run`` returns a one-line note for the plan's history. A user's pass may set
    ``before`` or ``after`` (another pass's name) to say where it runs (autopar.pass_registry).
    """

    name: str = "pass"
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    before: Optional[str] = None
    after: Optional[str] = None

    def run(self, program: Program, ctx: PassContext) -> str:
        raise NotImplementedError


class PassManager:
    def __init__(self, passes: list[Pass]):
        self.passes = list(passes)
        self._check_order()

    def _check_order(self) -> None:
        available: set[str] = set()
        for p in self.passes:
            missing = [r for r in p.requires if r not in available]
            if missing:
                raise AutoparError(
                    f"pass {p.name!r} requires {missing}, which no earlier pass provides; "
                    f"reorder the passes (order: {[q.name for q in self.passes]})"
                )
            available.update(p.provides)

    def run(self, program: Program, ctx: PassContext) -> list[PassRecord]:
        history = []
        for k, p in enumerate(self.passes, 1):
            ctx.report(f"pass {k}/{len(self.passes)} {p.name} ...")
            start = time.perf_counter()
            note = p.run(program, ctx) or ""
            seconds = time.perf_counter() - start
            missing = [t for t in p.provides if t not in program.tables]
            if missing:
                raise AutoparError(f"pass {p.name!r} promised side tables {missing} but did not write them")
            history.append(PassRecord(p.name, seconds, note))
            ctx.report(f"pass {k}/{len(self.passes)} {p.name} done in {seconds:.2f}s {note}")
        return history
