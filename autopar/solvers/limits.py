"""How much one solve may do: a deterministic work limit, and wall-clock time as a safety net.

A solve stopped by time returns what it found by then, which depends on the machine's speed
and load: the same model once gave a different plan on a loaded machine. A solve stopped by
work returns the same answer on any machine under any load, so the work limit is the one meant
to bind, and the time limit only catches a solve that would run far longer than its work says.

Work is counted in simplex iterations of HiGHS's LP (deterministic: its count, not its time),
plus, per LP re-solve and per SCIP node, one unit per ``VARIABLES_PER_RESOLVE`` and per
``VARIABLES_PER_NODE`` variables of the program: their fixed cost grows with its size (on the
70B shape's 209k-variable LP, 18.5k iterations took 9.3 s and a re-solve of a few hundred
iterations 0.2-0.9 s on 2 cores), so a unit costs roughly the same time on small and large
programs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from autopar.ir.request import DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT

VARIABLES_PER_RESOLVE = 1_000
VARIABLES_PER_NODE = 100
# CP-SAT's deterministic time (its own unit, about a second of one core) per work unit
CPSAT_DETERMINISTIC_PER_WORK = 1e-4


@dataclass(frozen=True)
class SolveLimits:
    work: int = DEFAULT_WORK_LIMIT
    seconds: float = DEFAULT_TIME_LIMIT_S

    @classmethod
    def of(cls, request) -> SolveLimits:
        """The limits a PlanRequest asks for."""
        return cls(request.solver_work_limit, request.solver_time_limit_s)

    def outlasted(self, elapsed_s: float) -> bool:
        """Whether a solve that ran ``elapsed_s`` and did not finish was stopped by the clock (the
        solvers say "feasible" for either limit)."""
        return elapsed_s >= 0.99 * self.seconds


DEFAULT_LIMITS = SolveLimits()


def resolve_work(n_variables: int) -> int:
    """The work one LP re-solve of ``n_variables`` counts beside its iterations."""
    return max(1, n_variables // VARIABLES_PER_RESOLVE)


def node_work(n_variables: int) -> int:
    """The work one SCIP node of a program of ``n_variables`` counts."""
    return max(1, n_variables // VARIABLES_PER_NODE)


class Budget:
    """One solve's spending against its limits: work spent is counted by the caller (``charge``),
    time by the clock; ``timed_out`` records that the safety net, not the work limit, stopped
    some part of it."""

    def __init__(self, limits: SolveLimits):
        self.limits = limits
        self.spent = 0
        self.deadline = time.perf_counter() + limits.seconds
        self.timed_out = False

    def charge(self, part) -> None:
        """Count a finished part of the solve: anything with ``work`` (default 0) and ``timed_out``."""
        self.spent += getattr(part, "work", 0)
        self.timed_out |= part.timed_out

    def work_left(self) -> int:
        return max(0, self.limits.work - self.spent)

    def seconds_left(self) -> float:
        return max(1e-3, self.deadline - time.perf_counter())

    def left(self) -> SolveLimits:
        """What a part of the solve started now may do."""
        return SolveLimits(self.work_left(), self.seconds_left())

    def exhausted(self) -> bool:
        if time.perf_counter() >= self.deadline:
            self.timed_out = True
        return self.timed_out or self.spent >= self.limits.work

    def stopped_by(self) -> str:
        """What a stop that came from the limits came from: "time" (the safety net) or "work"."""
        return "time" if self.timed_out else "work"
