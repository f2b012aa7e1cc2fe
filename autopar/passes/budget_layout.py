"""What the memory-budget search (autopar.passes.budget_search) passes between its steps and
its levers: a layout it solved, with its fit under the budget."""
from __future__ import annotations

from dataclasses import dataclass

from autopar.passes.recompute import Fit
from autopar.solvers.sharding import MemoryLimit, SolverResult

HELD, BUDGETED = "held", "budgeted"  # the stand-in rows a MemoryLimit counts (budget_search._memory_rows)
TIME, MEMORY = "time", "memory"  # what a solve minimizes: step time, or bytes (the leanest layout)


@dataclass(frozen=True)
class Layout:
    """A layout the search solved: the solver's result, its fit under the budget (the
    recomputation and offload it needs; None where not fitted yet), and the stand-in limit it
    was solved under."""

    result: SolverResult
    fit: Fit | None = None
    limit: MemoryLimit | None = None

    @property
    def step_s(self) -> float:
        """Its step time with the recomputation (and offload) its fit takes."""
        recompute = self.fit.recompute
        return self.result.objective + recompute.seconds + (recompute.offload.added_s if recompute.offload else 0.0)
