"""The pass pipeline, and where users' passes go in it.

    autopar.register_pass(HeadsOnTP(), before="cluster_layers")   # every later plan
    autopar.plan(model, inputs, mesh=..., passes=[HeadsOnTP()])    # this plan only

A user's pass goes before ``cluster_layers`` unless it says otherwise (``before`` or
``after`` given here, or set on the pass): there it sees every node's strategies and
can add solver constraints (``ctx.constraints``) that clustering and the solve obey.
"""
from __future__ import annotations

from collections.abc import Iterable

from autopar.errors import AutoparError
from autopar.passes.base import Pass
from autopar.passes.cluster_layers import ClusterLayersPass
from autopar.passes.collectives import CollectivesPass
from autopar.passes.predict import PredictPass
from autopar.passes.recompute import RecomputePass
from autopar.passes.shapes import ShapesPass
from autopar.passes.solve_sharding import SolveShardingPass
from autopar.passes.strategies import StrategiesPass

DEFAULT_POSITION = {"before": "cluster_layers"}

_registered: list[tuple[Pass, dict]] = []


def default_passes() -> list[Pass]:
    return [ShapesPass(), StrategiesPass(), ClusterLayersPass(), SolveShardingPass(), CollectivesPass(),
            RecomputePass(), PredictPass()]


def register_pass(pass_: Pass, *, before: str | None = None, after: str | None = None) -> Pass:
    """Run ``pass_`` in every later plan, before or after the pass of that name."""
    _check_is_pass(pass_)
    _registered.append((pass_, _position(pass_, before, after)))
    return pass_


def unregister_pass(pass_or_name) -> None:
    """Stop running a registered pass (the pass itself or its name)."""
    before = len(_registered)
    _registered[:] = [(p, where) for p, where in _registered if p is not pass_or_name and p.name != pass_or_name]
    if len(_registered) == before:
        raise AutoparError(f"no registered pass {getattr(pass_or_name, 'name', pass_or_name)!r}; registered: "
                           f"{[p.name for p, _ in _registered] or 'none'}")


def registered_passes() -> list[Pass]:
    return [p for p, _ in _registered]


def pipeline(extra: Iterable[Pass] = ()) -> list[Pass]:
    """The default passes with the registered ones and ``extra`` (a plan's ``passes=``) in place."""
    passes = default_passes()
    for pass_ in extra:
        _check_is_pass(pass_)
    for pass_, where in _registered + [(p, _position(p, None, None)) for p in extra]:
        passes.insert(_index(passes, pass_, where), pass_)
    return passes


def _position(pass_: Pass, before: str | None, after: str | None) -> dict:
    before = before or getattr(pass_, "before", None)
    after = after or getattr(pass_, "after", None)
    if before and after:
        raise AutoparError(f"pass {pass_.name!r}: give before or after, not both")
    return {"before": before} if before else {"after": after} if after else DEFAULT_POSITION


def _index(passes: list[Pass], pass_: Pass, where: dict) -> int:
    (side, name), = where.items()
    names = [p.name for p in passes]
    if name not in names:
        raise AutoparError(f"cannot place pass {pass_.name!r} {side} {name!r}: no such pass; the passes are "
                           f"{', '.join(names)}")
    return names.index(name) + (side == "after")


def _check_is_pass(pass_) -> None:
    if not isinstance(pass_, Pass):
        raise AutoparError(f"a pass is an autopar.Pass instance with a name and run(program, ctx), got "
                           f"{type(pass_).__name__}")
