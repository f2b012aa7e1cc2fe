"""The composition matrix: which of autopar's features combine in one training run.

Each feature is written as a user writes it (a mesh axis, a plan option, an autoparallelize
option, a line of the training loop); a recipe is a set of features. ``run_recipe`` trains the
recipe for two steps on four gloo ranks and the same loop in one process, eager, and says how
they compare, or the refusal autopar gave. ``tests/test_composition.py`` runs every pair (and
torchtitan's usual stack) and holds each outcome to ``REFUSED`` and ``NOT_EXPRESSIBLE``; the
docs' matrix (docs/composition.md) is generated from the same tables: ``python -m
tests.composition`` prints it.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import itertools
import os
import tempfile
from dataclasses import dataclass

import torch

import autopar
from autopar.baseline_plans import NormsOverSequence, megatron_pins
from autopar.check import MIXED_TOLERANCE
from autopar.ir.placement import Shard
from examples import gpt2
from tests.models import tiny_llama
from tests.workers import FAST

RANKS = 4
STEPS = 2
LR = 0.1
KFAC_SETTINGS = dict(lr=0.05, momentum=0.9, damping=1e-2, factor_decay=0.9, kl_clip=1e-2)
# no two of its sizes alike (the baselines tell the sequence dim by its size): batch x seq 128,
# its halves 64 and micro-batches 32, seq 16, width 48, head 24, vocabulary 96
TINY = gpt2.GPT2Config(vocab=96, seq=16, layers=2, heads=2, width=48, batch=8)


@dataclass(frozen=True)
class Feature:
    title: str  # the docs' name for it
    how: str  # how a user turns it on


FEATURES = {
    "dp": Feature("data parallel", "a `dp` axis"),
    "zero3": Feature("ZeRO-3", "parameters pinned `S(0)` over `dp`; beside `tp`, `pin=megatron_pins(model, tp=2, "
                               "dp=2)` (autopar.baseline_plans)"),
    "tp": Feature("tensor parallel", "a `tp` axis (the solver's layout)"),
    "sp": Feature("tensor + sequence parallel", "Megatron's layout with sequence parallelism, "
                                                "`autopar.baselines(..., only=['megatron-tp2-sp'])` (with ZeRO-3: "
                                                "`megatron-tp2-fsdp-sp`); on a pipeline, whose Megatron baselines "
                                                "need whole nodes per stage, the same rule as a pass: "
                                                "`pin=megatron_pins(model, tp=2)`, "
                                                "`passes=[NormsOverSequence(seq)]` (autopar.baseline_plans)"),
    "pp": Feature("pipeline", "a `pp` axis"),
    "recompute": Feature("recompute under a budget", "`memory_budget=` below the peak of the plan without "
                                                     "recomputing by half its activations, that plan's parameter "
                                                     "layouts pinned and offload as the recipe has it, so only "
                                                     "recomputing meets it (on sequences of 64)"),
    "offload": Feature("offload", "`offload=True`"),
    "bf16": Feature("bf16-mixed", "`precision='bf16-mixed'`"),
    "fp16": Feature("fp16-mixed + GradScaler", "`precision='fp16-mixed'`, `torch.amp.GradScaler`"),
    "compile": Feature("compile", "`compile=True`"),
    "dcp": Feature("DCP save/resume", "`torch.distributed.checkpoint` after step 1, a fresh model resumes"),
    "clip": Feature("global clipping", "`torch.nn.utils.clip_grad_norm_`"),
    "hf": Feature("Hugging Face keyword call", "`LlamaForCausalLM(input_ids=..., labels=...)`"),
    "meta": Feature("meta-device build", "built on `meta`, `init=None`, the full state dict loaded "
                                         "(`set_model_state_dict(..., broadcast_from_rank0=True, strict=False)`)"),
    "local": Feature("local inputs", "`inputs='local'`"),
    "no_sync": Feature("no_sync accumulation", "two half-batches, the first under `no_sync()`"),
    "kfac": Feature("K-FAC", "`optimizer='kfac'`, `autopar.KFAC`"),
    "jax": Feature("JAX backend", "`autopar.check(..., backend='jax')`"),
}

# torchtitan's usual stack
STACK = frozenset({"zero3", "tp", "pp", "bf16", "compile", "recompute", "dcp", "clip"})

# what a feature's pair partner must avoid (the reason names what would lift it), where the two
# cannot be said together in autopar's API at all: no refusal to assert, so no run
NOT_EXPRESSIBLE = {
    frozenset({"bf16", "fp16"}): "a plan has one precision",
}
for _loop in ("dcp", "clip", "meta", "local", "no_sync", "fp16"):
    NOT_EXPRESSIBLE[frozenset({"jax", _loop})] = (
        "the JAX backend is reached through `autopar.check`, which compares one step function with eager; "
        "autopar emits no JAX training loop to carry this: a JAX runtime would lift it")

# the refusals: the pair -> (a part of autopar's message, the reason the docs give)
_KFAC_OFFLOAD = ("offload=True with optimizer='kfac'", "K-FAC's curvature work reads the weights' gradient "
                 "operands and steps the weights on the device: its factors and step over host-resident stages "
                 "would lift it")
_KFAC_PRECISION = ("K-FAC runs in float32 for now", "K-FAC finds its layers as the matmuls that read a weight, and "
                   "under mixed precision they read its low-precision cast: following the cast would lift it")
_NO_JAX_PIPELINE = ("which only the torch backend emits", "the JAX backend emits no pipeline (K-FAC runs in a "
                    "pipeline's bubbles): a JAX pipeline runtime would lift it")
REFUSED: dict[frozenset, tuple[str, str]] = {
    frozenset({"kfac", "offload"}): _KFAC_OFFLOAD,
    frozenset({"bf16", "kfac"}): _KFAC_PRECISION,
    frozenset({"fp16", "kfac"}): _KFAC_PRECISION,
    frozenset({"compile", "kfac"}): (
        "reads the programs' operands from Python between them", "K-FAC's work reads the programs' operands from "
        "Python between compiled programs: K-FAC's work as operations of the graphs would lift it"),
    frozenset({"clip", "kfac"}): (
        "clip_grad_norm_ on a model trained by autopar.KFAC", "`.grad` holds K-FAC's preconditioned gradients, whose "
        "step K-FAC bounds by its own KL clip (`kl_clip=`), measured before any clipping"),
    frozenset({"no_sync", "kfac"}): (
        "autopar.KFAC takes one step per training call", "K-FAC's curvature cycle counts calls, and its KL clip "
        "weighs one call's gradients: a cycle counted in optimizer steps would lift it"),
    frozenset({"offload", "jax"}): (
        "which only the torch backend emits", "the JAX program moves nothing to host memory: host transfers in the "
        "JAX program would lift it"),
    frozenset({"pp", "jax"}): _NO_JAX_PIPELINE,
    frozenset({"kfac", "jax"}): _NO_JAX_PIPELINE,
    frozenset({"compile", "jax"}): (
        "compile=True compiles the torch programs", "XLA compiles the JAX program already"),
    frozenset({"hf", "jax"}): (
        "runs the JAX program on positional inputs", "the JAX program takes positional inputs: keywords mapped to "
        "the forward's parameters would lift it"),
}


# the most features one run combines: a run that fails names its features, and fewer keep the
# culprit near; more make fewer runs (each compiles, plans and starts its steps once)
RUN_SIZE = 7
# features whose runs cost most (compiling every program on every rank: about 100 s a run on two
# cores, where a run without it takes about 10 s): the runs are built around them first, so their
# pairs go into as few runs as the four ranks allow
COSTLY = frozenset({"compile"})


def pairs() -> list[tuple[str, str]]:
    """The pairs a test can try: those that can be said."""
    return [(a, b) for a, b in itertools.combinations(FEATURES, 2) if frozenset({a, b}) not in NOT_EXPRESSIBLE]


def cover() -> list[frozenset]:
    """Runs of several features at once whose pairs, with STACK's (which its own test runs),
    are every pair neither refused nor inexpressible: each run starts from the first pair no run
    covers yet (those with a COSTLY feature first, then in FEATURES' order) and adds, while it
    can, the feature that composes with all it holds and covers the most uncovered pairs,
    keeping to four ranks."""
    composable = {frozenset(p) for p in pairs()} - set(REFUSED)
    uncovered = composable - {frozenset(p) for p in itertools.combinations(STACK, 2)}
    order = {name: i for i, name in enumerate(FEATURES)}
    runs = []
    while uncovered:
        run = set(min(uncovered, key=lambda pair: (not pair & COSTLY, sorted(order[f] for f in pair))))
        while len(run) < RUN_SIZE:
            gains = [(sum(frozenset({f, g}) in uncovered for g in run), -order[f], f) for f in FEATURES
                     if f not in run and all(frozenset({f, g}) in composable for g in run)
                     and ranks_of(mesh_of(frozenset(run | {f}))) == RANKS]
            best = max(gains, default=None)
            if best is None or best[0] == 0:
                break
            run.add(best[2])
        runs.append(frozenset(run))
        uncovered -= {frozenset(p) for p in itertools.combinations(run, 2)}
    return runs


# ---- building the run ---------------------------------------------------------------------------


def model_and_batch(recipe: frozenset):
    """(model, positional inputs, keyword inputs) of the recipe: a tiny GPT-2-style decoder, or
    a tiny Hugging Face Llama called with keywords (on sequences of 64 where the recipe
    recomputes, long enough that activations, not the gradients, make the peak)."""
    recomputes = "recompute" in recipe
    if "hf" in recipe:
        sequence = 64 if recomputes else 8
        model, kwargs = tiny_llama(heads=2, positions=sequence, sequence=sequence)
        return model, (), kwargs
    model, inputs = gpt2.make(dataclasses.replace(TINY, seq=64) if recomputes else TINY)
    return model, inputs, {}


def mesh_of(recipe: frozenset) -> str:
    """Each feature's axis of 2, data parallel over the rest of four ranks (eight where it
    needs pp, dp and tp at once)."""
    axes = {}
    if "pp" in recipe or "kfac" in recipe:
        axes["pp"] = 2
    if recipe & {"dp", "zero3"} or "local" in recipe or "no_sync" in recipe:
        axes["dp"] = 2
    if recipe & {"tp", "sp"}:
        axes["tp"] = 2
    if "sp" in recipe and "pp" in axes:
        axes.setdefault("dp", 1)  # Megatron's pins name (dp, tp)
    filled = 1
    for size in axes.values():
        filled *= size
    if filled < RANKS:
        axes["dp"] = axes.get("dp", 1) * RANKS // filled
    order = [a for a in ("pp", "dp", "tp") if a in axes]
    return ",".join(f"{a}={axes[a]}" for a in order)


def ranks_of(mesh: str) -> int:
    ranks = 1
    for axis in mesh.split(","):
        ranks *= int(axis.partition("=")[2])
    return ranks


def plan_recipe(recipe: frozenset, model, inputs, kwargs, schedule: str = "1F1B") -> autopar.Plan:
    """The plan of the recipe, as a user asks for it (an AutoparError is a refusal): for the
    calls the loop makes (half-batches, where it accumulates under no_sync)."""
    inputs, kwargs = first_call(recipe, inputs, kwargs)
    mesh = mesh_of(recipe)
    options = dict(hardware=FAST, precision=_precision(recipe), cache=True)
    if "pp" in mesh:
        # each rank's half-batch block (no_sync with local inputs) is 2 rows: 2 micro-batches
        options.update(schedule=schedule, microbatches=2 if "no_sync" in recipe else 4)
    if "kfac" in recipe:
        options["optimizer"] = "kfac"
    if "offload" in recipe:
        options["offload"] = True
    if "sp" in recipe and "pp" in mesh:
        options.update(pin=megatron_pins(model, tp=2, dp=2 if "zero3" in recipe else 1),
                       passes=(NormsOverSequence(_sequence(inputs, kwargs)),))
    elif "sp" in recipe:
        name = "megatron-tp2" + ("-fsdp" if "zero3" in recipe else "") + "-sp"

        def megatron(**budget):
            plans = autopar.baselines(model, inputs, kwargs=kwargs or None, devices=RANKS, hardware=FAST,
                                      tp_degrees=[2], only=[name], precision=options["precision"],
                                      offload=options.get("offload", False), **budget)
            if name not in plans:
                raise autopar.AutoparError(plans.skipped[name])
            return plans[name]
        if "recompute" not in recipe:
            return megatron()
        # the baseline pins its layouts and offloads as the recipe says already
        return megatron(memory_budget=budget_below_by_half_activations(megatron(recompute="none")), recompute="auto")
    elif {"zero3", "tp"} <= recipe:  # Megatron's layout over tp, every parameter also split over dp
        options["pin"] = megatron_pins(model, tp=2, dp=2)
    elif "zero3" in recipe:
        options["pin"] = {n: "S(0)" for n, _ in model.named_parameters()}

    def plan(**more):
        return autopar.plan(model, inputs, kwargs=kwargs or None, mesh=mesh, **{**options, **more})
    if "recompute" not in recipe:
        return plan()
    free = plan(recompute="none")
    return plan(memory_budget=budget_below_by_half_activations(free), recompute="auto", **_recompute_only(recipe, free))


def first_call(recipe: frozenset, inputs: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """What the loop's calls pass: the first half of the batch where it accumulates two halves
    under no_sync, else the batch."""
    if "no_sync" not in recipe:
        return inputs, kwargs
    return tuple(t[: t.shape[0] // 2] for t in inputs), {k: t[: t.shape[0] // 2] for k, t in kwargs.items()}


def _sequence(inputs: tuple, kwargs: dict) -> int:
    return (kwargs["input_ids"] if kwargs else inputs[0]).shape[1]


def _precision(recipe: frozenset) -> str | None:
    return "bf16-mixed" if "bf16" in recipe else "fp16-mixed" if "fp16" in recipe else None


def budget_below_by_half_activations(free: autopar.Plan) -> float:
    """A memory budget below the peak of ``free`` (the recipe's plan without recomputing) by half
    its activations."""
    memory = free.predicted.memory_bytes
    return sum(memory.values()) - 0.5 * memory["activations"]


def _recompute_only(recipe: frozenset, free: autopar.Plan) -> dict:
    """Options that leave recomputing the only way to meet the budget: ``free``'s parameter
    layouts pinned (no leaner sharding; not on a pipeline, which plans a micro-batch) and, where the recipe
    does not offload, nothing offloaded (where it does, every chunk already is)."""
    options = {} if "offload" in recipe else {"offload": False}
    if free.pipeline is None:
        options["pin"] = {fqn: free.param_spec(fqn).to_json() for fqn in free.graph.params.values()}
    return options


# ---- the training loop, eager and distributed --------------------------------------------------


def call_loss(model, recipe: frozenset, inputs: tuple, kwargs: dict, rows: slice | None = None):
    """The loss of the model's call on the batch's ``rows`` (all where None)."""
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])
    if kwargs:
        return model(**{k: pick(v) for k, v in kwargs.items()}).loss
    return model(*(pick(t) for t in inputs))


def train_loop(model, step_model, opt, recipe: frozenset, inputs, kwargs, steps, autocast=None, scaler=None,
               between=None) -> tuple[list[float], torch.nn.Module]:
    """``steps`` steps on the same batch: per step the random state seeded, the loss (two halves,
    the first under ``no_sync()``, where the recipe accumulates), the gradients clipped where
    it clips, the optimizer stepped (through ``scaler`` where given). ``step_model`` is what is
    called (the model, or its wrapper); ``between(step)`` may replace (model, opt) after a step.
    (each step's loss, the model trained last)."""
    losses = []
    batch = (kwargs or {"x": inputs[0]})
    rows = next(iter(batch.values())).shape[0]
    for step in range(steps):
        torch.manual_seed(step)
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            if "no_sync" in recipe:
                halves = (slice(0, rows // 2), slice(rows // 2, rows))
                with step_model.no_sync() if hasattr(step_model, "no_sync") else contextlib.nullcontext():
                    first = call_loss(step_model, recipe, inputs, kwargs, halves[0]) / 2
                    _backward(first, scaler)
                second = call_loss(step_model, recipe, inputs, kwargs, halves[1]) / 2
                _backward(second, scaler)
                loss = first.item() + second.item()
            else:
                out = call_loss(step_model, recipe, inputs, kwargs)
                _backward(out, scaler)
                loss = out.item()
        if "clip" in recipe:
            if scaler is not None:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
        losses.append(loss)
        if between is not None:
            model, step_model, opt, scaler = between(step, model, step_model, opt, scaler)
    return losses, model


def _backward(loss, scaler) -> None:
    (loss if scaler is None else scaler.scale(loss)).backward()


def _optimizer(model, wrapped, recipe: frozenset):
    if "kfac" in recipe:
        return autopar.KFAC(wrapped, **KFAC_SETTINGS)
    # SGD with momentum (state for DCP to carry), whose step is linear in the gradients: AdamW's
    # normalized step turns rounding-level gradient differences into whole-lr ones
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def _scaler(recipe: frozenset):
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if "fp16" in recipe else None


def _autocast(recipe: frozenset):
    return torch.bfloat16 if "bf16" in recipe else torch.float16 if "fp16" in recipe else None


def eager(recipe: frozenset, model, inputs, kwargs, steps: int = STEPS) -> tuple[list[float], dict]:
    """The recipe's loop in one process: (losses, parameters after the last step)."""
    model = copy.deepcopy(model)
    opt = _optimizer(model, model, recipe)
    losses, _ = train_loop(model, model, opt, recipe, inputs, kwargs, steps, _autocast(recipe), _scaler(recipe))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def distributed(rank, world_size, model_bytes, inputs, kwargs, plan_json, recipe, directory, steps):
    """The recipe's loop on this rank of the gloo group: (losses, this rank's parameters,
    whole), or the AutoparError's message."""
    try:
        model, opt, scaler, mine, my_kwargs = _build(model_bytes, inputs, kwargs, plan_json, recipe)

        def resume(step, model, wrapped, opt, scaler):
            if "dcp" not in recipe or step != 0:
                return model, wrapped, opt, scaler
            return _save_and_resume(model, opt, scaler, model_bytes, inputs, kwargs, plan_json, recipe, directory)

        losses, model = train_loop(model, model, opt, recipe, mine, my_kwargs, steps, None, scaler, between=resume)
    except autopar.AutoparError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    params = {n: p.detach().full_tensor() for n, p in model.named_parameters() if not p.is_meta}
    return {"error": None, "losses": losses, "params": params}


def _build(model_bytes, inputs, kwargs, plan_json, recipe: frozenset, shard_now: bool = False):
    """(model, optimizer, scaler, inputs, kwargs): the model autoparallelized with the plan
    (autoparallelize returns the model itself), the optimizer built right after, as training
    scripts do; the inputs this rank passes (its block, with inputs="local"). ``shard_now``:
    sharded before the optimizer is built (autopar.prepare), as a checkpoint's load needs."""
    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    options = dict(mesh=plan.device_mesh, plan=plan, compile="compile" in recipe,
                   inputs="local" if "local" in recipe else "global")
    if "meta" in recipe:
        whole = model.state_dict()
        model = model.to("meta")
        # a Hugging Face model's non-persistent buffers (rotary frequencies) are in no state dict:
        # its own init makes them, and the state dict then loads the rest
        options["init"] = model._init_weights if "hf" in recipe else None
    autopar.autoparallelize(model, **options)
    if "local" in recipe:
        block, blocks = autopar.data_parallel_info(model)
        inputs = tuple(t.chunk(blocks)[block] for t in inputs)
        kwargs = {k: t.chunk(blocks)[block] for k, t in kwargs.items()}
    if shard_now or "meta" in recipe or "kfac" in recipe:  # the state dict and K-FAC need the sharded model
        args, keywords = first_call(recipe, inputs, kwargs)
        autopar.prepare(model, *args, **keywords)
    if "meta" in recipe:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, whole if torch.distributed.get_rank() == 0 else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                      strict=False))  # a pipeline rank holds its stages
    return model, _optimizer(model, model, recipe), _scaler(recipe), inputs, kwargs


def _save_and_resume(model, opt, scaler, model_bytes, inputs, kwargs, plan_json, recipe, directory):
    """The model's and optimizer's state saved with DCP, then a fresh model, optimizer and
    scaler resumed from it: (model, model, optimizer, scaler)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    model_state, optim_state = get_state_dict(model, opt, options=flat)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    fresh, fresh_opt, fresh_scaler, _, _ = _build(model_bytes, inputs, kwargs, plan_json, recipe - {"meta"},
                                                  shard_now=True)
    model_state, optim_state = get_state_dict(fresh, fresh_opt, options=flat)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"], options=flat)
    if scaler is not None:
        fresh_scaler.load_state_dict(scaler.state_dict())
    return fresh, fresh, fresh_opt, fresh_scaler


# ---- one recipe, end to end ---------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    error: str | None  # autopar's refusal, or None where it ran
    worst: float = 0.0  # the largest difference from eager, over losses and parameters, in tolerances
    missing: tuple[str, ...] = ()  # features of the recipe the plan does not show (a run that proves nothing of them)


def missing_features(recipe: frozenset, plan: autopar.Plan) -> tuple[str, ...]:
    """The recipe's features whose mark the plan lacks: each must have taken effect for the
    run to say anything of it."""
    axes = plan.mesh.axis_names

    def sharded_over(axis: str) -> int:
        if axis not in axes:
            return 0
        return sum(isinstance(plan.param_spec(fqn).placements[axes.index(axis)], Shard)
                   for fqn in plan.graph.params.values())

    marks = {"pp": plan.pipeline is not None, "kfac": plan.pipeline is not None and plan.pipeline.fill is not None,
             "tp": sharded_over("tp") > 0, "sp": sharded_over("tp") > 0, "zero3": sharded_over("dp") > 0,
             "dp": "dp" in axes, "recompute": bool(plan.recompute), "offload": plan.offload is not None
             or plan.pipeline is not None and plan.pipeline.offload is not None,
             "bf16": plan.graph.autocast == "bfloat16", "fp16": plan.graph.autocast == "float16"}
    return tuple(sorted(f for f in recipe if not marks.get(f, True)))


def tolerance(recipe: frozenset) -> tuple[float, float]:
    """(rtol of a tensor's largest entry, atol)."""
    if recipe & {"bf16", "fp16"}:
        return MIXED_TOLERANCE["bfloat16" if "bf16" in recipe else "float16"]
    return (2e-4, 2e-5) if recipe & {"compile", "kfac"} else (1e-4, 1e-6)


def run_recipe(recipe: frozenset, schedule: str = "1F1B", steps: int = STEPS) -> Outcome:
    """Train ``recipe`` for ``steps`` steps on four ranks (a pipeline under ``schedule``) and
    eager; the refusal, or how far apart they came."""
    from autopar.runtime.local_cluster import get_cluster

    model, inputs, kwargs = model_and_batch(recipe)
    try:
        plan = plan_recipe(recipe, model, inputs, kwargs, schedule)
        if "jax" in recipe:
            report = autopar.check(model, inputs, kwargs=kwargs or None, plan=plan, backend="jax",
                                   compile="compile" in recipe)
            return Outcome(None if report.ok else f"differs: {report}", missing=missing_features(recipe, plan))
    except (autopar.AutoparError, ValueError) as exc:
        return Outcome(f"{type(exc).__name__}: {exc}")
    missing = missing_features(recipe, plan)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    with tempfile.TemporaryDirectory() as directory:
        cluster = get_cluster(ranks_of(mesh_of(recipe)))
        ranks = cluster.run(distributed, buffer.getvalue(), inputs, kwargs, plan.to_json(), recipe,
                            os.path.join(directory, "checkpoint"), steps)
    errors = {r["error"] for r in ranks}
    if errors != {None}:
        return Outcome(sorted(e for e in errors if e)[0])
    want_losses, want_params = _reference(recipe, model, inputs, kwargs, plan, steps)
    got = {}
    for r in ranks:
        got.update(r["params"])
    assert set(got) == set(want_params), sorted(set(got) ^ set(want_params))
    rtol, atol = tolerance(recipe)
    worst = max(_apart(torch.tensor(r["losses"]), torch.tensor(want_losses), rtol, atol) for r in ranks)
    for name, want in want_params.items():
        worst = max(worst, _apart(got[name], want, rtol, atol))
    return Outcome(None, worst, missing)


def _reference(recipe, model, inputs, kwargs, plan, steps):
    """Eager's losses and parameters; under K-FAC, the single-process reference's (which calls
    the model positionally: a keyword-called model is wrapped, its names prefixed)."""
    if "kfac" not in recipe:
        return eager(recipe, model, inputs, kwargs, steps)
    from autopar.ir.bubbles import FACTOR
    from tests.kfac_reference import reference_kfac

    prefix = ""
    if kwargs:
        model, inputs, prefix = _KeywordLoss(model), tuple(kwargs.values()), "inner."
    fill = plan.pipeline.fill
    phases = {(prefix + w.layers[0].removesuffix(".weight"), w.microbatch): w.phase
              for w in fill.work if w.kind == FACTOR}
    losses, params = reference_kfac(model, inputs, steps, plan.pipeline.microbatches,
                                    [prefix + w.removesuffix(".weight") for w in fill.layers], refresh=fill.refresh,
                                    factor_phase=phases, **KFAC_SETTINGS)
    return losses, {name.removeprefix(prefix): value for name, value in params.items()}


class _KeywordLoss(torch.nn.Module):
    """A Hugging Face model called positionally, as the K-FAC reference calls: its loss."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, labels):
        return self.inner(input_ids=input_ids, labels=labels).loss


def _apart(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> float:
    """How far ``got`` is from ``want`` in units of the tolerance (<= 1: equal)."""
    allowed = rtol * float(want.abs().max()) + atol
    return float((got.float() - want.float()).abs().max()) / allowed


# ---- the docs' matrix ---------------------------------------------------------------------------


def matrix_markdown() -> str:
    keys = list(FEATURES)
    lines = ["| | " + " | ".join(FEATURES[k].title for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    notes = []

    def cell(a: str, b: str) -> str:
        if a == b:
            return "·"
        pair = frozenset({a, b})
        refused = pair in REFUSED
        reason = REFUSED[pair][1] if refused else NOT_EXPRESSIBLE.get(pair)
        if reason is None:
            return "✓"
        if reason not in notes:
            notes.append(reason)
        return f"{'✗' if refused else '—'}{notes.index(reason) + 1}"

    for a in keys:
        lines.append(f"| {FEATURES[a].title} | " + " | ".join(cell(a, b) for b in keys) + " |")
    how = [f"- **{f.title}**: {f.how}" for f in FEATURES.values()]
    reasons = [f"{i}. {reason}" for i, reason in enumerate(notes, 1)]
    return "\n".join(lines + ["", "How each feature is turned on:", ""] + how + ["", "Why a pair is ✗ or —:", ""]
                     + reasons) + "\n"


if __name__ == "__main__":
    print(matrix_markdown())
