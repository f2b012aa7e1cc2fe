"""The lines an offloading plan's programs run between statements: each chunk's fetch and
eviction where the plan placed them (autopar.ir.offload), and each offloaded parameter bound to
its chunk's device copy right before a statement reads it (and unbound when the chunk leaves,
so no name keeps a dropped copy alive); and their gradients moved to host memory as soon as they
are final (autopar.lowering.offload)."""
from __future__ import annotations

from autopar.backends.printer import shape_text
from autopar.ir.offload import EVICT
from autopar.lowering.offload import gradients_to_host
from autopar.units import human_bytes


class ChunkMoves:
    def __init__(self, plan, statements):
        """``plan``: with readable names (autopar.lowering.naming.readable); ``statements``: its
        forward's and backward's."""
        offload = plan.offload
        self.plan = plan
        self.by_at: dict[int, list] = {}
        for m in offload.moves:
            self.by_at.setdefault(m.at, []).append(m)
        placeholder = {fqn: ph for ph, fqn in plan.graph.params.items()}
        self.name_of = {placeholder[fqn]: fqn for fqn in offload.params}  # placeholder -> parameter
        self.members = {c.index: [placeholder[fqn] for fqn in c.params] for c in offload.chunks}
        self.chunk_of = {var: k for k, members in self.members.items() for var in members}
        self.chunks = {c.index: c for c in offload.chunks}
        self.bound: set[str] = set()
        self.to_host = gradients_to_host(statements, plan.graph, set(offload.params))

    @property
    def placeholders(self) -> set[str]:
        """The offloaded parameters' placeholders, which the programs do not take as arguments."""
        return set(self.name_of)

    def begin(self, forward: bool) -> list[str]:
        self.bound = set()
        return ["chunks.begin_step()  # no chunk on the device: the optimizer stepped the host copies"] if forward \
            else []

    def before(self, index: int, statement, last: bool = False) -> list[str]:
        """The moves planned before statement ``index`` (and, for the program's ``last``
        statement, every one planned after it), then the bindings the statement reads."""
        moves = list(self.by_at.get(index, ()))
        if last:
            moves += [m for at, ms in self.by_at.items() if at > index for m in ms]
        lines = []
        for m in sorted(moves, key=lambda m: m.kind != EVICT):  # a slot frees before it fills
            lines += self._evict(m.chunk) if m.kind == EVICT else [self._fetch(m.chunk)]
        for var in dict.fromkeys(statement.uses):
            if var in self.name_of and var not in self.bound:
                self.bound.add(var)
                meta = self.plan.graph.node(var).outputs[0]
                local = self.plan.strategies[var].out_specs[0].local_shape(meta.shape, self.plan.mesh)
                lines.append(f"{var} = chunks.param({self.name_of[var]!r}, {list(local)})  "
                             f"# local {shape_text(local)}, on the device while chunk {self.chunk_of[var]} is")
        return lines

    def after(self, statement) -> list[str]:
        """A final gradient of an offloaded parameter, to host memory."""
        var = statement.defines
        if var not in self.to_host:
            return []
        return [f"{var} = chunks.to_host({var})  # {self.to_host[var]}'s gradient, final: to host memory"]

    def _fetch(self, chunk: int) -> str:
        c = self.chunks[chunk]
        return f"chunks.fetch({chunk})  # host -> device, {human_bytes(c.nbytes)}: {', '.join(c.params)}"

    def _evict(self, chunk: int) -> list[str]:
        held = [v for v in self.members[chunk] if v in self.bound]
        self.bound -= set(held)
        return ([f"del {', '.join(held)}"] if held else []) + [f"chunks.evict({chunk})"]
