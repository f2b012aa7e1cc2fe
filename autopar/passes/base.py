"""Pass, PassContext and the PassManager that checks, times and records passes."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autopar.cost_models.model import CostModel
from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from autopar.ir.program import Program
from autopar.ir.records import PassRecord
from autopar.ir.request import PlanRequest
from autopar.passes.constraints import Constraints

# The side tables of the built-in passes: name -> (the type of its value, what it holds). Each
# pass module registers the tables it provides; the PassManager checks every write against it.
SIDE_TABLES: dict[str, tuple[type, str]] = {}


def side_table(name: str, kind: type, holds: str) -> None:
    SIDE_TABLES[name] = (kind, holds)


@dataclass
class PassContext:
    """What a pass reads besides the program: the request (for one mesh), the cost model built
    from it, the constraints that passes add for the sharding solve, and a progress sink."""

    request: PlanRequest
    progress: Callable[[str], None] | None = None
    constraints: Constraints = field(default_factory=Constraints)
    cost: CostModel = field(init=False)

    def __post_init__(self):
        if len(self.request.meshes) != 1:
            raise ValueError(f"a pass context plans one mesh, not {len(self.request.meshes)}: use request.on(mesh)")
        self.cost = CostModel(self.mesh, self.request.hardware, moe_imbalance=self.request.moe_imbalance)

    @property
    def mesh(self) -> Mesh:
        return self.request.meshes[0]

    def report(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)


class Pass:
    """A pass reads side tables named in ``requires`` and writes those in ``provides`` (the
    PassManager refuses a read of any other table while the pass runs).

    ``run`` returns a one-line note for the plan's history. A user's pass may set
    ``before`` or ``after`` (another pass's name) to say where it runs (autopar.passes.registry).
    """

    name: str = "pass"
    requires: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()  # tables it reads when an earlier pass wrote them
    before: str | None = None
    after: str | None = None

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
            program.readable = frozenset(p.requires + p.provides + p.optional)
            try:
                note = p.run(program, ctx) or ""
            finally:
                program.readable = None
            seconds = time.perf_counter() - start
            _check_written(p, program)
            history.append(PassRecord(p.name, seconds, note))
            ctx.report(f"pass {k}/{len(self.passes)} {p.name} done in {seconds:.2f}s {note}")
        return history


def _check_written(p: Pass, program: Program) -> None:
    """Every table ``p`` provides is written, as the type its registration names."""
    missing = [t for t in p.provides if t not in program.tables]
    if missing:
        raise AutoparError(f"pass {p.name!r} promised side tables {missing} but did not write them")
    for name in p.provides:
        kind, holds = SIDE_TABLES.get(name, (object, ""))
        if not isinstance(program.tables[name], kind):
            raise AutoparError(f"pass {p.name!r} wrote side table {name!r} as a {type(program.tables[name]).__name__}; "
                               f"it holds {holds}, as a {kind.__name__}")
