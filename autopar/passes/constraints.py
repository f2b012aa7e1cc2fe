"""Constraints on the sharding solve, which passes (autopar's and users') add before it runs.

A pass reaches them as ``ctx.constraints``:

    ctx.constraints.pin("blocks.*.attn.q", "S(0)")      # a parameter, a module's parameters, or a node
    ctx.constraints.forbid(lambda node, strategy: ...)    # True rules that strategy of that node out
    ctx.constraints.forbid_collective("dp", kinds=("all_gather",))
    ctx.constraints.cap_memory("40GiB")
    ctx.constraints.keep(["add_7", ...])                  # forward values never recomputed

Node constraints become forbidden strategies (``allowed``); layer clustering only ties
layers whose constraints agree, so a constraint on one layer never leaks onto another.
A forbidden collective forbids every pair of layouts whose move needs it on that axis.
"""
from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from torch import fx

from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Spec
from autopar.ir.program import Program
from autopar.ir.redistribute import COMMUNICATING, plan_steps
from autopar.ir.strategy import Strategy
from autopar.units import parse_bytes


@dataclass
class Constraints:
    pins: list[tuple[str, object]] = field(default_factory=list)  # (target, placement text or Spec)
    forbidden: list[Callable[[fx.Node, Strategy], bool]] = field(default_factory=list)
    forbidden_collectives: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (axis, kinds)
    memory_cap: float | None = None
    kept: set[str] = field(default_factory=set)  # forward values recomputation must keep

    # ---- what passes call ------------------------------------------------------------
    def pin(self, target: str, placement) -> None:
        """Fix the output layout of ``target``: a parameter or buffer FQN, a module path (each
        parameter in it), a node name, or a glob of them ("layers.*.attn.q"). ``placement`` is one
        placement per mesh axis ("S(0),R") or a Spec."""
        self.pins.append((target, placement))

    def forbid(self, predicate: Callable[[fx.Node, Strategy], bool]) -> None:
        """``predicate(node, strategy)`` True rules that strategy of that node out."""
        self.forbidden.append(predicate)

    def forbid_collective(self, axis: str, kinds: tuple[str, ...] = COMMUNICATING) -> None:
        """No collective of ``kinds`` on mesh axis ``axis`` (e.g. no all_gather on dp: no ZeRO-3)."""
        unknown = [k for k in kinds if k not in COMMUNICATING]
        if unknown:
            raise AutoparError(f"cannot forbid collective {unknown}: the kinds are {', '.join(COMMUNICATING)}")
        self.forbidden_collectives.append((axis, tuple(kinds)))

    def cap_memory(self, budget: str | float) -> None:
        """Per-device memory at most ``budget`` (bytes or text such as "40GiB")."""
        cap = parse_bytes(budget)
        self.memory_cap = cap if self.memory_cap is None else min(self.memory_cap, cap)

    def keep(self, names) -> None:
        """Never recompute these forward values (node names): backward reads them as forward left them."""
        self.kept.update(names)

    # ---- what autopar's passes read ----------------------------------------------------
    def allowed(self, program: Program, strategies: dict, mesh: Mesh) -> dict[str, tuple[bool, ...]]:
        """Node -> which of its strategies the constraints allow, for the nodes they restrict."""
        out: dict[str, tuple[bool, ...]] = {}

        def restrict(name: str, keep: list[bool]) -> None:
            previous = out.get(name, (True,) * len(keep))
            out[name] = tuple(a and b for a, b in zip(previous, keep))

        for target, placement in self.pins:
            for name in _pin_targets(program, strategies, target):
                spec = _spec(target, placement, strategies[name], mesh)
                restrict(name, [s.out_specs[0] == spec for s in strategies[name]])
        if self.forbidden:
            for node in program.nodes():
                if node.name in strategies:
                    keep = [not any(p(node, s) for p in self.forbidden) for s in strategies[node.name]]
                    if not all(keep):
                        restrict(node.name, keep)
        for name, keep in out.items():
            if not any(keep):
                raise AutoparError(f"the constraints rule out every layout of {name!r} (its layouts: "
                                   f"{', '.join(str(s.out_specs[0]) for s in strategies[name])}); relax a pin "
                                   f"or a forbid that applies to it")
        return out

    def move_checker(self, mesh: Mesh) -> Callable[[Spec, Spec], bool] | None:
        """A function (src, dst) -> True when moving src to dst needs a forbidden collective,
        or None when no collective is forbidden."""
        if not self.forbidden_collectives:
            return None
        rules = []
        for axis, kinds in self.forbidden_collectives:
            if axis not in mesh.axis_names:
                raise AutoparError(f"cannot forbid collectives on axis {axis!r}: the mesh {mesh} has axes "
                                   f"{', '.join(mesh.axis_names)}")
            rules.append((mesh.axis_names.index(axis), kinds))

        @cache
        def forbidden(src: Spec, dst: Spec) -> bool:
            return any(step.axis == axis and step.kind in kinds for step in plan_steps(src, dst)
                       for axis, kinds in rules)

        return forbidden


def from_options(pin: dict | None, restrict: Callable | None) -> Constraints:
    """The constraints of plan()'s ``pin`` and ``restrict`` arguments."""
    constraints = Constraints()
    for fqn, placement in (pin or {}).items():
        constraints.pin(fqn, placement)
    if restrict is not None:
        constraints.forbid(lambda node, strategy: not restrict(node, strategy))
    return constraints


def _pin_targets(program: Program, strategies: dict, target: str) -> list[str]:
    by_fqn = {fqn: ph for ph, fqn in program.params.items()}
    buffer = {fqn: ph for ph, fqn in program.buffers.items()}.get(target)
    if buffer is not None:
        return [buffer]
    if target in by_fqn:
        return [by_fqn[target]]
    if target in strategies:
        return [target]
    found = [ph for fqn, ph in by_fqn.items()
             if fnmatch.fnmatchcase(fqn, target) or fnmatch.fnmatchcase(fqn.rpartition(".")[0], target)
             or fqn.startswith(target + ".")]
    if not found:
        raise AutoparError(f"cannot pin {target!r}: it names no parameter, module or node of the model (its "
                           f"parameters are e.g. {', '.join(sorted(by_fqn)[:4])})")
    return found


def _spec(target: str, placement, options: list[Strategy], mesh: Mesh) -> Spec:
    try:
        spec = placement if isinstance(placement, Spec) else \
            Spec.from_json(placement) if isinstance(placement, str) else Spec(tuple(placement))
    except ValueError as exc:
        raise AutoparError(f"cannot pin {target!r}: {exc}") from exc
    layouts = [s.out_specs[0] for s in options]
    if len(spec.placements) != mesh.ndim or spec not in layouts:
        raise AutoparError(f"cannot pin {target!r} to {placement!r} on mesh {mesh}: its layouts are "
                           f"{', '.join(o.to_json() for o in layouts)} (one placement per mesh axis)")
    return spec
