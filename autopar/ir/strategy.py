"""Sharding options and strategies: what one op may do on a mesh."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from autopar.ir.mesh import Mesh
from autopar.ir.placement import Partial, Placement, Shard, Spec
from autopar.ir.program import TensorMeta


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


def spec_fits(spec: Spec, meta: TensorMeta | None, mesh: Mesh) -> bool:
    """Whether a tensor of ``meta`` can lie on ``mesh`` as ``spec`` says: each dim split by one
    axis at most, into equal blocks; a partial sum only of floating-point values."""
    if meta is None:
        return spec.is_replicated()
    dims = [p.dim for p in spec.placements if isinstance(p, Shard)]
    if len(dims) != len(set(dims)):
        return False  # one tensor dim split by two axes: not modelled
    for axis, p in enumerate(spec.placements):
        if isinstance(p, Shard):
            if p.dim >= len(meta.shape) or meta.shape[p.dim] % mesh.shape[axis] != 0:
                return False  # never shard unevenly
        elif isinstance(p, Partial) and not meta.is_floating:
            return False
    return True


def combine(options: Sequence[Option], in_metas: Sequence[TensorMeta | None],
            out_metas: Sequence[TensorMeta | None], mesh: Mesh) -> list[tuple[tuple[Spec, ...], tuple[Spec, ...]]]:
    """Every (input specs, output specs) that picks one of an op's 1-D ``options`` per mesh
    axis and fits its tensors, each once, in the order the options give them."""
    found: dict = {}
    for combo in itertools.product(options, repeat=mesh.ndim):
        in_specs = tuple(Spec(tuple(o.inputs[j] for o in combo)) for j in range(len(in_metas)))
        out_specs = tuple(Spec(tuple(o.outputs[j] for o in combo)) for j in range(len(out_metas)))
        if (in_specs, out_specs) in found:
            continue
        if all(spec_fits(s, m, mesh) for s, m in zip(in_specs + out_specs, tuple(in_metas) + tuple(out_metas))):
            found[(in_specs, out_specs)] = None
    return list(found)
