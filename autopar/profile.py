"""autopar.profile: run a plan on local CPU processes under torch.profiler and set the measured
step beside the predicted one.

Each rank runs the plan's program (one warm-up step, then ``steps`` profiled forward+backward
steps) and writes torch.profiler's Chrome trace; the plan's predicted step is written beside it
(autopar.inspect.trace), so Perfetto shows both. The report compares them per op class: the
planner's seconds for the class's statements (an op's compute_s, a collective step's seconds)
against the profiler's self CPU time for the ops of that class, per step and averaged over the
ranks (a collective counts its launch and the wait for it, which autopar.runtime.rank_mesh
names); what the profiler counts in no ATen op or collective (the programs' Python, autograd's
glue) is its own row, which the planner does not price.
"""
from __future__ import annotations

import io
import math
import os
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from autopar.capture.export import program_inputs
from autopar.errors import AutoparError
from autopar.inspect.trace import write_trace
from autopar.ir.plan import Plan
from autopar.ir.redistribute import COMMUNICATING
from autopar.lowering.schedule import schedule
from autopar.runtime.local_cluster import get_cluster
from autopar.runtime.rank_mesh import WAIT_EVENT

# op classes by ATen name (without "aten::" / "aten." and the overload); the rest is "other ops"
_CLASSES = {
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"},
    "attention": {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
                  "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"},
    "normalization": {"native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
                      "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
                      "_native_batch_norm_legit_functional"},
    "views and copies": {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select",
                         "split", "split_with_sizes", "unsqueeze", "squeeze", "as_strided", "alias", "detach",
                         "clone", "copy_", "contiguous", "empty", "empty_strided", "empty_like", "zeros", "zeros_like",
                         "fill_", "zero_", "_to_copy", "to", "unbind", "chunk", "lift_fresh_copy"},
}
COLLECTIVES, OTHER, UNPRICED = "collectives", "other ops", "not in an op (Python, autograd glue)"
CLASSES = (*_CLASSES, OTHER, COLLECTIVES, UNPRICED)


@dataclass(frozen=True)
class ClassTimes:
    name: str
    predicted_s: float  # per step
    measured_s: float  # per step, the mean over ranks of the profiler's self CPU time

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s if self.predicted_s else math.inf


@dataclass
class ProfileReport:
    plan: Plan
    rows: list[ClassTimes]
    predicted_step_s: float
    measured_step_s: float  # the slowest rank's mean step, outside the profiler
    predicted_trace: str
    measured_traces: list[str]

    @property
    def priced(self) -> list[ClassTimes]:
        """The classes the planner prices and the profiler saw."""
        return [r for r in self.rows if r.predicted_s > 0 and r.measured_s > 0]

    @property
    def mape(self) -> float:
        """Mean absolute error of the priced classes, relative to the measured time."""
        return statistics.fmean(abs(r.predicted_s - r.measured_s) / r.measured_s for r in self.priced)

    def __str__(self) -> str:
        out = [f"profile of plan {self.plan.hash} on {self.plan.device_mesh} (local CPU processes): step predicted "
               f"{self.predicted_step_s * 1e3:.2f} ms, measured {self.measured_step_s * 1e3:.2f} ms "
               f"(outside the profiler, slowest rank)",
               f"  {'op class':<38} {'predicted':>12} {'measured':>12} {'measured/predicted':>19}"]
        for r in self.rows:
            ratio = f"{r.ratio:.2f}" if math.isfinite(r.ratio) else "-"
            out.append(f"  {r.name:<38} {r.predicted_s * 1e3:>10.3f}ms {r.measured_s * 1e3:>10.3f}ms {ratio:>19}")
        if self.priced:
            out.append(f"  MAPE over the priced classes: {self.mape:.1%}")
        out.append(f"  traces: {self.predicted_trace} (predicted), {', '.join(self.measured_traces)} (measured, "
                   f"torch.profiler): open them in ui.perfetto.dev")
        return "\n".join(out)


def op_class(name: str) -> str:
    """The class of an ATen op named as the graph names it ("aten.mm.default") or as the
    profiler does ("aten::mm")."""
    bare = name.removeprefix("aten::").removeprefix("aten.").split(".")[0]
    return next((cls for cls, ops in _CLASSES.items() if bare in ops), OTHER)


def predicted_classes(plan: Plan) -> dict[str, float]:
    """Per op class, the planner's seconds for one step's statements."""
    out = dict.fromkeys(CLASSES, 0.0)
    for s in schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh, plan.recompute,
                      prefetch=plan.prefetch):
        if s.kind == "call":
            out[op_class(s.node.target)] += plan.strategies[s.node.name].compute_s
        elif s.kind in ("move", "start") and s.redistribution.steps[s.step].kind in COMMUNICATING:
            out[COLLECTIVES] += s.redistribution.step_seconds[s.step]
    return out


def profile(plan: Plan, model: nn.Module, example_inputs=(), kwargs: dict | None = None,
            out_dir: str | os.PathLike = "autopar-profile", steps: int = 3, hardware=None) -> ProfileReport:
    """Run ``plan`` of ``model(*example_inputs, **kwargs)`` on a local gloo group of its mesh's
    size under torch.profiler; write the predicted trace (``predicted.json``) and each rank's
    measured one (``measured-rank<r>.json``) to ``out_dir``, and return the per-class comparison.
    ``hardware``: the spec the plan was made on, where it is no preset (prices offload's copies)."""
    if plan.pipeline is not None:
        raise AutoparError(f"plan {plan.hash} is pipelined: profile compares the op classes of one program per "
                           f"rank; for a pipeline, compare plan.trace's actions with a torch.profiler trace of "
                           f"your own run")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise AutoparError(f"steps={steps!r}: how many steps to profile, a positive whole number")
    os.makedirs(out_dir, exist_ok=True)
    predicted_trace = write_trace(plan, os.path.join(out_dir, "predicted.json"), hardware)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    results = get_cluster(plan.device_mesh.size).run(_profile_on_rank, buffer.getvalue(),
                                                     program_inputs(example_inputs), dict(kwargs or {}),
                                                     plan.to_json(), steps, os.path.abspath(out_dir))
    predicted = predicted_classes(plan)
    rows = [ClassTimes(c, predicted[c], statistics.fmean(r["classes"][c] for r in results)) for c in CLASSES]
    return ProfileReport(plan, rows, plan.predicted.step_time_s, max(r["step_s"] for r in results),
                         predicted_trace, [r["trace"] for r in results])


def _profile_on_rank(rank: int, world_size: int, model_bytes: bytes, inputs: tuple, kwargs: dict, plan_json: str,
                     steps: int, out_dir: str) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from autopar.check import autopar_loss, rank_mesh_for
    from autopar.runtime.module import ParallelModule

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = Plan.from_json(plan_json)
    parallel = ParallelModule(model, plan, rank_mesh_for(plan.mesh), plan.emit("torch"))

    def step() -> float:
        torch.distributed.barrier()
        start = time.perf_counter()
        autopar_loss(parallel(*inputs, **kwargs)).backward()
        torch.distributed.barrier()
        for p in model.parameters():
            p.grad = None
        return time.perf_counter() - start

    step()  # warm-up: the first call allocates what later ones reuse
    unprofiled = [step() for _ in range(steps)]
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    trace = os.path.join(out_dir, f"measured-rank{rank}.json")
    prof.export_chrome_trace(trace)
    step_s = statistics.fmean(unprofiled)
    return {"classes": _measured_classes(prof, steps, step_s), "step_s": step_s, "trace": trace}


def _measured_classes(prof, steps: int, step_s: float) -> dict[str, float]:
    """Per op class, the profiler's self CPU seconds per step; what no op or collective holds of
    the step (measured outside the profiler) is UNPRICED."""
    out = dict.fromkeys(CLASSES, 0.0)
    for e in prof.key_averages():
        if e.key.startswith(("c10d::", WAIT_EVENT)) and e.key != "c10d::barrier":  # the steps' own barriers
            out[COLLECTIVES] += e.self_cpu_time_total / 1e6 / steps
        elif e.key.startswith("aten::"):
            out[op_class(e.key)] += e.self_cpu_time_total / 1e6 / steps
    out[UNPRICED] = max(step_s - sum(out.values()), 0.0)
    return out
