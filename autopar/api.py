"""autopar.plan: resolve the options, capture the step, and plan it (or load it from the cache)."""
from __future__ import annotations

import functools
import sys
from typing import Callable, Optional, Sequence

from torch import nn

from autopar.capture.export import capture
from autopar.errors import AutoparError
from autopar.ir.hardware import Hardware
from autopar.ir.plan import Plan
from autopar.ir.request import (
    DEFAULT_HARDWARE,
    DEFAULT_OFFLOAD,
    DEFAULT_OPTIMIZER,
    DEFAULT_RECOMPUTE,
    DEFAULT_SOLVER,
    DEFAULT_TIME_LIMIT_S,
    PlanRequest,
)
from autopar.passes.base import Pass
from autopar.passes.registry import pipeline
from autopar.planning import cache as plan_cache
from autopar.planning.meshes import has_pipeline
from autopar.planning.pipeline import run, warn_if_unproven
from autopar.planning.request import resolve
from autopar.planning.state import remember, state_from_program


def plan(model: nn.Module, example_inputs=(), *, mesh, kwargs: Optional[dict] = None,
         loss_fn: Optional[Callable] = None, hardware: "str | Hardware" = DEFAULT_HARDWARE,
         solver: str = DEFAULT_SOLVER, solver_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
         pin: Optional[dict] = None, memory_budget: "str | float | None" = None,
         optimizer: str = DEFAULT_OPTIMIZER, recompute: str = DEFAULT_RECOMPUTE,
         symbolic_dims: Optional[dict[str, int]] = None, cluster_layers: bool = True,
         precision=None, schedule: Optional[str] = None, microbatches: Optional[int] = None,
         partition: str = "balanced", inv_every: Optional[int] = None, offload: "str | bool" = DEFAULT_OFFLOAD,
         restrict: Optional[Callable] = None, passes: Sequence[Pass] = (), cache: bool = True,
         cache_dir: Optional[str] = None, progress: Optional[Callable[[str], None]] = None,
         verbose: bool = False) -> Plan:
    """Plan the training step of ``model(*example_inputs, **kwargs)`` over ``mesh``.

    The call's output holds the loss: the output itself, a dict's or a ModelOutput's ``loss``,
    or the first floating-point scalar of a tuple; ``loss_fn(output)`` picks another. Only the loss is
    differentiated; the other tensors of the output are forward values the program returns.

    Runs in one process on fake tensors: no process group and no real memory, so
    models built on the meta device plan too. ``mesh`` is a mesh ({"dp": 8, "tp": 8} or
    "dp=8,tp=8"), or a device count (64) or "auto" (the process group's size): then every
    1-D and 2-D mesh that respects node boundaries is planned and the fastest plan wins.
    ``solver`` is "lp-first" (the LP relaxation, then SCIP or branch and bound on what it leaves
    open), "mip" (SCIP alone) or "cp-sat"; ``solver_time_limit_s`` bounds each solve, which
    then returns the best plan found with its proven gap (``plan.solver``).
    ``pin`` fixes parameter layouts, e.g. ``{"fc1.weight": "S(0),R"}`` (one placement per
    mesh axis); the solver lays out everything else around them. ``restrict(node, strategy)``
    returning False rules a strategy out (autopar.baselines uses it). ``passes`` are extra
    passes for this plan (see autopar.register_pass for every plan): each goes before
    cluster_layers unless its ``before``/``after`` names another pass, and may add solver
    constraints through ``ctx.constraints`` (autopar.passes.constraints).
    ``symbolic_dims`` names input sizes, e.g. ``{"batch": 0, "seq": 1}`` (the dim index in
    every tensor input that has it); the plan then carries its cost as a formula of them
    (``plan.cost_formula()``, ``plan.evaluate(batch=..., seq=...)``), at the price of
    capturing the step again at other sizes.
    ``memory_budget`` (bytes, or text such as "60GiB"; default 90% of the device's memory)
    bounds the predicted per-device peak, which counts ``optimizer`` state ("sgd", "adam",
    "adam-mixed"); a budget no plan meets is an AutoparError naming the smallest peak found.
    ``cluster_layers``: identical repeated layers share the solver's variables (their interior
    layers take one template layer's layouts), which keeps deep models fast to solve.
    ``recompute``: "auto" recomputes forward values in backward only when the budget needs it,
    choosing what adds the least time; "full" recomputes for the least memory; "none" never.
    ``precision``: None runs the model in its own dtypes; "bf16-mixed" (or "fp16-mixed", or an
    autopar.MixedPrecision) captures the step under ``torch.autocast``: float32 parameters as
    master weights, compute in bf16, gradients summed across ranks in float32 (see
    autopar.ir.precision; fp16 needs torch.amp.GradScaler's loss scaling).
    A mesh with a ``pp`` axis first ({"pp": 4, "dp": 2, "tp": 8}) pipelines the model: its
    repeated layers are split into contiguous stages, one per pp rank (or several, for the
    interleaved and V schedules), and the layout of the other axes, the partition, the
    micro-batch count and the schedule are chosen together (``plan.pipeline``). ``schedule``
    (torch.distributed.pipelining's class name without "Schedule": "GPipe", "1F1B",
    "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV") and
    ``microbatches`` pin them; by default both are searched. ``partition="even"`` splits the
    layers into equal runs (as Megatron-LM does) instead of the balanced, memory-aware split.
    ``optimizer="kfac"`` (a pipelined mesh only) plans K-FAC's work — each micro-batch's curvature
    factors, their reduction, their inversion, the gradients' preconditioning — into the
    pipeline's bubbles (``plan.pipeline.fill``); curvature is refreshed every ``inv_every`` steps,
    by default the shortest cycle (up to 10 steps) within 1% of the best amortized step time.
    Train with autopar.KFAC.
    ``offload``: "auto" (the default) keeps parameters, with their gradients and optimizer
    state, in host memory when the memory budget needs it (in fixed-size chunks that visit the
    device for the statements that read them, moved as the plan fixes: ``plan.offload``), and
    only where that is the fastest plan that fits; True offloads every parameter; False never.
    The host's side is priced with the hardware's ``host_link``, ``host_memory_bytes`` and
    ``host_optimizer_rate``. Not on a mesh with 'pp' yet.
    ``cache``: a plan of the same graph, meshes, hardware spec, options and autopar code is
    loaded from ``cache_dir`` (default $AUTOPAR_CACHE_DIR or ~/.cache/autopar/plans) instead
    of solved; plans with ``restrict`` or custom passes are not cached (autopar.planning.cache).
    """
    if progress is None and verbose:
        progress = lambda msg: print(f"[autopar] {msg}", file=sys.stderr)  # noqa: E731
    # a bad option, mesh or hardware fails here, before any work; so does a misplaced pass
    request = resolve(mesh, hardware, solver=solver, solver_time_limit_s=solver_time_limit_s, pin=pin,
                      memory_budget=memory_budget, optimizer=optimizer, recompute=recompute,
                      symbolic_dims=symbolic_dims, cluster_layers=cluster_layers, precision=precision,
                      schedule=schedule, microbatches=microbatches, partition=partition, inv_every=inv_every,
                      offload=offload)
    pipeline(passes)
    if kwargs:
        _check_positional_only(request)
    if progress is not None:
        progress("capturing the training step ...")
    program = capture(model, example_inputs, kwargs=kwargs, loss_fn=loss_fn, precision=request.precision)
    if progress is not None and program.expanded_from:
        progress(f"captured: {program.expanded_from}")
    return plan_program(program, request, model, example_inputs, loss_fn=loss_fn, restrict=restrict, passes=passes,
                        cache=cache, cache_dir=cache_dir, progress=progress)


def _check_positional_only(request: PlanRequest) -> None:
    """Options that split or size the positional inputs, refused for a call with keywords."""
    if any(has_pipeline(m) for m in request.meshes):
        raise AutoparError("a pipeline splits the positional inputs into micro-batches; call the model with "
                           "positional arguments to plan it on a mesh with 'pp'")
    if request.symbolic_dims is not None:
        raise AutoparError("symbolic_dims names dims of positional inputs; call the model with positional "
                           "arguments to plan with symbolic_dims")


def plan_program(program, request: PlanRequest, model: nn.Module, example_inputs=(), *,
                 loss_fn: Optional[Callable] = None, restrict: Optional[Callable] = None, passes: Sequence[Pass] = (),
                 cache: bool = True, cache_dir: Optional[str] = None,
                 progress: Optional[Callable[[str], None]] = None) -> Plan:
    """Plan a captured program (a training step, or a forward alone) for ``request``, or load
    its plan from the cache (see plan)."""
    key = None
    if cache and plan_cache.cacheable(restrict, passes):
        key = plan_cache.plan_key(program, request)
        cached = plan_cache.load(key, cache_dir)
        if cached is not None:
            return _from_cache(cached, program, request, progress)
    result = run(program, request, model, example_inputs, loss_fn=loss_fn, restrict=restrict, passes=passes,
                 progress=progress)
    if key is not None:
        plan_cache.store(key, result, cache_dir)
    return result


def _from_cache(cached: Plan, program, request: PlanRequest, progress) -> Plan:
    """A cache hit, told like a plan just made; explain rebuilds the strategies from ``program``."""
    if progress is not None:
        progress(cached.history[-1].note)
    warn_if_unproven(cached.mesh, cached.solver, request.solver_time_limit_s)  # as when it was solved
    remember(cached, functools.cache(lambda: state_from_program(cached, program, request)))
    return cached
