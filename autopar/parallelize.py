"""autoparallelize: the one-line API for training scripts launched by torchrun.

    model = autopar.autoparallelize(Model(), mesh={"dp": 2, "tp": 2}, example_inputs=(x, y))
    opt = torch.optim.AdamW(model.parameters())   # built on the sharded (DTensor) parameters
    loss = model(x, y)
    loss.backward(); opt.step()

``autoparallelize`` returns the same model object, its class swapped for a subclass whose
calls run autopar's programs (as FSDP2's ``fully_shard`` does): its parameter names and
``isinstance`` stay the model's, and its ``state_dict`` holds DTensors (for Hugging Face's
``save_pretrained``, pass it the full state dict: see README "Training state"). As a class decorator
it does the same to every instance. Every rank passes the same global batch; each takes its
own block of it. The model is called as it is (positional and keyword arguments, nested
batches) and returns what it returns.

The first call (or ``example_inputs``, or ``autopar.prepare``) plans the training step, with
the model in training mode whatever its mode: rank 0 plans, every rank receives the plan, and
the parameters become DTensors in its layouts (an optimizer built before takes them in place of
the old ones: autopar.runtime.replaced). A later call the programs so far do not fit (another
input shape, other train/eval modes, a call under no_grad, which runs a forward program) is
planned then, with the parameters where the first plan put them, and kept for the next such
call; ``replan=False`` refuses another input shape instead.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from autopar import errors
from autopar.capture import recent
from autopar.capture.export import capture, program_inputs
from autopar.errors import AutoparError, MeshError, NoLossError, PlanMismatchError, user_stacklevel
from autopar.ir.call import FlatCall, first_microbatch, flatten_call
from autopar.ir.graph import fingerprint_of
from autopar.ir.mesh import Mesh
from autopar.ir.options import PARALLELIZE, Options, signature, take
from autopar.ir.pipeline import Pipeline
from autopar.ir.plan import Plan
from autopar.ir.precision import MixedPrecision, parse_precision
from autopar.ir.program import FORWARD, STEP
from autopar.passes.registry import pipeline
from autopar.runtime.program import global_call


class _Runner:
    """Plans on the first call, then runs the emitted programs on every call."""

    def __init__(self, options: Options):
        """``options``: autoparallelize's, resolved (``precision`` a MixedPrecision or None)."""
        self.options = options
        # None while the first plan searches it (mesh=N, "auto" or a list of candidates)
        self.mesh = _named_mesh(options.mesh)
        self.plan = options.plan
        self.local_inputs = options.inputs == "local"
        self.parallel = None
        self.sync = True  # False inside no_sync()

    def __call__(self, model: nn.Module, *args, **kwargs):
        if self.parallel is None:
            self.start(model, flatten_call(args, kwargs))
        self.parallel.require_gradient_sync = self.sync
        return self.parallel(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """See ParallelModule.no_sync: calls inside defer their gradient collectives."""
        before, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = before

    def start(self, model: nn.Module, call: FlatCall) -> None:
        """Plan for ``call`` and shard the model, unless that is done."""
        if self.parallel is None:
            self.parallel = self._parallel(model, global_call(call, self.mesh) if self.local_inputs else call)

    def _parallel(self, model: nn.Module, call: FlatCall):
        from autopar.runtime.module import ParallelModule
        from autopar.runtime.rank_mesh import RankMesh

        _ensure_process_group()
        world = dist.get_world_size()
        if self.mesh is not None:  # before any planning or communication
            self.mesh.check_world_size(world)
        elif isinstance(self.options.mesh, int) and self.options.mesh != world:
            raise MeshError(f"mesh={self.options.mesh} searches meshes of {self.options.mesh} devices, but the "
                            f"process group has {world} ranks: launch with --nproc-per-node={self.options.mesh}, or "
                            f"pass mesh='auto'")
        plan = self.plan
        if plan is None:
            plan = _planned_on_rank0(lambda: self._first_plan(model, call))
        elif self.mesh is not None and plan.device_mesh != self.mesh:
            raise MeshError(f"the given plan is for mesh {plan.device_mesh}, not {self.mesh}")
        else:  # rank 0 captures (every rank runs the same model on the same call); all of them raise
            args, kwargs = call.rebuild(call.tensors)
            _on_rank0("checking the given plan",
                      lambda: check_plan_is_for(plan, model, *args, loss_fn=self.options.loss_fn, **kwargs))
        plan.device_mesh.check_world_size(world)  # a searched mesh (mesh=8 on 4 ranks), a given plan's
        device = self.options.device or ("cuda" if dist.get_backend() == "nccl" else "cpu")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
            device = f"cuda:{torch.cuda.current_device()}"
        self.plan, self.mesh = plan, plan.device_mesh
        if plan.pipeline is not None:
            return _pipelined(model, plan, device, self.options, self._pipeline_planner)
        # rank 0's values: each rank receives its blocks of them (or, on the meta device, rank 0
        # initializes one module at a time)
        return ParallelModule(model, plan, RankMesh(self.mesh, device=device), plan.emit("torch"),
                              planner=self._planner, replan=self.options.replan, local_inputs=self.local_inputs,
                              init=initializer(self.options.init), compile=self.options.compile)

    def _first_plan(self, model: nn.Module, call: FlatCall) -> Plan:
        """The training step of the first call, in training mode whatever the model's mode: its
        layouts are the ones training runs in. A call without a loss gets its forward program."""
        with _in_training_mode(model):
            try:
                return self._plan(model, call, STEP, {})
            except NoLossError:
                pass
        warnings.warn("the first call's output holds no loss, so the parameters' layouts are chosen for its forward "
                      "program alone; training steps are planned around them (make the first call a training "
                      "call to lay the parameters out for training)", stacklevel=user_stacklevel())
        return self._plan(model, call, FORWARD, {})

    def _planner(self, kind: str, model: nn.Module, call: FlatCall, pins: dict) -> tuple[Plan, str]:
        """ParallelModule's planner: every rank asks, rank 0 plans, every rank gets the plan."""
        plan = _planned_on_rank0(lambda: self._plan(model, call, kind, pins))
        return plan, plan.emit("torch")

    def _pipeline_planner(self, model: nn.Module, call: FlatCall, pins: dict, like: Pipeline) -> tuple[Plan, str]:
        """PipelinedModule's planner: the step in the model's current modes on ``like``'s
        stages, schedule and micro-batches; rank 0 plans, every rank gets the plan."""
        plan = _planned_on_rank0(lambda: self._plan(model, call, STEP, pins, like))
        return plan, plan.emit("torch")

    def _plan(self, model: nn.Module, call: FlatCall, kind: str, pins: dict, like: Pipeline | None = None) -> Plan:
        from autopar.api import plan_program
        from autopar.planning.request import resolve

        o = self.options
        args, kwargs = call.rebuild(call.tensors)
        program = capture(model, args, kwargs=kwargs, loss_fn=o.loss_fn, training_step=kind == STEP,
                          precision=o.precision)
        mesh = self.mesh if self.mesh is not None else o.mesh
        request = resolve(mesh, o.hardware, pin=pins, precision=o.precision,
                          schedule=o.schedule, microbatches=o.microbatches)
        if like is not None:
            request = dataclasses.replace(request, schedule=like.schedule, microbatches=like.microbatches,
                                          stages=tuple(stage.units for stage in like.stages))
        return plan_program(program, request, model, args, kwargs=kwargs, loss_fn=o.loss_fn, passes=tuple(o.passes))


def _precision_for(precision, plan: Plan | None) -> MixedPrecision | None:
    """``precision`` parsed, refused where it differs from a given plan's; a given plan's own
    where none is given."""
    mixed = parse_precision(precision)
    if plan is not None and mixed is not None and plan.graph.autocast != mixed.compute:
        made = "in the model's own dtypes" if plan.graph.autocast is None else \
            f"under autocast to {plan.graph.autocast}"
        raise AutoparError(f"precision={str(mixed)!r} differs from the given plan's, which was made {made}: leave "
                           f"precision out to run the plan as made")
    if plan is not None and mixed is None and plan.graph.autocast is not None:
        # programs planned later (evaluation, other shapes) compute as the given plan does; the plan
        # keeps its compute dtype only, so they reduce gradients in float32
        mixed = MixedPrecision(plan.graph.autocast)
    return mixed


def _checked(o: Options) -> Options:
    """autoparallelize's options, every one checked at decoration time (a malformed mesh, a
    misplaced pass, an unknown init or precision), ``precision`` resolved."""
    parsed = _named_mesh(o.mesh)
    if parsed is None and o.inputs == "local":
        raise AutoparError(f"mesh={o.mesh!r} is searched on the first call, and with inputs='local' the whole batch "
                           f"depends on the mesh's data-parallel size: name the mesh (mesh='dp=2,tp=2'), or pass "
                           f"inputs='global'")
    pipeline(o.passes)
    if o.inputs not in ("global", "local"):
        raise ValueError(f"inputs={o.inputs!r}: use 'global' (every rank passes the whole batch) or 'local' (each "
                         f"rank its block of it)")
    initializer(o.init)
    return o.replace(precision=_precision_for(o.precision, o.plan))


def _named_mesh(spec) -> Mesh | None:
    """The mesh ``spec`` names; None where the first plan searches it: a device count, "auto"
    (the process group's size) or a list of candidates, as autopar.plan takes them."""
    if isinstance(spec, (list, tuple)):
        for candidate in spec:
            Mesh.parse(candidate)  # a malformed candidate fails here
        return None
    if spec == "auto" or isinstance(spec, int) and not isinstance(spec, bool):
        if spec != "auto" and spec < 1:
            raise MeshError(f"mesh={spec!r}: a device count must be positive")
        return None
    return Mesh.parse(spec)


def _pipelined(model: nn.Module, plan: Plan, device: str, o: Options, planner):
    from autopar.runtime.pipeline import PipelinedModule
    from autopar.runtime.rank_mesh import RankMesh

    return PipelinedModule(model, plan, RankMesh(plan.mesh, device=device, pipeline_stages=plan.pipeline.pp),
                           plan.emit("torch"), local_inputs=o.inputs == "local", init=initializer(o.init),
                           compile=o.compile, planner=planner)


def initializer(init) -> Callable[[nn.Module], None] | None:
    """The function that initializes one module of a model on the meta device (see
    autoparallelize's ``init``; autopar.runtime.state.distribute runs it on rank 0)."""
    if init is None or callable(init):
        return init
    if init != "reset_parameters":
        raise ValueError(f"init={init!r}: use 'reset_parameters', a function init(module), or None")
    return _ResetParameters()


class _ResetParameters:
    """Each module's own reset_parameters(); a module on the meta device without one is refused."""

    def __call__(self, module: nn.Module) -> None:
        module.reset_parameters()

    @staticmethod
    def refusal(model: nn.Module) -> str | None:
        lacking = [path or type(model).__name__ for path, m in model.named_modules()
                   if any(t is not None and t.is_meta for t in list(m._parameters.values()) + list(m._buffers.values()))
                   and not hasattr(m, "reset_parameters")]
        if not lacking:
            return None
        return (f"the model is on the meta device and {', '.join(lacking[:4])} "
                f"{'has' if len(lacking) == 1 else 'have'} parameters or buffers but no reset_parameters(): pass "
                f"init=a function that initializes one module (a Hugging Face model's model._init_weights), or "
                f"init=None and load a state dict")


def _planned_on_rank0(make_plan: Callable[[], Plan]) -> Plan:
    """Rank 0's plan on every rank; where planning fails, every rank raises its error."""
    return Plan.from_json(_on_rank0("planning", lambda: make_plan().to_json()))


def _on_rank0(what: str, work: Callable[[], object]):
    """``work()``'s result, computed on rank 0 alone and broadcast to every rank (ranks of one
    program capture and plan alike, and on a shared host the others would only slow rank 0
    down); where it raises, every rank raises its error, saying ``what`` failed."""
    message: list = [None]
    if dist.get_rank() == 0:
        try:
            message = [("done", work())]
        except Exception as exc:
            dist.broadcast_object_list([("error", type(exc).__name__, str(exc))], src=0)
            raise
    dist.broadcast_object_list(message, src=0)
    if message[0][0] == "error":
        _, kind, text = message[0]
        error = getattr(errors, kind, None)
        raise (error if isinstance(error, type) and issubclass(error, AutoparError) else AutoparError)(
            f"{what} failed on rank 0: {text}")
    return message[0][1]


@contextlib.contextmanager
def _in_training_mode(model: nn.Module):
    """The model as ``model.train()`` leaves it, where it is in evaluation mode; each module's
    own mode afterwards (a model in training mode is left as it is: a submodule kept in eval
    mode, a frozen BatchNorm, stays so)."""
    if model.training:
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def check_plan_is_for(plan: Plan, model: nn.Module, *args, loss_fn: Callable | None = None, **kwargs) -> None:
    """Refuse a plan of another computation before it runs: one made for another forward, or
    for inputs of other shapes, has the same parameters but would compute something else."""
    _refuse_another_graph(plan, _captured_fingerprint(plan, model, args, kwargs, loss_fn))


def check_plan_recalling_captures(plan: Plan, model: nn.Module, args: tuple, kwargs: dict,
                                  loss_fn: Callable | None) -> None:
    """check_plan_is_for, taking the graph this process captured last for this very model object
    called so where there is one (autopar.capture.recent: for autopar.check, whose comparison
    with eager backs the shortcut up)."""
    key = recent.capture_key(plan, model, args, kwargs, loss_fn)
    fingerprint = recent.recalled(model, key)
    if fingerprint is None:
        fingerprint = _captured_fingerprint(plan, model, args, kwargs, loss_fn)
        recent.remember(model, key, fingerprint)
    _refuse_another_graph(plan, fingerprint)


def _captured_fingerprint(plan: Plan, model: nn.Module, args: tuple, kwargs: dict | None,
                          loss_fn: Callable | None) -> str:
    precision = None if plan.graph.autocast is None else MixedPrecision(plan.graph.autocast)
    args = program_inputs(args)
    if plan.pipeline is not None:  # planned for one micro-batch: the first rows of the batch
        args, kwargs = first_microbatch(flatten_call(args, kwargs), plan.pipeline.microbatches)
    program = capture(model, args, kwargs=kwargs, loss_fn=loss_fn, training_step=plan.graph.kind == STEP,
                      precision=precision, untie_tied=plan.pipeline is not None)
    return fingerprint_of(program)


def _refuse_another_graph(plan: Plan, fingerprint: str) -> None:
    if fingerprint != plan.fingerprint:
        raise PlanMismatchError(
            f"plan {plan.hash} was made for graph {plan.fingerprint}, but this model and these inputs capture as "
            f"graph {fingerprint} (another forward, or inputs of other shapes or dtypes); plan this model with "
            f"these inputs with autopar.plan and use that plan")


# where a model holds its runner: on the instance, not in a table keyed by it, since the runner
# holds the model (its parallel module wraps it), so a WeakKeyDictionary's entry would keep the
# model, its parameters and its process groups alive until the interpreter ends (and its gloo
# threads into the interpreter's finalization: autopar.runtime.rank_mesh._SharedGroups.release)
_RUNNER_ATTRIBUTE = "_autopar_runner"
_RUNNER_FACTORIES: dict[type, Callable[[], _Runner]] = {}  # a decorated class -> how its instances get a runner


def autoparallelize(model=None, **options):
    """Use on an instance (returns it, its calls now running autopar's programs) or as a class
    decorator. ``passes``: extra passes for the plans (autopar.plan's ``passes``);
    ``loss_fn(output)``: picks the loss out of the model's output where autopar would not find
    it (autopar.plan); ``replan=False``: a call with other input shapes or arguments than the
    first is refused, not planned. ``inputs``: "global" (every rank passes the whole batch) or
    "local" (torchrun's convention: each rank passes its block of the batch, dim 0 split over
    the mesh's "dp" axes, as autopar.data_parallel_info says; the loss is the whole batch's).
    ``init``, for a model built on the meta device: "reset_parameters" (each module's own), a
    function ``init(module)`` run on each module with parameters or buffers (a Hugging Face
    model's ``_init_weights``), or None (left uninitialized: load a state dict with torch's
    set_model_state_dict). The values equal a single-process initialization that runs ``init``
    on the modules in ``model.modules()`` order from the same random state (rank 0's): each
    rank allocates only its blocks, rank 0 makes one module at a time whole to initialize it.
    ``precision``: None (the model's own dtypes), "bf16-mixed", "fp16-mixed" or an
    autopar.MixedPrecision (see autopar.plan): the parameters, their gradients and the
    optimizer's state stay float32 while the programs compute in the low precision; call the
    model without torch.autocast (the programs hold their casts). With "fp16-mixed", scale the
    loss with torch.amp.GradScaler: every rank skips a step where any rank's gradients overflow.
    ``compile=True``: programs run through torch.compile, communication inside their graphs.
    ``example_inputs`` / ``example_kwargs`` (instances only): plan and shard now, as a first call
    with them would (see autopar.prepare).
    A mesh with a ``pp`` axis first pipelines the model (``schedule`` and ``microbatches`` pin
    what autopar.plan otherwise searches): ``loss = model(*args)`` then runs the whole batch
    through torch.distributed.pipelining's schedule, every micro-batch's forward and backward,
    and ``loss.backward()`` hands each rank's parameters their gradients
    (autopar.runtime.pipeline.PipelinedModule); every rank builds the model alike (one seed),
    passes the whole batch, and holds its stages' parameters alone."""
    o = _checked(take(PARALLELIZE, options))
    def runner() -> _Runner:
        return _Runner(o)

    if model is None or isinstance(model, type):
        if o.example_inputs is not None or o.example_kwargs:
            raise TypeError("example_inputs shard one model instance: pass them with the instance "
                            "(autoparallelize(model, ...)); for a decorated class call autopar.prepare(instance, ...)")
        return _decorate_class(model, runner) if model is not None else lambda cls: _decorate_class(cls, runner)
    if not isinstance(model, nn.Module):
        raise TypeError(f"autoparallelize takes an nn.Module instance or class, got {type(model).__name__}")
    if _runner_of(model, create=False) is not None:
        raise AutoparError(f"this {type(model).__name__} is autoparallelized already")
    model.__class__ = _routed(type(model))
    model.__dict__[_RUNNER_ATTRIBUTE] = runner()
    if o.example_inputs is not None or o.example_kwargs:
        prepare(model, *program_inputs(o.example_inputs if o.example_inputs is not None else ()),
                **(o.example_kwargs or {}))
    return model


autoparallelize.__signature__ = signature(PARALLELIZE, [
    inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)])


def prepare(model: nn.Module, *example_args, **example_kwargs) -> nn.Module:
    """Plan an autoparallelized model for a call with these arguments and shard it now, as its
    first call would: afterwards its parameters are DTensors, and the optimizer can be built. A
    model sharded already is left as it is (a call of another shape plans on its first use)."""
    runner = _runner_of(model)
    if runner is None:
        raise AutoparError(f"autopar.prepare takes a model made by autopar.autoparallelize; this "
                           f"{type(model).__name__} is not")
    runner.start(model, flatten_call(example_args, example_kwargs))
    return model


def _decorate_class(cls, make_runner):
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"@autoparallelize decorates nn.Module subclasses, got {cls!r}")
    routed = _routed(cls)
    _RUNNER_FACTORIES[routed] = make_runner
    return routed


_ROUTED: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()  # a class -> its routed subclass


def _routed(cls: type) -> type:
    """``cls``'s subclass whose calls go through the instance's runner (capture calls forward()
    directly, so only __call__ routes), with DDP's ``no_sync``; one per class. It pickles as
    ``cls`` (a copy is a plain model)."""
    if cls in _ROUTED:
        return _ROUTED[cls]

    def __call__(self, *args, **kwargs):
        return _runner_of(self)(self, *args, **kwargs)

    def no_sync(self):
        """DDP's ``no_sync``: backward passes of calls inside keep local gradients; the first
        backward outside syncs their sum once."""
        return _runner_of(self).no_sync()

    def __reduce_ex__(self, protocol):
        return _plain_copy, (cls, {k: v for k, v in self.__dict__.items() if k != _RUNNER_ATTRIBUTE})

    routed = type(cls.__name__, (cls,), {"__call__": __call__, "no_sync": no_sync, "__reduce_ex__": __reduce_ex__,
                                         "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                         "__doc__": cls.__doc__})
    _ROUTED[cls] = routed
    return routed


def _plain_copy(cls: type, state: dict) -> nn.Module:
    """A copy (deepcopy, pickle) of an autoparallelized model: an instance of its own class."""
    copied = cls.__new__(cls)
    copied.__setstate__(state)
    return copied


def _runner_of(model: nn.Module, create: bool = True) -> _Runner | None:
    runner = model.__dict__.get(_RUNNER_ATTRIBUTE)
    if runner is None and create:
        factory = next((_RUNNER_FACTORIES[c] for c in type(model).__mro__ if c in _RUNNER_FACTORIES), None)
        if factory is not None:
            runner = model.__dict__[_RUNNER_ATTRIBUTE] = factory()
    return runner


def data_parallel_info(model: nn.Module) -> tuple[int, int]:
    """(rank, size) of this process among the data-parallel blocks of an autoparallelized model's
    mesh (its "dp" axes): what torch.utils.data.DistributedSampler takes as ``rank`` and
    ``num_replicas`` for inputs="local". Ranks that differ only on other axes (tp) share a block."""
    runner = _runner_of(model)
    if runner is None:
        raise AutoparError(f"data_parallel_info takes a model made by autopar.autoparallelize; this "
                           f"{type(model).__name__} is not")
    _ensure_process_group()
    runner.mesh.check_world_size(dist.get_world_size())
    return runner.mesh.data_parallel(dist.get_rank())


def plan_of(model: nn.Module) -> Plan | None:
    """The plan an autoparallelized model is running: the first, which laid its parameters out
    (None before its first call)."""
    runner = _runner_of(model, create=False)
    return runner.plan if runner else None


def parallel_module(model: nn.Module):
    """The autopar.runtime.module.ParallelModule that runs an autoparallelized model (None before
    its first call): its programs, one per mode and call shape."""
    runner = _runner_of(model, create=False)
    return runner.parallel if runner else None


def _ensure_process_group() -> None:
    if dist.is_initialized():
        return
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return
    raise AutoparError("an autoparallelized model runs inside a process group: launch the script with "
                       "`torchrun --nproc-per-node=N script.py`; to try a plan in one process use autopar.check")
