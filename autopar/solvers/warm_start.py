"""A good first solution for the sharding solve, found one mesh axis at a time.

On an N-D mesh each strategy is a tuple of per-axis choices, and the joint
problem has the product of their counts per node (30-45 on a 2-D mesh), which
makes the integer program slow to close. Fixing every axis but one leaves a
problem the size of a 1-D mesh, which solves in seconds; cycling over the axes
(block coordinate descent) from a data-parallel start reaches a good layout
(on Llama-shaped models, within a few percent of the LP bound) that the full
solve then starts from and can only improve. Each step is exact for its axis,
so the objective never rises.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from autopar.errors import SolverError


def axis_signature(strategy, axis: int) -> tuple:
    """What ``strategy`` does on one mesh axis: its inputs' and outputs' placements there."""
    return tuple(spec.placements[axis] for spec in strategy.in_specs + strategy.out_specs)


def descend_axes(solve_restricted: Callable, node_costs: list, options: Sequence[list], ndim: int,
                 start: Sequence[int], report: Callable[[str], None], max_rounds: int = 4):
    """The best solution found by solving one axis at a time from ``start``, as a solver result
    (or None when no restricted problem could be solved): it stops when no axis can improve (each
    was re-solved since the layout last changed, or made that change with a proven optimum), or
    after ``max_rounds`` passes over the axes.

    ``options[g]`` are group g's strategies; ``solve_restricted(costs, hint, step)`` solves the
    problem with these node costs (infinite where a strategy is ruled out) and returns a
    SolverResult; ``step``, (axis, hint), names the restricted problem among those of the same
    ``node_costs`` (a caller may reuse what it solved before).
    """
    per_axis = [[[axis_signature(s, b) for b in range(ndim)] for s in group] for group in options]
    best, current = None, list(start)
    settled: set[int] = set()  # axes whose re-solve cannot change the current layout
    axis = 0
    for _ in range(max_rounds * ndim):
        if len(settled) == ndim:
            break

        def others(g: int, k: int, axis: int = axis) -> list:  # what strategy k of group g does on the fixed axes
            return per_axis[g][k][:axis] + per_axis[g][k][axis + 1:]

        costs = [[c if others(g, k) == others(g, current[g]) else math.inf for k, c in enumerate(node_costs[g])]
                 for g in range(len(node_costs))]
        try:
            result = solve_restricted(costs, current, (axis, tuple(current)))
        except SolverError:
            result = None
        if result is not None and (best is None or result.objective < best.objective - 1e-12):
            best, current = result, list(result.choice)
            # an axis solved to optimality needs no second look until another axis moves
            settled = {axis} if result.status == "optimal" else set()
            report(f"warm start: axis {axis} re-solved, objective {result.objective * 1e3:.4f} ms")
        else:
            settled.add(axis)
        axis = (axis + 1) % ndim
    # each step's bound held for its axis alone: the full problem's is unknown here
    return None if best is None else dataclasses.replace(best, status="feasible", bound=0.0)
