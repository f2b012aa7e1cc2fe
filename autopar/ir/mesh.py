"""Logical device meshes: named axes with sizes, ranks laid out row-major."""
from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.errors import MeshError


@dataclass(frozen=True)
class Mesh:
    """A logical mesh such as ``Mesh.of(dp=2, tp=2)``.

    Ranks are numbered row-major: the last axis varies fastest, so on real
    clusters it is the one that stays inside a node.
    """

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]

    def __post_init__(self):
        if len(self.axis_names) != len(self.shape) or not self.shape:
            raise MeshError(f"a mesh needs one size per axis name, got {self.axis_names} and {self.shape}")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise MeshError(f"mesh axis names must be distinct, got {self.axis_names}")
        for name, size in zip(self.axis_names, self.shape):
            if not isinstance(size, int) or size < 1:
                raise MeshError(f"mesh axis {name!r} has size {size!r}; sizes must be positive integers")

    @staticmethod
    def of(**axes: int) -> Mesh:
        return Mesh(tuple(axes), tuple(axes.values()))

    @staticmethod
    def parse(spec: Mesh | dict | str) -> Mesh:
        """Accept a Mesh, a dict ``{"dp": 2}``, or a string ``"dp=2,tp=2"``."""
        if isinstance(spec, Mesh):
            return spec
        if isinstance(spec, dict):
            return Mesh.of(**spec)
        if isinstance(spec, str):
            axes = {}
            for part in spec.split(","):
                name, sep, size = part.strip().partition("=")
                if not sep or not size.strip().isdigit():
                    raise MeshError(f"cannot read mesh {spec!r}: write it as 'dp=2,tp=2'")
                if name.strip() in axes:
                    raise MeshError(f"mesh {spec!r} names axis {name.strip()!r} twice")
                axes[name.strip()] = int(size)
            return Mesh.of(**axes)
        raise MeshError(f"cannot read a mesh from {type(spec).__name__}: pass a dict like {{'dp': 2, 'tp': 2}}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def coords(self, rank: int) -> tuple[int, ...]:
        out = []
        for size in reversed(self.shape):
            out.append(rank % size)
            rank //= size
        return tuple(reversed(out))

    def data_axes(self) -> tuple[int, ...]:
        """The axes a batch of per-rank inputs is split over: those named "dp"."""
        return tuple(axis for axis, name in enumerate(self.axis_names) if name == "dp")

    def data_parallel(self, rank: int) -> tuple[int, int]:
        """(this rank's index among the data-parallel blocks, how many blocks): what a
        DistributedSampler takes as ``rank`` and ``num_replicas``."""
        index, size = 0, 1
        coords = self.coords(rank)
        for axis in self.data_axes():
            index, size = index * self.shape[axis] + coords[axis], size * self.shape[axis]
        return index, size

    def check_world_size(self, world_size: int) -> None:
        if world_size != self.size:
            raise MeshError(
                f"mesh {self} has {self.size} devices but the process group has {world_size} ranks; "
                f"launch with --nproc-per-node={self.size} or pick a mesh whose sizes multiply to {world_size}"
            )

    def to_json(self) -> dict:
        return {"axis_names": list(self.axis_names), "shape": list(self.shape)}

    @staticmethod
    def from_json(d: dict) -> Mesh:
        return Mesh(tuple(d["axis_names"]), tuple(d["shape"]))

    def __str__(self) -> str:
        return "(" + ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape)) + ")"
