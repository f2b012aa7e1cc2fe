"""Sharding options and strategies: what one op may do on a mesh."""
from __future__ import annotations

from dataclasses import dataclass

from autopar.ir.placement import Placement, Spec


@dataclass(frozen=True)
class Option:
    """One op's layout on ONE mesh axis: a placement per tensor input and per output."""

    inputs: tuple[Placement, ...]
    outputs: tuple[Placement, ...]


@dataclass(frozen=True)
class Strategy:
    """One op's layout on the whole mesh, with its price.

    ``compute_s`` is the local compute time; resharding between ops is priced
    on the edges by the solver, not here.
    """

    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    compute_s: float = 0.0
