"""The planning state plan.explain reads (each node's strategies, ties, clusters), rebuilt
for a plan that does not carry it: one loaded from JSON or from the plan cache.

The strategies depend only on the graph, mesh and hardware, so running the passes up to
cluster_layers again reproduces what the solver weighed (not the constraints of a user's
passes, which a saved plan does not record).
"""
from __future__ import annotations

import dataclasses

from autopar.capture import capture
from autopar.constraints import from_options
from autopar.cost_models.hardware import Hardware, get_hardware
from autopar.cost_models.model import CostModel
from autopar.errors import AutoparError, PlanMismatchError
from autopar.graph_ir import to_ir
from autopar.passes.base import PassContext, PassManager
from autopar.passes.cluster_layers import ClusterLayersPass
from autopar.passes.shapes import ShapesPass
from autopar.passes.strategies import StrategiesPass


def state_from_program(plan, program, hardware: Hardware, pin: dict | None = None):
    """(program with the strategy tables, PassContext) for ``plan`` of captured ``program``."""
    program = dataclasses.replace(program, tables={})
    ctx = PassContext(mesh=plan.mesh, cost=CostModel(plan.mesh, hardware), constraints=from_options(pin, None))
    PassManager([ShapesPass(), StrategiesPass(), ClusterLayersPass()]).run(program, ctx)
    return program, ctx


def rebuild_state(plan, model, example_inputs, hardware: "str | Hardware | None" = None):
    try:
        hw = get_hardware(hardware or plan.hardware)
    except AutoparError as exc:
        raise AutoparError(f"{exc}; pass the hardware the plan was made for") from exc
    program, ctx = state_from_program(plan, capture(model, example_inputs), hw)
    fingerprint = to_ir(program).fingerprint()
    if fingerprint != plan.fingerprint:
        raise PlanMismatchError(f"the plan is of graph {plan.fingerprint} but this model and inputs capture "
                                f"graph {fingerprint}: explain a plan with the model and inputs it was made for")
    return program, ctx
