"""solve_sharding: one strategy per node, by the OR-Tools model in ``autopar.solvers.sharding``.

The problem is built as plain arrays (autopar.passes.sharding_problem): variable groups of
tied and clustered nodes, compute and reshard costs, and the constraints that make it a
training step. On an N-D mesh the solve starts from autopar.solvers.warm_start's
axis-by-axis layout, and the memory budget is met by autopar.passes.budget_search, which
tries leaner layouts and recomputation and keeps the fastest that fits.
"""
from __future__ import annotations

from autopar.errors import AutoparError
from autopar.ir.program import Program
from autopar.passes.base import Pass, PassContext, side_table
from autopar.passes.budget_search import BudgetSearch
from autopar.passes.mirror_axes import batch_on_dp_axes
from autopar.passes.recompute import Fit
from autopar.passes.sharding_problem import build_problem
from autopar.solvers.sharding import SolverResult

side_table('choice', dict, 'node -> its chosen Strategy')
side_table('solver', SolverResult, "the sharding solve's outcome (status, objective, bound, gap)")
side_table('fit', Fit, "the chosen layout's memory and the recomputation it needs")


class SolveShardingPass(Pass):
    name = "solve_sharding"
    requires = ("meta", "strategies", "tied_to", "cluster_of", "allowed")
    provides = ("choice", "solver", "fit")

    def run(self, program: Program, ctx: PassContext) -> str:
        allowed = ctx.constraints.allowed(program, program.table("strategies"), ctx.mesh)
        _check_clustering_saw(allowed, program.table("allowed"), program.table("cluster_of"))
        problem = build_problem(program, ctx, allowed)
        search = BudgetSearch(program, problem, ctx)
        picked = search.run()
        result, program.tables["fit"] = picked.result, picked.fit  # the recompute pass takes this fit as decided here
        program.tables["choice"] = batch_on_dp_axes(problem.choice_of(result.choice), program, ctx, allowed)
        program.tables["solver"] = result
        return (f"{len(problem.groups)} variables groups, {len(problem.edge_costs)} edges, {result.n_variables} "
                f"booleans, {result.status}, objective {result.objective * 1e3:.4f} ms, gap {result.gap:.2%}"
                + (f", {len(search.attempts)} solves for the memory budget" if len(search.attempts) > 1 else ""))


def _check_clustering_saw(allowed: dict, seen: dict, cluster_of: dict) -> None:
    """Layers were tied by the constraints cluster_layers saw; one added since could bind a
    whole cluster through one of its layers."""
    clustered = set(cluster_of) | set(cluster_of.values())
    late = sorted(n for n in set(allowed) | set(seen) if n in clustered and allowed.get(n) != seen.get(n))
    if late:
        raise AutoparError(f"constraints on {', '.join(late[:3])} came after cluster_layers tied them to other "
                           f"layers: run the pass that adds them before cluster_layers")
