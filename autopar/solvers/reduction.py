"""Exact shrinking of a sharding problem before the integer program is built.

Three steps, none of which can change the optimum:

1. forbidden strategies (infinite node cost: the loss's non-replicated layouts, pins) go;
2. dominated strategies go: ``t`` dominates ``s`` at a node when it costs no more there, no
   more on every edge against every choice of the neighbour, hides no more and is covered no
   less (overlap), and holds no more memory. Swapping ``s`` for ``t`` in any solution never
   costs more whatever the other nodes choose, so removing every dominated strategy at once is
   safe. Of identical strategies (duplicates) the first stays;
3. an edge to a node left with one strategy becomes node costs of the other end (two such ends:
   a constant), so the program needs no marginal variables for it.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ReducedProblem:
    keep: list  # per node, the original indices of the strategies left, in order
    node_costs: list
    edges: list
    overlap: object  # autopar.solvers.sharding.Overlap over the kept indices, or None
    memory: object  # autopar.solvers.sharding.MemoryLimit over the kept indices, or None
    constant: float  # cost of edges between nodes that have one strategy each
    replaced_by: list  # per node: original index -> the kept original index at least as good

    def expand(self, choice: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.keep[i][k] for i, k in enumerate(choice))

    def reduce_choice(self, original: Sequence[int]) -> list[int] | None:
        """A warm start in reduced indices (a removed strategy maps to one that is no worse);
        None where it took a forbidden strategy."""
        out = []
        for i, k in enumerate(original):
            kept = self.replaced_by[i].get(k)
            if kept is None:
                return None
            out.append(self.keep[i].index(kept))
        return out

    @property
    def n_removed(self) -> int:
        return sum(len(r) for r in self.replaced_by) - sum(len(k) for k in self.keep)


def reduce_problem(node_costs, edges, overlap=None, memory=None) -> ReducedProblem:
    n = len(node_costs)
    allowed = [[k for k, c in enumerate(costs) if not math.isinf(c)] or list(range(len(costs)))
               for costs in node_costs]
    keep, replaced_by = _undominated(allowed, node_costs, edges, overlap, memory)

    def sub(m, i, j):
        return [[m[a][b] for b in keep[j]] for a in keep[i]]

    costs = [[node_costs[i][k] for k in keep[i]] for i in range(n)]
    reduced_edges, constant = [], 0.0
    for i, j, m in edges:
        small = sub(m, i, j)
        if len(keep[i]) == 1 and len(keep[j]) == 1:
            constant += small[0][0]
        elif len(keep[j]) == 1:
            costs[i] = [c + row[0] for c, row in zip(costs[i], small)]
        elif len(keep[i]) == 1:
            costs[j] = [c + v for c, v in zip(costs[j], small[0])]
        else:
            reduced_edges.append((i, j, small))
    new_overlap = None if overlap is None else dataclasses.replace(
        overlap, edges=[(i, j, sub(m, i, j)) for i, j, m in overlap.edges],
        cover=[[overlap.cover[i][k] for k in keep[i]] for i in range(n)])
    new_memory = None if memory is None else dataclasses.replace(
        memory, bytes=[[memory.bytes[i][k] for k in keep[i]] for i in range(n)])
    return ReducedProblem(keep, costs, reduced_edges, new_overlap, new_memory, constant, replaced_by)


def _undominated(allowed, node_costs, edges, overlap, memory):
    """Per node, the allowed strategies no other allowed strategy dominates, and where each
    allowed one maps (itself, or a kept strategy that dominates it)."""
    n = len(node_costs)
    columns: list[list[np.ndarray]] = [[] for _ in range(n)]  # per node: (strategies x entries) blocks

    def add(i, j, m, sign=1.0):
        block = np.array(m, dtype=float)[np.ix_(allowed[i], allowed[j])]
        columns[i].append(sign * block)
        columns[j].append(sign * block.T)

    for i, j, m in edges:
        add(i, j, m)
    if overlap is not None:
        for i, j, m in overlap.edges:
            add(i, j, m)
    keep, replaced_by = [], []
    for i in range(n):
        parts = [np.array([[node_costs[i][k]] for k in allowed[i]], dtype=float)] + columns[i]
        if overlap is not None:
            parts.append(-np.array([[overlap.cover[i][k]] for k in allowed[i]], dtype=float))
        if memory is not None:
            parts.append(np.array([[memory.bytes[i][k]] for k in allowed[i]], dtype=float))
        vectors = np.concatenate(parts, axis=1)
        no_worse = (vectors[:, None, :] <= vectors[None, :, :]).all(axis=2)  # [t, s]: t no worse than s
        order = np.arange(len(vectors))
        # t beats s when no worse and (strictly better somewhere, or equal and earlier)
        beats = no_worse & (~no_worse.T | (order[:, None] < order[None, :]))
        np.fill_diagonal(beats, False)
        kept_local = [s for s in range(len(vectors)) if not beats[:, s].any()]
        mapping = {}
        for s in range(len(vectors)):
            t = s if s in kept_local else next(t for t in kept_local if no_worse[t, s])
            mapping[allowed[i][s]] = allowed[i][t]
        keep.append([allowed[i][s] for s in kept_local])
        replaced_by.append(mapping)
    return keep, replaced_by
