"""predict: step time and per-device memory of the solved plan."""
from __future__ import annotations

from autopar.cost_models.compute import largest
from autopar.ir.placement import Shard
from autopar.ir.program import Program, forward_nodes
from autopar.ir.records import Predicted
from autopar.passes.base import Pass, PassContext, side_table

side_table('predicted', Predicted, 'step time, memory per device and their parts')


class PredictPass(Pass):
    name = "predict"
    requires = ("meta", "choice", "redistributions", "flops", "memory", "recompute")
    provides = ("predicted",)

    def run(self, program: Program, ctx: PassContext) -> str:
        choice = program.table("choice")
        forward = forward_nodes(program)
        recompute_s = program.table("recompute").seconds
        compute = sum(choice[n.name].compute_s for n in program.nodes() if n.op == "call_function") + recompute_s
        backward = sum(choice[n.name].compute_s for n in program.nodes()
                       if n.op == "call_function" and n.name not in forward)
        redistributions = program.table("redistributions")
        async_s = sum(r.async_seconds for r in redistributions)
        exposed_async = exposed(async_s, backward, ctx.cost.hardware.gradient_overlap)
        comm = sum(r.seconds for r in redistributions) - async_s + exposed_async
        memory = program.table("memory")
        flops = program.table("flops")
        total = sum(flops.values())
        split = sum(f for name, f in flops.items() if _splits_work(choice[name], ctx.mesh))
        fraction = split / total if total else 0.0
        program.tables["predicted"] = Predicted(compute + comm, compute, comm, dict(memory.breakdown), fraction,
                                                total, async_s - exposed_async, memory.timeline, recompute_s)
        return (f"step {1e3 * (compute + comm):.4f} ms (compute {1e3 * compute:.4f}, communication {1e3 * comm:.4f}"
                f" + {1e3 * (async_s - exposed_async):.4f} hidden), {fraction:.0%} of FLOPs sharded")


def exposed(async_s, backward_s, overlap: float):
    """The part of the asynchronous gradient syncs that backward compute cannot hide."""
    return largest(0.0, async_s - overlap * backward_s)


def _splits_work(strategy, mesh) -> bool:
    """An op's work is split when some operand is sharded over an axis of 2 or more devices (a partial
    sum passed through is not: every rank then does the whole op on its summand)."""
    return any(isinstance(p, Shard) and mesh.shape[axis] > 1
               for spec in strategy.in_specs + strategy.out_specs for axis, p in enumerate(spec.placements))
