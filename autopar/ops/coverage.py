"""Which ATen ops the rule table covers: every Core ATen overload has a sharding rule, a
replicated-only rule that says why, or a reason it needs none."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from autopar.ops.elementwise import is_tagged_pointwise
from autopar.ops.kinds import ReplicateOnly
from autopar.ops.table import rule_for

# Core ATen overloads no graph that autopar plans contains, and why
NEEDS_NO_RULE = {
    "aten.atan2.out": "an out= variant: captured graphs are functional and call atan2.default",
    "aten.resize_.default": "resizes a tensor in place: captured graphs are functional",
    "aten.sym_size.int": "a size query of a symbolic shape, not a tensor op",
    "aten.sym_numel.default": "a size query of a symbolic shape, not a tensor op",
    "aten.sym_stride.int": "a size query of a symbolic shape, not a tensor op",
    "aten.sym_storage_offset.default": "a size query of a symbolic shape, not a tensor op",
    "aten.sym_is_contiguous.default": "a size query of a symbolic shape, not a tensor op",
}


@dataclass(frozen=True)
class Coverage:
    ops: tuple[str, ...]  # the overloads looked at
    sharded: tuple[str, ...]  # with a rule that offers layouts other than replication
    replicated: dict  # op -> why its only layout is replicated (ReplicateOnly's reason)
    unneeded: dict  # op -> why it needs no rule
    missing: tuple[str, ...]  # none of the above: replicated by the fallback

    def __str__(self) -> str:
        lines = [f"core aten ops with a rule: {len(self.sharded)}/{len(self.ops)}"]
        lines += [f"  replicated, {why}: {op}" for op, why in sorted(self.replicated.items())]
        lines += [f"  no rule needed, {why}: {op}" for op, why in sorted(self.unneeded.items())]
        lines += [f"  NO RULE: {op}" for op in self.missing]
        return "\n".join(lines)


def op_name(op) -> str:
    return str(op).replace("aten::", "aten.")


@functools.cache
def aten_overloads() -> tuple:
    """Every overload of torch.ops.aten the dispatcher has registered (``dir(torch.ops.aten)``
    lists only the packets Python has loaded so far)."""
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        packet, _, overload = name.removeprefix("aten::").partition(".")
        try:
            found.append(getattr(getattr(torch.ops.aten, packet), overload or "default"))
        except (AttributeError, RuntimeError):  # an op the Python bindings do not expose
            continue
    return tuple(found)


def core_aten_ops() -> list:
    """The overloads PyTorch tags Core ATen (``torch.Tag.core``)."""
    return sorted((op for op in aten_overloads() if torch.Tag.core in op.tags), key=op_name)


def tagged_pointwise_ops() -> list:
    """The overloads that take the pointwise rule from their tag alone."""
    return sorted((op for op in aten_overloads() if is_tagged_pointwise(op)), key=op_name)


def coverage(ops=None) -> Coverage:
    """How the table covers ``ops`` (default: Core ATen)."""
    ops = core_aten_ops() if ops is None else list(ops)
    sharded, replicated, unneeded, missing = [], {}, {}, []
    for op in ops:
        name, rule = op_name(op), rule_for(op)
        if isinstance(rule, ReplicateOnly):
            replicated[name] = rule.reason
        elif rule is not None:
            sharded.append(name)
        elif name in NEEDS_NO_RULE:
            unneeded[name] = NEEDS_NO_RULE[name]
        else:
            missing.append(name)
    return Coverage(tuple(map(op_name, ops)), tuple(sharded), replicated, unneeded, tuple(missing))
