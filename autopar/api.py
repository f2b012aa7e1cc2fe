"""autopar.plan: capture, run the passes, and package the result as a Plan."""
from __future__ import annotations

import sys
import warnings
from typing import Callable, Optional

from torch import nn

from autopar.capture import capture, program_inputs
from autopar.cost_models.hardware import Hardware, get_hardware
from autopar.cost_models.model import CostModel
from autopar.graph_ir import to_ir
from autopar.mesh import Mesh
from autopar.module_paths import module_paths
from autopar.passes.base import Pass, PassContext, PassManager
from autopar.passes.collectives import CollectivesPass
from autopar.passes.cost_formula import CostFormulaPass, SymbolicShapesPass
from autopar.passes.memory import optimizer_bytes_per_element
from autopar.passes.predict import PredictPass
from autopar.passes.recompute import RecomputePass, check_mode
from autopar.passes.shapes import ShapesPass
from autopar.passes.solve_sharding import SolveShardingPass
from autopar.passes.strategies import StrategiesPass
from autopar.plan import Plan, SolverStats
from autopar.symbolic_shapes import size_symbols
from autopar.units import parse_bytes


def default_passes() -> list[Pass]:
    return [ShapesPass(), StrategiesPass(), SolveShardingPass(), CollectivesPass(), RecomputePass(), PredictPass()]


def plan(model: nn.Module, example_inputs, *, mesh, hardware: "str | Hardware" = "h100-sxm",
         solver: str = "mip", solver_time_limit_s: float = 60.0, pin: Optional[dict] = None,
         memory_budget: "str | float | None" = None, optimizer: str = "adam", recompute: str = "auto",
         symbolic_dims: Optional[dict[str, int]] = None, progress: Optional[Callable[[str], None]] = None,
         verbose: bool = False) -> Plan:
    """Plan ``model`` (its ``forward(*example_inputs)`` returns the loss) over ``mesh``.

    Runs in one process on fake tensors: no process group and no real memory, so
    models built on the meta device plan too. ``solver`` is "mip" (SCIP) or "cp-sat".
    ``pin`` fixes parameter layouts, e.g. ``{"fc1.weight": "S(0),R"}`` (one placement per
    mesh axis); the solver lays out everything else around them.
    ``symbolic_dims`` names input sizes, e.g. ``{"batch": 0, "seq": 1}`` (the dim index in
    every tensor input that has it); the plan then carries its cost as a formula of them
    (``plan.cost_formula()``, ``plan.evaluate(batch=..., seq=...)``), at the price of
    capturing the step again at other sizes.
    ``memory_budget`` (bytes, or text such as "60GiB"; default 90% of the device's memory)
    bounds the predicted per-device peak, which counts ``optimizer`` state ("sgd", "adam",
    "adam-mixed"); a budget no plan meets is an AutoparError naming the smallest peak found.
    ``recompute``: "auto" recomputes forward values in backward only when the budget needs it,
    choosing what adds the least time; "full" recomputes for the least memory; "none" never.
    """
    mesh = Mesh.parse(mesh)
    hw = get_hardware(hardware)
    if progress is None and verbose:
        progress = lambda msg: print(f"[autopar] {msg}", file=sys.stderr)  # noqa: E731
    ctx = PassContext(mesh=mesh, cost=CostModel(mesh, hw),
                      options={"solver": solver, "solver_time_limit_s": solver_time_limit_s,
                               "pin": dict(pin or {}), "memory_budget": parse_bytes(memory_budget),
                               "optimizer": optimizer, "recompute": check_mode(recompute)}, progress=progress)
    optimizer_bytes_per_element(optimizer, 4)  # an unknown optimizer fails here, before any work
    ctx.report("capturing the training step ...")
    program = capture(model, example_inputs)
    passes = default_passes()
    if symbolic_dims is not None:
        sizes = size_symbols(program_inputs(example_inputs), symbolic_dims)
        passes += [SymbolicShapesPass(model, program_inputs(example_inputs), sizes), CostFormulaPass(sizes)]
    history = PassManager(passes).run(program, ctx)
    result = program.table("solver")
    if result.status != "optimal":
        warnings.warn(f"the sharding solver stopped at its {solver_time_limit_s:.0f} s limit; the plan is "
                      f"within {result.gap:.1%} of optimal (raise solver_time_limit_s to close the gap)",
                      stacklevel=2)
    fallback = program.table("fallback")
    return Plan(
        mesh=mesh,
        hardware=hw.name,
        graph=to_ir(program),
        strategies=dict(program.table("choice")),
        redistributions=tuple(program.table("redistributions")),
        predicted=program.table("predicted"),
        recompute=program.table("recompute").variables,
        fallback_nodes=dict(fallback),
        fallback_modules={n: p for n, p in module_paths(program).items() if n in fallback} if fallback else {},
        solver=SolverStats(result.backend, result.status, result.objective, result.bound, result.gap,
                           result.seconds, result.n_variables),
        history=tuple(history),
        formula=program.tables.get("cost_formula"),
    )
