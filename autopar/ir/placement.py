"""Placements in DTensor's words, and sharding specs (one placement per mesh axis)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autopar.ir.mesh import Mesh


@dataclass(frozen=True)
class Shard:
    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial:
    """Each rank holds a summand; the true value is the sum over the axis."""

    reduce_op: str = "sum"

    def __str__(self) -> str:
        return "P"


Placement = Shard | Replicate | Partial
R = Replicate()
P = Partial()


def parse_placement(text: str) -> Placement:
    if text == "R":
        return R
    if text == "P":
        return P
    if text.startswith("S(") and text.endswith(")"):
        return Shard(int(text[2:-1]))
    raise ValueError(f"unknown placement {text!r}; expected R, P or S(dim)")


@dataclass(frozen=True)
class Spec:
    """How one tensor lies on the mesh: a placement per mesh axis.

    Invariant kept by the strategy expander: a tensor dim is sharded on at most
    one mesh axis, so its local size is ``global // axis_size``.
    """

    placements: tuple[Placement, ...]

    # specs key the cost model's caches: hashed once (planning a large model hashes them
    # millions of times), and rebuilt on unpickling since a Partial's hash differs between processes
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.placements))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return Spec, (self.placements,)

    @staticmethod
    def replicated(ndim_mesh: int) -> Spec:
        return Spec((R,) * ndim_mesh)

    def local_shape(self, global_shape: Sequence[int], mesh: Mesh) -> tuple[int, ...]:
        shape = list(global_shape)
        for axis, p in enumerate(self.placements):
            if isinstance(p, Shard):  # even by construction, so a symbolic size divides exactly
                d = shape[p.dim]
                shape[p.dim] = d // mesh.shape[axis] if isinstance(d, int) else d / mesh.shape[axis]
        return tuple(shape)

    def is_replicated(self) -> bool:
        return all(isinstance(p, Replicate) for p in self.placements)

    def has_partial(self) -> bool:
        return any(isinstance(p, Partial) for p in self.placements)

    def sharded_dims(self) -> dict[int, int]:
        """tensor dim -> mesh axis sharding it."""
        return {p.dim: axis for axis, p in enumerate(self.placements) if isinstance(p, Shard)}

    def to_dtensor(self):
        from torch.distributed.tensor import placement_types as pt

        conv = {Shard: lambda p: pt.Shard(p.dim), Replicate: lambda p: pt.Replicate(), Partial: lambda p: pt.Partial()}
        return tuple(conv[type(p)](p) for p in self.placements)

    def to_partition_spec(self, mesh: Mesh, ndim: int):
        """JAX PartitionSpec entries (axis name or None per tensor dim); Partial has no JAX spelling."""
        if self.has_partial():
            raise ValueError(f"{self} holds a partial sum, which a PartitionSpec cannot describe")
        entries: list = [None] * ndim
        for dim, axis in self.sharded_dims().items():
            entries[dim] = mesh.axis_names[axis]
        return tuple(entries)

    def __str__(self) -> str:
        return "(" + ", ".join(str(p) for p in self.placements) + ")"

    def to_json(self) -> str:
        return ",".join(str(p) for p in self.placements)

    @staticmethod
    def from_json(text: str) -> Spec:
        return Spec(tuple(parse_placement(t) for t in text.split(",")))
