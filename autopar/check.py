"""autopar.check: run a plan on local CPU processes and compare with eager PyTorch."""
from __future__ import annotations

import copy
import dataclasses
import inspect
import io
import math
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from torch import nn

from autopar.capture.export import find_loss, program_inputs
from autopar.errors import AutoparError, MeshError
from autopar.ir.mesh import Mesh
from autopar.ir.options import CHECK, signature, take
from autopar.ir.plan import Plan
from autopar.ir.precision import MixedPrecision, parse_precision
from autopar.ir.program import STEP
from autopar.parallelize import check_plan_recalling_captures
from autopar.runtime.local_cluster import get_cluster
from autopar.runtime.state import whole

SEED = 1234
RTOL = 1e-4  # fp32: the sharded program sums in a different order than eager
ATOL = 1e-6  # for tensors whose entries are all near zero (e.g. a key bias's gradient, zero in exact math)
# Mixed precision: a sharded matmul rounds each rank's partial sum to bf16 (8 significant bits,
# a relative step of 2**-8 = 0.39%) before they are added, where eager rounds the whole sum once;
# a few roundings' worth, relative to the tensor's largest entry (float16 keeps 11 bits), and a
# floor for the gradients that are zero in exact math and rounding noise here
MIXED_TOLERANCE = {"bfloat16": (2e-2, 1e-5), "float16": (5e-3, 1e-5)}  # (rtol, atol)
# a mixed-precision tensor may lie from eager's this many times eager's own distance from float32:
# autopar's distance from float32 up to three times eager's, in a direction of its own, plus eager's
_ROUNDINGS = 4


@dataclass(frozen=True)
class TensorCheck:
    name: str
    max_abs_error: float
    # max |a - b| / max(max |b|, atol / rtol), atol raised to compare's rounding allowance where
    # that is larger: tiny tensors are judged on it
    max_rel_error: float
    rtol: float = RTOL
    atol: float = ATOL

    @property
    def ok(self) -> bool:
        return self.max_rel_error <= self.rtol


@dataclass
class CheckReport:
    plan: Plan
    tensors: list[TensorCheck]
    losses: list[float]
    reference_losses: list[float]
    bytes_moved: dict = field(default_factory=dict)
    peak_memory_bytes: tuple = ()  # per rank, when measured: tensor bytes live at the step's peak

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tensors)

    @property
    def max_abs_error(self) -> float:
        return max(t.max_abs_error for t in self.tensors)

    @property
    def max_rel_error(self) -> float:
        return max(t.max_rel_error for t in self.tensors)

    @property
    def tolerance(self) -> tuple[float, float]:
        return max(t.rtol for t in self.tensors), max(t.atol for t in self.tensors)

    def __str__(self) -> str:
        lines = [f"check of plan {self.plan.hash} on mesh {self.plan.device_mesh}: {'OK' if self.ok else 'MISMATCH'} "
                 f"(max abs error {self.max_abs_error:.2e}, max rel error {self.max_rel_error:.2e}, "
                 f"tolerance rel {self.tolerance[0]:g} or abs {self.tolerance[1]:g})"]
        lines.append(f"  {'step':>4}  {'autopar loss':>14}  {'eager loss':>14}")
        for i, (a, b) in enumerate(zip(self.losses, self.reference_losses)):
            lines.append(f"  {i:>4}  {a:>14.8f}  {b:>14.8f}")
        bad = [t for t in self.tensors if not t.ok]
        for t in bad:
            lines.append(f"  mismatch: {t.name}: abs {t.max_abs_error:.3e} rel {t.max_rel_error:.3e}")
        return "\n".join(lines)


def compare(name: str, got: torch.Tensor, want: torch.Tensor, tolerance: tuple = (RTOL, ATOL),
            rounding: float = 0.0) -> TensorCheck:
    """``got`` against ``want`` within ``tolerance`` (rtol of want's largest entry, or atol), or,
    where it is larger, within _ROUNDINGS times ``rounding``: eager's own error in mixed precision
    (its distance from eager in float32). It decides only for a tensor that is small beside the
    terms summed into it: there the rounding of those terms is most of its value, and another
    summation order (a sharded program's) rounds otherwise."""
    got, want = got.detach().double(), want.detach().double()
    rtol, atol = tolerance
    allowed = max(atol, _ROUNDINGS * rounding)
    if got.shape != want.shape:
        return TensorCheck(f"{name} (shape {list(got.shape)} vs {list(want.shape)})", float("inf"), float("inf"),
                           rtol, atol)
    diff = (got - want).abs().max().item() if got.numel() else 0.0
    scale = want.abs().max().item() if want.numel() else 0.0
    return TensorCheck(name, diff, diff / max(scale, allowed / rtol), rtol, atol)


def train(model: nn.Module, step, steps: int, lr: float, loss_fn=None):
    """``steps`` SGD steps of ``output = step()``: the loss of each step, and the gradients and
    the output's other tensors (by their place in the output) of the first."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads, values = [], {}, {}
    for i in range(steps):
        torch.manual_seed(SEED + i)  # the same random state (dropout masks) as the other side of the comparison
        opt.zero_grad()
        output = step()
        loss = find_loss(output, loss_fn)
        loss.backward()
        losses.append(loss.item())
        if i == 0:
            grads = {n: whole(p.grad).detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            values = output_values(output, loss)
        opt.step()
    return losses, grads, values


def output_values(output, loss=None) -> dict:
    """The tensors of a model's output but its loss, by their place in it (``.logits``); a
    DTensor (what autopar returns) gathered whole."""
    return {pytree.keystr(path) or "output": whole(leaf).detach().clone()
            for path, leaf in pytree.tree_flatten_with_path(output)[0]
            if isinstance(leaf, torch.Tensor) and leaf is not loss}


def check(model: nn.Module, example_inputs=(), **options) -> CheckReport:
    """Run the plan of ``model(*example_inputs, **kwargs)`` on a local gloo group of the mesh's
    size; compare the loss, every gradient and the output's other tensors with eager's. Every
    option is declared in autopar.ir.options (docs/options.md lists them).

    ``backend="jax"`` runs the emitted JAX program instead, in a fresh interpreter on as many CPU
    devices as the mesh has, and compares the first step's loss and gradients.

    Reports a mismatch in the returned report; it does not raise on one. ``measure_memory``
    first runs one step under torch's MemTracker and reports each rank's peak tensor memory
    (parameters, inputs and everything the step allocates), to set beside the plan's
    ``predicted.peak_memory_bytes`` with ``optimizer="sgd"`` (no optimizer state).

    ``precision`` (autopar.plan's; a given plan's own by default): eager runs its forward under
    ``torch.autocast`` in the same dtype, and tensors compare at MIXED_TOLERANCE (2e-2 of a
    tensor's largest entry for bf16, 5e-3 for fp16, or 1e-5 absolute) instead of 1e-4 or 1e-6,
    or within a few times eager's own distance from eager in float32 where that is larger (see
    compare).

    ``compile=True`` runs the programs as autoparallelize(compile=True) does, through
    torch.compile (each rank compiles them on the first step).

    A mesh with ``pp`` runs the pipelined plan under torch.distributed.pipelining's schedule
    (``schedule`` and ``microbatches`` pin them, as in autopar.plan) and compares the loss and
    every gradient (each from the ranks of the stage that holds it).
    """
    o = take(CHECK, options)
    mesh, kwargs, loss_fn, hardware, plan = o.mesh, o.kwargs, o.loss_fn, o.hardware, o.plan
    steps, lr, measure_memory, backend, compile = o.steps, o.lr, o.measure_memory, o.backend, o.compile
    inputs = program_inputs(example_inputs)
    kwargs = dict(kwargs or {})
    _check_backend_options(backend, kwargs, compile)
    plan = _plan_to_check(model, inputs, kwargs, loss_fn, mesh, hardware, plan, parse_precision(o.precision),
                          (o.schedule, o.microbatches))
    if plan.pipeline is not None and measure_memory:
        raise ValueError("check of a pipelined plan runs it as planned: measure_memory is not supported for "
                         "pipelines yet")
    autocast = plan.graph.autocast
    tolerance = (RTOL, ATOL) if autocast is None else MIXED_TOLERANCE[autocast]
    steps = 1 if backend == "jax" else steps
    reference = copy.deepcopy(model)
    reference_losses, reference_grads, reference_values = train(
        reference, _under_autocast(lambda: reference(*inputs, **kwargs), autocast), steps, lr, loss_fn)
    if backend == "jax":
        return _check_jax(plan, model, inputs, reference_losses, reference_grads, tolerance)
    rounding = {} if autocast is None else _eagers_rounding(model, inputs, kwargs, steps, lr, loss_fn, (
        reference_losses, reference_grads, reference_values))

    buffer = io.BytesIO()
    torch.save(model, buffer)
    results = get_cluster(plan.device_mesh.size).run(_run_on_rank, buffer.getvalue(), inputs, kwargs, plan.to_json(),
                                                     steps, lr, measure_memory, compile)

    if plan.pipeline is not None:  # a pipelined step returns the outputs its last stage computes (the others None)
        reference_values = {path: v for path, v in reference_values.items() if path in results[0]["values"]}
    return CheckReport(plan, _compared(results, reference_losses, reference_grads, reference_values, tolerance,
                                       rounding),
                       results[0]["losses"], reference_losses, _bytes_moved(results),
                       tuple(r["peak_memory"] for r in results) if measure_memory else ())


def _bytes_moved(results: list) -> dict:
    """Every rank's bytes moved, by collective kind, summed."""
    moved = {}
    for r in results:
        for kind, n in r["bytes_moved"].items():
            moved[kind] = moved.get(kind, 0) + n
    return moved


check.__signature__ = signature(CHECK, [
    inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="nn.Module"),
    inspect.Parameter("example_inputs", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=())])


def _check_backend_options(backend: str, kwargs: dict, compile: bool) -> None:
    if backend not in ("torch", "jax"):
        raise ValueError(f"unknown backend {backend!r}; use 'torch' or 'jax'")
    if backend == "jax" and kwargs:
        raise ValueError("check(backend='jax') runs the JAX program on positional inputs; pass them positionally")
    if backend == "jax" and compile:
        raise ValueError("compile=True compiles the torch programs; the JAX program is compiled by XLA already")


def _plan_to_check(model: nn.Module, inputs: tuple, kwargs: dict, loss_fn, mesh, hardware: str,
                   plan: Plan | None, mixed: MixedPrecision | None, pipeline_options: tuple) -> Plan:
    """The plan check runs: ``plan``, refused where it is not a training step of this model and
    these inputs on ``mesh`` in ``mixed`` precision, or one made now."""
    from autopar.api import plan as make_plan

    if plan is None:
        if mesh is None:
            raise TypeError("check() needs mesh=... (or a plan=... made earlier)")
        schedule, microbatches = pipeline_options
        return make_plan(model, inputs, kwargs=kwargs, loss_fn=loss_fn, mesh=Mesh.parse(mesh), hardware=hardware,
                         precision=mixed, schedule=schedule, microbatches=microbatches)
    if mesh is not None and Mesh.parse(mesh) != plan.device_mesh:
        raise MeshError(f"mesh {Mesh.parse(mesh)} differs from the plan's mesh {plan.device_mesh}")
    schedule, microbatches = pipeline_options
    pipeline = plan.pipeline
    if (schedule, microbatches) != (None, None) and (pipeline is None or schedule not in (None, pipeline.schedule)
                                                     or microbatches not in (None, pipeline.microbatches)):
        raise ValueError(f"schedule= and microbatches= pin what a new plan searches; plan {plan.hash} has its own "
                         f"({'none' if pipeline is None else f'{pipeline.schedule}, {pipeline.microbatches}'}): "
                         f"leave them out to check it")
    if plan.graph.kind != STEP:
        raise ValueError(f"check compares training steps, and plan {plan.hash} is a forward program alone; check "
                         f"the training step's plan (the forward program runs the same statements without backward)")
    if mixed is not None and mixed.compute != plan.graph.autocast:
        raise ValueError(f"precision={str(mixed)!r} differs from plan {plan.hash}'s; leave it out to check the "
                         f"plan as made")
    check_plan_recalling_captures(plan, model, inputs, kwargs, loss_fn)
    return plan


def _under_autocast(step, dtype: str | None):
    if dtype is None:
        return step

    def autocast_step():
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            return step()
    return autocast_step


def _eagers_rounding(model: nn.Module, inputs: tuple, kwargs: dict, steps: int, lr: float, loss_fn,
                     mixed: tuple) -> dict:
    """By the names _compared gives them, how far eager's ``mixed``-precision (losses, gradients,
    outputs) lie from eager's own in float32."""
    exact_model = copy.deepcopy(model)
    exact = train(exact_model, lambda: exact_model(*inputs, **kwargs), steps, lr, loss_fn)
    rounding = {f"loss[step {i}]": abs(a - b) for i, (a, b) in enumerate(zip(mixed[0], exact[0]))}
    for prefix, got, want in (("grad", mixed[1], exact[1]), ("output", mixed[2], exact[2])):
        rounding.update({f"{prefix} {name}": (got[name].double() - want[name].double()).abs().max().item()
                         for name in got if name in want and got[name].numel()})
    # an overflow (fp16's inf, a NaN) is no rounding: it must not widen the comparison to anything
    return {name: r for name, r in rounding.items() if math.isfinite(r)}


def _compared(results: list, reference_losses, reference_grads: dict, reference_values: dict,
              tolerance: tuple, rounding: dict) -> list[TensorCheck]:
    """Each step's loss, every gradient (the worst rank's: a replica that drifted shows) and every
    other output tensor of the ranks' ``results`` against eager's (``rounding``: eager's own
    mixed-precision error by tensor name, see compare)."""
    def compared(name, got, want):
        return compare(name, got, want, tolerance, rounding.get(name, 0.0))
    tensors = [compared(f"loss[step {i}]", torch.tensor(a), torch.tensor(b))
               for i, (a, b) in enumerate(zip(results[0]["losses"], reference_losses))]
    for fqn, want in reference_grads.items():
        holders = [r for r in results if fqn in r["grads"]]  # every rank, or a pipeline stage's
        tensors.append(max((compared(f"grad {fqn}", r["grads"][fqn], want) for r in holders),
                           key=lambda t: t.max_rel_error) if holders else _missing(f"grad {fqn}"))
    for path, want in reference_values.items():
        got = results[0]["values"].get(path)
        tensors.append(compared(f"output {path}", got, want) if got is not None else _missing(f"output {path}"))
    return tensors


def _missing(name: str) -> TensorCheck:
    return TensorCheck(f"{name} (missing)", float("inf"), float("inf"))


def _check_jax(plan: Plan, model: nn.Module, inputs: tuple, reference_losses, reference_grads,
               tolerance: tuple) -> CheckReport:
    from autopar.backends.jax.run import run_jax_step

    loss, grads, _ = run_jax_step(plan, model, inputs, seed=SEED)  # the first step's random state, as train's
    tensors = [compare("loss[step 0]", torch.tensor(loss), torch.tensor(reference_losses[0]), tolerance)]
    for fqn, want in reference_grads.items():
        tensors.append(compare(f"grad {fqn}", grads[fqn], want, tolerance) if fqn in grads else _missing(f"grad {fqn}"))
    return CheckReport(plan, tensors, [loss], reference_losses)


def rank_mesh_for(mesh: Mesh, pipeline_stages: int = 1):
    """Worker side: a RankMesh for one job. Its process groups are the process's, shared by every
    RankMesh of the mesh; its gradient buckets' buffers are the job's, gone with it (a worker
    runs many models, and a kept RankMesh would hold every size of buffer they had)."""
    from autopar.runtime.rank_mesh import RankMesh

    return RankMesh(mesh, pipeline_stages=pipeline_stages)


def _run_on_rank(rank: int, world_size: int, model_bytes: bytes, inputs: tuple, kwargs: dict, plan_json: str,
                 steps: int, lr: float, measure_memory: bool, compile: bool) -> dict:
    from autopar.runtime.module import ParallelModule

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = Plan.from_json(plan_json)
    if plan.pipeline is not None:
        return _run_pipeline_on_rank(model, inputs, kwargs, plan, steps, lr, compile)
    rt = rank_mesh_for(plan.mesh)
    rt.bytes_moved.clear()
    parallel = ParallelModule(model, plan, rt, plan.emit("torch"), compile=compile)
    if measure_memory:
        peak = _measure_peak_memory(model, lambda: autopar_loss(parallel(*inputs, **kwargs)).backward())
    rt.bytes_moved.clear()
    losses, grads, values = train(model, lambda: parallel(*inputs, **kwargs), steps, lr, autopar_loss)
    return {"losses": losses, "grads": grads, "values": values, "bytes_moved": dict(rt.bytes_moved),
            "peak_memory": peak if measure_memory else None}


def _run_pipeline_on_rank(model: nn.Module, inputs: tuple, kwargs: dict, plan: Plan, steps: int, lr: float,
                          compile: bool) -> dict:
    from autopar.runtime.pipeline import PipelinedModule

    rt = rank_mesh_for(plan.mesh, plan.pipeline.pp)
    rt.bytes_moved.clear()
    # a K-FAC plan's step also preconditions its gradients in the bubbles; check compares the
    # programs' loss and gradients with eager's, so it runs them with that work left out
    # (tests/test_bubbles.py checks K-FAC itself against a reference)
    plan = dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, fill=None))
    pipelined = PipelinedModule(model, plan, rt, plan.emit("torch"), compile=compile)
    losses, grads, values = train(model, lambda: pipelined(*inputs, **kwargs), steps, lr, autopar_loss)  # its stages'
    # a tied weight's copies on other stages, each compared under the name eager knows it by
    grads = {plan.graph.tied.get(fqn, fqn): grad for fqn, grad in grads.items()}
    return {"losses": losses, "grads": grads, "values": values, "bytes_moved": dict(rt.bytes_moved),
            "peak_memory": None}


def autopar_loss(output):
    """The loss in what an autoparallelized model returns: its one tensor that is not a DTensor
    (the user's loss_fn need not be picklable to reach the workers)."""
    from torch.distributed.tensor import DTensor

    plain = [leaf for leaf in pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)
             and not isinstance(leaf, DTensor)]
    if len(plain) != 1:
        raise AutoparError(f"autopar's output holds {len(plain)} plain tensors where its loss is the one expected")
    return plain[0]


def _measure_peak_memory(model: nn.Module, step) -> float:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        step()
    return float(sum(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values()))
