"""A plan's offload: parameters (with their gradients and optimizer state) kept in host memory
in fixed-size chunks, and the moves that bring each chunk to the device for the statements that
read it (PatrickStar, Fang et al. 2021), as pure data with a JSON round trip.

The program's order is fixed at plan time, so the moves are too: ``Move.at`` indexes the step's
statements (forward's, then backward's: autopar.lowering.schedule), and a move runs right before
that statement. A chunk lives on the device from its fetch to its eviction; the host keeps the
master copy, which the optimizer updates (``optimizer`` "host": torch's optimizer over host
tensors) or which is streamed through the device for the update (``optimizer`` "device").
"""
from __future__ import annotations

from dataclasses import dataclass

FETCH, EVICT = "fetch", "evict"
OPTIMIZER_PLACES = ("host", "device")


@dataclass(frozen=True)
class Chunk:
    """Parameters of one dtype packed in the order the program first reads them: each parameter
    (this rank's block of it) is a slice ``[offset, offset + numel)`` of one flat buffer of
    ``capacity`` elements."""
    index: int
    dtype: str
    capacity: int  # elements; every chunk of a plan holds the same bytes
    params: tuple[str, ...]  # parameter names
    offsets: tuple[int, ...]
    numels: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.capacity * self.itemsize

    @property
    def used_bytes(self) -> int:
        return sum(self.numels) * self.itemsize

    def to_json(self) -> dict:
        return {"index": self.index, "dtype": self.dtype, "capacity": self.capacity, "params": list(self.params),
                "offsets": list(self.offsets), "numels": list(self.numels), "itemsize": self.itemsize}

    @staticmethod
    def from_json(d: dict) -> Chunk:
        return Chunk(d["index"], d["dtype"], d["capacity"], tuple(d["params"]), tuple(d["offsets"]),
                     tuple(d["numels"]), d["itemsize"])


@dataclass(frozen=True)
class Move:
    at: int  # the statement (of forward + backward) the move runs before
    kind: str  # FETCH (host -> device) or EVICT (the device copy dropped; the host's is current)
    chunk: int

    def to_json(self) -> list:
        return [self.at, self.kind, self.chunk]


@dataclass(frozen=True)
class OptimizerChoice:
    """Where the offloaded state's optimizer step runs, and what each place was priced at."""
    place: str  # "host" or "device"
    host_s: float  # the gradients' copies down and the host's optimizer over the offloaded elements
    device_s: float  # the gradients' copies down, then per chunk: up, the step on the device, back down
    device_bytes: float = 0.0  # what the device holds during a step there (one chunk's worth at a time)


@dataclass(frozen=True)
class Offload:
    chunks: tuple[Chunk, ...]
    moves: tuple[Move, ...]
    slots: int  # chunks on the device at most
    optimizer: OptimizerChoice
    transfer_s: float  # host-link time of a step's moves (fetches, gradients down)
    exposed_s: float  # of which the device waits for (not hidden under compute)
    device_bytes: tuple[float, ...]  # chunk bytes on the device during each statement
    host_bytes: float  # per device: offloaded parameters, their gradients and optimizer state
    reason: str  # why the planner offloads (for explain)

    @property
    def added_s(self) -> float:
        """What offloading adds to a step: the fetches' waits and the offloaded state's optimizer step."""
        chosen = self.optimizer.host_s if self.optimizer.place == "host" else self.optimizer.device_s
        return self.exposed_s + chosen

    @property
    def chunk_bytes(self) -> int:
        return self.chunks[0].nbytes if self.chunks else 0

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(p for c in self.chunks for p in c.params)

    @property
    def fetches(self) -> int:
        return sum(1 for m in self.moves if m.kind == FETCH)

    def residence(self, chunk: int, statements: int) -> list[tuple[int, int]]:
        """[start, end) statement ranges during which ``chunk`` is on the device."""
        spans, since = [], None
        for m in sorted((m for m in self.moves if m.chunk == chunk), key=lambda m: (m.at, m.kind != EVICT)):
            if m.kind == FETCH and since is None:
                since = m.at
            elif m.kind == EVICT and since is not None:
                spans.append((since, m.at))
                since = None
        if since is not None:
            spans.append((since, statements))
        return spans

    def to_json(self) -> dict:
        return {"chunks": [c.to_json() for c in self.chunks], "moves": [m.to_json() for m in self.moves],
                "slots": self.slots, "optimizer": vars(self.optimizer), "transfer_s": self.transfer_s,
                "exposed_s": self.exposed_s, "device_bytes": list(self.device_bytes), "host_bytes": self.host_bytes,
                "reason": self.reason}

    @staticmethod
    def from_json(d: dict) -> Offload:
        return Offload(tuple(Chunk.from_json(c) for c in d["chunks"]), tuple(Move(*m) for m in d["moves"]),
                       d["slots"], OptimizerChoice(**d["optimizer"]), d["transfer_s"], d["exposed_s"],
                       tuple(d["device_bytes"]), d["host_bytes"], d["reason"])

    def decisions(self) -> dict:
        """What the plan's hash covers: which parameters move, in which chunks, when, and where their step runs."""
        return {"chunks": [[c.dtype, c.capacity, list(c.params)] for c in self.chunks],
                "moves": [m.to_json() for m in self.moves], "optimizer": self.optimizer.place}
