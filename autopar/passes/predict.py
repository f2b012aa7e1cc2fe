"""predict: step time and per-device memory of the solved plan."""
from __future__ import annotations

import math
from dataclasses import dataclass

from autopar.cost_models.compute import largest
from autopar.passes.base import Pass, PassContext
from autopar.placement import Shard
from autopar.program import Program, forward_nodes


@dataclass(frozen=True)
class Predicted:
    step_time_s: float
    compute_s: float
    communication_s: float  # exposed: not hidden under backward compute
    memory_bytes: dict  # per device: parameters, gradients, saved_activations
    sharded_flops_fraction: float = 0.0  # share of the step's FLOPs split (not repeated) over some mesh axis
    total_flops: float = 0.0  # FLOPs of one training step of the whole model (forward and backward)
    hidden_communication_s: float = 0.0  # gradient syncs that run under the backward pass

    @property
    def memory_per_device_bytes(self) -> float:
        return sum(self.memory_bytes.values())


class PredictPass(Pass):
    name = "predict"
    requires = ("meta", "choice", "redistributions", "flops")
    provides = ("predicted",)

    def run(self, program: Program, ctx: PassContext) -> str:
        meta, choice = program.table("meta"), program.table("choice")
        forward = forward_nodes(program)
        compute = sum(choice[n.name].compute_s for n in program.nodes() if n.op == "call_function")
        backward = sum(choice[n.name].compute_s for n in program.nodes()
                       if n.op == "call_function" and n.name not in forward)
        redistributions = program.table("redistributions")
        async_s = sum(r.async_seconds for r in redistributions)
        exposed_async = exposed(async_s, backward, ctx.cost.hardware.gradient_overlap)
        comm = sum(r.seconds for r in redistributions) - async_s + exposed_async

        def local_bytes(name: str, index: int = 0) -> float:
            m = meta[name][index]
            if m is None:
                return 0.0
            return math.prod(choice[name].out_specs[index].local_shape(m.shape, ctx.mesh)) * m.itemsize

        params = sum(local_bytes(ph) for ph in program.params)
        # saved activations: forward values that the backward reads (views share storage, but v0 counts them)
        saved = 0.0
        for node in program.nodes():
            if node.op == "call_function" and node.name in forward and any(u.name not in forward for u in node.users):
                if len(meta[node.name]) == 1:
                    saved += local_bytes(node.name)
        memory = {"parameters": params, "gradients": params, "saved_activations": saved}
        flops = program.table("flops")
        total = sum(flops.values())
        split = sum(f for name, f in flops.items() if _splits_work(choice[name], ctx.mesh))
        fraction = split / total if total else 0.0
        program.tables["predicted"] = Predicted(compute + comm, compute, comm, memory, fraction, total,
                                                async_s - exposed_async)
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
