"""autopar.plan: resolve the options, capture the step, and plan it (or load it from the cache)."""
from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager

from torch import nn

from autopar.capture import recent
from autopar.capture.export import capture
from autopar.errors import AutoparError
from autopar.ir.options import PLAN, Options, signature, take
from autopar.ir.plan import Plan
from autopar.ir.request import PlanRequest
from autopar.passes.base import Pass
from autopar.passes.registry import pipeline
from autopar.planning import cache as plan_cache
from autopar.planning.pipeline import run, warn_if_unproven
from autopar.planning.request import resolve
from autopar.planning.state import remember, state_from_program


def plan(model: nn.Module, example_inputs=(), **options) -> Plan:
    """Plan the training step of ``model(*example_inputs, **kwargs)`` over ``mesh``.

    Every option is declared in autopar.ir.options (docs/options.md lists them). The call's
    output holds the loss: the output itself, a dict's or a ModelOutput's ``loss``, or the first
    floating-point scalar of a tuple; ``loss_fn(output)`` picks another. Only the loss is
    differentiated; the other tensors of the output are forward values the program returns.

    Runs in one process on fake tensors: no process group and no real memory, so models built
    on the meta device plan too. A device count (or "auto") as ``mesh`` plans every 1-D and 2-D
    mesh of that many devices that respects node boundaries, and the fastest plan wins. Each
    solve stops at its deterministic ``solver_work_limit`` (``solver_time_limit_s`` is only a
    safety net) with the best plan found and its proven gap (``plan.solver``). ``pin`` fixes
    parameter layouts and the solver lays out everything else around them;
    ``restrict(node, strategy)`` returning False rules a strategy out; ``passes`` add constraints
    through ``ctx.constraints`` (autopar.passes.constraints). ``symbolic_dims``
    makes the plan carry its cost as a formula of named input sizes (``plan.evaluate(batch=...)``).
    The predicted per-device peak, which counts ``optimizer`` state, stays under
    ``memory_budget`` (an AutoparError names the smallest peak found where none does), using
    recomputation (``recompute``) and host memory (``offload``) where the budget needs them.
    Under ``precision`` the step is captured under ``torch.autocast``: float32 parameters as
    master weights, compute in bf16 or fp16, gradients summed in float32 (autopar.ir.precision).
    A mesh with a ``pp`` axis first pipelines the model: its repeated layers are split into
    stages, and the layout of the other axes, the partition, the micro-batch count and the
    schedule are chosen together (``plan.pipeline``); ``optimizer="kfac"`` places K-FAC's work
    in the pipeline's bubbles. A plan of the same graph, meshes, hardware, options and autopar
    code is loaded from the plan cache instead of solved (autopar.planning.cache).
    """
    o = take(PLAN, options)
    with _logged_to_stderr(o.verbose):
        return _plan(model, example_inputs, o, _logging(o.progress))


plan.__signature__ = signature(PLAN, [
    inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="nn.Module"),
    inspect.Parameter("example_inputs", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=())])

_log = logging.getLogger(__name__)


def _logging(progress: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """Each stage of planning is logged (INFO, logger ``autopar.api``) and handed to the
    caller's ``progress`` display, if any; None where nobody listens, so the solver runs
    without a progress callback."""
    if progress is None and not _log.isEnabledFor(logging.INFO):
        return None

    def report(message: str) -> None:
        _log.info(message)
        if progress is not None:
            progress(message)
    return report


@contextmanager
def _logged_to_stderr(verbose: bool):
    """``verbose=True`` prints autopar's INFO log to stderr for this call, and only there (not
    also through the caller's root handlers). Without it the log goes wherever the caller's
    logging configuration sends the ``autopar`` logger."""
    if not verbose:
        yield
        return
    logger = logging.getLogger("autopar")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _plan(model: nn.Module, example_inputs, o: Options, progress: Callable[[str], None] | None) -> Plan:
    # a bad option, mesh or hardware fails here, before any work; so does a misplaced pass
    request = resolve(o.mesh, o.hardware, **o.planning())
    pipeline(o.passes)
    if o.kwargs and request.symbolic_dims is not None:
        raise AutoparError("symbolic_dims names dims of positional inputs; call the model with positional arguments "
                           "to plan with symbolic_dims")
    if progress is not None:
        progress("capturing the training step ...")
    program = capture(model, example_inputs, kwargs=o.kwargs, loss_fn=o.loss_fn, precision=request.precision)
    if progress is not None and program.expanded_from:
        progress(f"captured: {program.expanded_from}")
    made = plan_program(program, request, model, example_inputs, kwargs=o.kwargs, loss_fn=o.loss_fn,
                        restrict=o.restrict, passes=o.passes, cache=o.cache, cache_dir=o.cache_dir, progress=progress)
    # autopar.check of this plan on this model, so called, need not capture it again
    recent.remember(model, recent.capture_key(made, model, example_inputs, o.kwargs, o.loss_fn), made.fingerprint)
    return made


def plan_program(program, request: PlanRequest, model: nn.Module, example_inputs=(), *, kwargs: dict | None = None,
                 loss_fn: Callable | None = None, restrict: Callable | None = None, passes: Sequence[Pass] = (),
                 cache: bool = True, cache_dir: str | None = None,
                 progress: Callable[[str], None] | None = None) -> Plan:
    """Plan a captured program (a training step, or a forward alone) for ``request``, or load
    its plan from the cache (see plan)."""
    key = None
    if cache and plan_cache.cacheable(restrict, passes):
        key = plan_cache.plan_key(program, request)
        cached = plan_cache.load(key, cache_dir)
        if cached is not None:
            return _from_cache(cached, program, request, progress)
    result = run(program, request, model, example_inputs, kwargs=kwargs, loss_fn=loss_fn, restrict=restrict,
                 passes=passes, progress=progress)
    if key is not None:
        plan_cache.store(key, result, cache_dir)
    return result


def _from_cache(cached: Plan, program, request: PlanRequest, progress) -> Plan:
    """A cache hit, told like a plan just made; explain rebuilds the strategies from ``program``."""
    if progress is not None:
        progress(cached.history[-1].note)
    warn_if_unproven(cached.mesh, cached.solver, request)  # as when it was solved
    remember(cached, functools.cache(lambda: state_from_program(cached, program, request)))
    return cached
