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
        overlap = ctx.cost.hardware.gradient_overlap
        ahead = prefetched_seconds(redistributions, program.table("recompute").ahead)
        # gradient syncs and the backward gathers started a layer ahead share backward's compute;
        # the forward gathers started ahead run under forward's
        async_s = sum(r.async_seconds for r in redistributions) + ahead["backward"] + ahead["forward"]
        exposed_async = exposed(async_s - ahead["forward"], backward, overlap) + \
            exposed(ahead["forward"], compute - recompute_s - backward, overlap)
        comm = sum(r.seconds for r in redistributions) - async_s + exposed_async
        offload = program.table("recompute").offload
        offload_s = offload.added_s if offload is not None else 0.0  # the device waits, or the host steps
        comm += offload_s
        memory = program.table("memory")
        flops = program.table("flops")
        total = sum(flops.values())
        split = sum(f for name, f in flops.items() if _splits_work(choice[name], ctx.mesh))
        fraction = split / total if total else 0.0
        program.tables["predicted"] = Predicted(compute + comm, compute, comm, dict(memory.breakdown), fraction,
                                                total, async_s - exposed_async, memory.timeline, recompute_s)
        return (f"step {1e3 * (compute + comm):.4f} ms (compute {1e3 * compute:.4f}, communication {1e3 * comm:.4f}"
                f" + {1e3 * (async_s - exposed_async):.4f} hidden), {fraction:.0%} of FLOPs sharded")


def exposed(async_s, compute_s, overlap: float):
    """The part of the asynchronous collectives (gradient syncs under backward, prefetched
    gathers under their phase) that the compute beside them cannot hide."""
    return largest(0.0, async_s - overlap * compute_s)


def prefetched_seconds(redistributions, ahead) -> dict:
    """phase -> the time of the parameter gathers started a layer ahead (their first step)."""
    ahead = set(ahead)
    out = {"forward": 0.0, "backward": 0.0}
    for r in redistributions:
        if r.id in ahead:
            out[r.phase] += r.step_seconds[0]
    return out


def _splits_work(strategy, mesh) -> bool:
    """An op's work is split when some operand is sharded over an axis of 2 or more devices (a partial
    sum passed through is not: every rank then does the whole op on its summand)."""
    return any(isinstance(p, Shard) and mesh.shape[axis] > 1
               for spec in strategy.in_specs + strategy.out_specs for axis, p in enumerate(spec.placements))
