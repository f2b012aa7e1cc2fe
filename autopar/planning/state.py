"""The planning state plan.explain reads (each node's strategies, ties, clusters): kept beside
a plan just made (outside the Plan, which is pure data), or rebuilt for a plan that has none:
one loaded from JSON or from the plan cache.

The strategies depend only on the graph, mesh and hardware, so running the passes up to
cluster_layers again reproduces what the solver weighed (not the constraints of a user's
passes, which a saved plan does not record).
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable

from autopar.capture.export import capture
from autopar.errors import AutoparError, PlanMismatchError
from autopar.ir.graph import to_ir
from autopar.ir.hardware import Hardware
from autopar.ir.request import PlanRequest
from autopar.passes.base import PassContext, PassManager
from autopar.passes.cluster_layers import ClusterLayersPass
from autopar.passes.constraints import from_options
from autopar.passes.shapes import ShapesPass
from autopar.passes.strategies import StrategiesPass
from autopar.planning.request import resolve

# id(plan) -> () -> (program, PassContext); an entry goes when its plan is collected
_STATES: dict[int, Callable] = {}


def remember(plan, state: Callable) -> None:
    """Keep ``state()`` (the program with its strategy tables, and the PassContext) for ``plan``."""
    _STATES[id(plan)] = state
    weakref.finalize(plan, _STATES.pop, id(plan), None)


def planning_state(plan, model=None, example_inputs=None, hardware=None):
    """(program, PassContext) for ``plan``: the one kept when it was made, else rebuilt from its model."""
    if id(plan) in _STATES:
        return _STATES[id(plan)]()
    if model is None:
        raise AutoparError("this plan was loaded from JSON and keeps no planning state: "
                           "pass the model and example inputs, plan.explain(target, model, example_inputs)")
    return rebuild_state(plan, model, example_inputs, hardware)


def state_from_program(plan, program, request: PlanRequest):
    """(program with the strategy tables, PassContext) for ``plan`` of captured ``program``."""
    program = dataclasses.replace(program, tables={})
    ctx = PassContext(request.on(plan.mesh), constraints=from_options(request.pins, None))
    PassManager([ShapesPass(), StrategiesPass(), ClusterLayersPass()]).run(program, ctx)
    return program, ctx


def rebuild_state(plan, model, example_inputs, hardware: str | Hardware | None = None):
    try:
        request = resolve(plan.mesh, hardware or plan.hardware)
    except AutoparError as exc:
        raise AutoparError(f"{exc}; pass the hardware the plan was made for") from exc
    program, ctx = state_from_program(plan, capture(model, example_inputs), request)
    fingerprint = to_ir(program).fingerprint()
    if fingerprint != plan.fingerprint:
        raise PlanMismatchError(f"the plan is of graph {plan.fingerprint} but this model and inputs capture "
                                f"graph {fingerprint}: explain a plan with the model and inputs it was made for")
    return program, ctx
