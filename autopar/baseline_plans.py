"""Hand-written layouts, planned through the same passes so they are priced like the solver's.

    plans = autopar.baselines(model, inputs, devices=8, hardware="h100-sxm")
    for name, p in plans.items(): print(name, p.mesh, p.predicted.step_time_s)

Each baseline fixes every parameter's placement (through ``pin``) the way an expert
would write it, and splits every activation that carries the batch (forward and backward)
along it over ``dp``, as data parallelism runs (each rank computes its own samples); the
solver lays out the rest around that, so a baseline is a real plan (emitted, checked and
run like any other):

- ``dp``: data parallel on a 1-D mesh, parameters replicated.
- ``zero3``: ZeRO-3 / FSDP on a 1-D mesh, each parameter sharded along its first dim
  the device count divides (gathered before use, gradients reduce-scattered).
- ``megatron-tp{t}``: Megatron-LM tensor parallelism on ``(dp=n/t, tp=t)`` (Shoeybi et
  al. 2019): attention and MLP input projections column-parallel (weight rows split),
  output projections row-parallel (weight columns split), embedding and LM head split
  over the vocabulary, norms replicated; replicated over ``dp``. Without sequence
  parallelism no activation is split along the sequence on ``tp``; with it (``-sp``) the
  norms run on sequence shards over ``tp`` (Korthikanti et al. 2022), and the solver lays
  the residual and dropout regions between them.
- ``megatron-tp{t}-fsdp`` (and ``-sp``): the same, with parameters also sharded over
  ``dp`` along their other dim (2-D FSDP + TP, as torchtitan runs Llama).
- ``megatron-pp{p}-tp{t}-1f1b`` and ``-interleaved``: Megatron-LM's 3-D layouts (Narayanan et
  al. 2021) past one node: ``(pp=p, dp, tp=t)``, TP as above inside a node, the layers split
  into equal runs over the stages (embedding on the first, head on the last), one sample per
  data-parallel rank in each micro-batch, under 1F1B or interleaved 1F1B; priced by the same
  pipeline simulator as autopar's own pipelines.

A model with mixture-of-experts layers (autopar.ops.moe) gets two more kinds, whose experts
are split over ``dp`` and run expert parallel (tokens to their experts by all-to-all); in every
other baseline the experts are never expert parallel (zero3's sharded experts are gathered per
use, as FSDP does):

- ``zero3-ep``: torchtitan's FSDP with expert parallelism over all the devices (its
  ``expert_parallel_degree`` = the device count), dense parameters as ``zero3``.
- ``megatron-tp{t}-ep`` (and ``-sp``): Megatron-Core's dense tensor parallelism on
  ``(dp=n/t, tp=t)`` with the experts split over ``dp`` (EP = n/t, expert TP 1: the layout
  Megatron advises for Mixtral), replicated over ``tp``.

A baseline whose ``dp`` does not divide the batch is left out (``skipped`` says why).

Tensor-parallel degrees are those that divide the device count, fit in a node, and
divide the attention heads (``heads``, read from the model's config when not given).
A baseline whose memory does not fit the budget is left out (``skipped`` says why).
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection

import torch
from torch import nn

from autopar.capture.export import capture
from autopar.capture.module_paths import module_paths
from autopar.capture.moe_regions import computes_swiglu_experts
from autopar.cost_models.hardware import get_hardware
from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Shard
from autopar.ir.precision import parse_precision
from autopar.ir.program import descendants, output_metas, tensor_inputs
from autopar.ir.request import DEFAULT_HARDWARE
from autopar.ops.attention import ATTENTION_RULES, key_spec, keys_gathered, query_spec, sequence_axis
from autopar.ops.moe import KERNEL_OPS, expert_axis, tokens_whole
from autopar.passes.base import Pass
from autopar.planning.pipeline import plan_captured

# module names of the projections Megatron splits by output (column) and by input (row)
_COLUMN = re.compile(r"(^|\.)(q|k|v|q_proj|k_proj|v_proj|query|key|value|qkv|c_attn|wq|wk|wv|gate_proj|up_proj|"
                     r"fc|fc1|c_fc|w1|w3|intermediate\.dense)$")
_ROW = re.compile(r"(^|\.)(o_proj|out_proj|proj|c_proj|wo|down_proj|fc2|w2|out|output\.dense)$")
# module names of the norms Megatron's sequence parallelism runs on sequence shards
_NORM = re.compile(r"(^|\.)(\w*norm\w*|ln_?\w*)$", re.IGNORECASE)
_VOCAB = re.compile(r"(embed_tokens|wte|word_embeddings|tok_embeddings|lm_head|(^|\.)head|(^|\.)output)$")


class Baselines(dict):
    """name -> Plan, with ``skipped``: name -> why that baseline has no plan."""

    def __init__(self):
        super().__init__()
        self.skipped: dict[str, str] = {}


def baselines(model: nn.Module, example_inputs=(), *, devices: int, hardware=DEFAULT_HARDWARE,
              heads: int | None = None, tp_degrees: list[int] | None = None,
              progress: Callable[[str], None] | None = None, program=None, only: Collection[str] | None = None,
              kwargs: dict | None = None, **plan_options) -> Baselines:
    """The baselines for ``devices`` devices as Plans; ``plan_options`` go to autopar.plan
    (memory_budget, optimizer, solver_time_limit_s, ...), so they meet the same budget.
    ``program``: the step as autopar.capture.capture gave it, to skip capturing it again.
    ``only``: the names of the baselines to plan (e.g. ["megatron-tp2-sp"]), not all.
    ``kwargs``: the call's keyword inputs, as autopar.plan takes them (a Hugging Face model's
    ``input_ids=``, ``labels=``)."""

    hw = get_hardware(hardware)
    tensors = _call_tensors(example_inputs, kwargs)
    tokens = _tokens(tensors)
    batch = _batch(tensors)
    batch_over_dp = (BatchOverDataParallel(frozenset({batch} | ({batch * tokens[1]} if tokens else set()))),)
    if program is None:  # under mixed precision the step's graph holds autocast's casts
        program = capture(model, example_inputs, kwargs=kwargs,
                          precision=parse_precision(plan_options.get("precision")))
    plan_options["kwargs"] = kwargs
    heads = heads or _heads_of(model)
    degrees = tp_degrees if tp_degrees is not None else [
        t for t in range(2, devices + 1) if devices % t == 0 and hw.devices_per_node % t == 0
        and (heads is None or heads % t == 0)]
    layouts = _dense_layouts(model, devices, degrees, program, tokens)
    out = Baselines()
    plan_options.setdefault("offload", False)  # the hand-written configurations hold their state on the device
    tp = max(degrees, default=1)
    pipelines = _pipelined_layouts(devices, tp, hw)
    expert_layouts = _expert_parallel_layouts(model, devices, degrees, program, tokens)
    wanted = _wanted(only, list(layouts) + list(expert_layouts) + list(pipelines))
    out.skipped.update({n: why for n, why in expert_layouts.items() if isinstance(why, str) and wanted(n)})
    layouts.update({n: layout for n, layout in expert_layouts.items() if not isinstance(layout, str)})
    for name, (mesh, pin, restrict, passes) in layouts.items():
        if not wanted(name):
            continue
        if batch % mesh.shape[0]:
            out.skipped[name] = (f"the batch of {batch} samples does not split over dp={mesh.shape[0]}: data "
                                 f"parallelism needs a multiple of {mesh.shape[0]}")
            continue
        if progress is not None:
            progress(f"baseline {name} on {mesh} ...")
        try:
            out[name] = plan_captured(program, model, example_inputs, mesh=mesh, hardware=hw, pin=pin,
                                      restrict=restrict, passes=(batch_over_dp if mesh.shape[0] > 1 else ()) + passes,
                                      progress=progress, **plan_options)
        except AutoparError as exc:  # e.g. replicated parameters do not fit the memory budget
            out.skipped[name] = str(exc)
    _add_3d(out, program, model, example_inputs, {n: v for n, v in pipelines.items() if wanted(n)}, tp, hw,
            tokens, batch, progress, plan_options)
    return out


def _wanted(only: Collection[str] | None, names: list[str]) -> Callable[[str], bool]:
    """Whether a baseline's name is one ``only`` asks for (all where None); an error names
    the ones it asks for that these devices have none of."""
    if only is None:
        return lambda name: True
    unknown = [n for n in only if n not in names]
    if unknown:
        raise AutoparError(f"no baseline named {unknown[0]!r}; for these devices they are {', '.join(names)}")
    return set(only).__contains__


def _pipelined_layouts(devices: int, tp: int, hw) -> dict[str, tuple[int, int, str]]:
    """Megatron-LM's 3-D layouts for ``devices``: name -> (pp, dp, schedule), pipelines whose
    stages hold whole nodes, TP of degree ``tp`` inside each node."""
    if tp < 2:
        return {}
    return {f"megatron-pp{pp}-tp{tp}-{label}": (pp, devices // (pp * tp), schedule) for pp in (2, 4, 8)
            if not devices % (pp * tp) and not (devices // pp) % hw.devices_per_node
            for schedule, label in (("1F1B", "1f1b"), ("Interleaved1F1B", "interleaved"))}


def _add_3d(out: Baselines, program, model, example_inputs, layouts: dict, tp: int, hw, tokens, batch: int,
            progress, plan_options: dict) -> None:
    """The 3-D ``layouts`` (_pipelined_layouts), micro-batches of one sample per data-parallel rank."""
    for name, (pp, dp, schedule) in layouts.items():
        if batch % dp or batch // dp < pp:
            out.skipped[name] = (f"the batch of {batch} samples gives {batch // dp} micro-batches of one sample "
                                 f"per dp rank (dp={dp}), fewer than the {pp} stages")
            continue
        m = batch // dp
        micro = (batch // m, tokens[1]) if tokens else None
        micro_batch = frozenset({batch // m} | ({(batch // m) * tokens[1]} if tokens else set()))
        if progress is not None:
            progress(f"baseline {name} on (pp={pp}, dp={dp}, tp={tp}) ...")
        try:
            out[name] = plan_captured(
                program, model, example_inputs, mesh=Mesh.of(pp=pp, dp=dp, tp=tp), hardware=hw,
                pin=megatron_pins(model, tp),
                restrict=_no_sequence_split(program, micro, axis=1),
                passes=((BatchOverDataParallel(micro_batch),) if dp > 1 else ()) + (ExpertLayout(None),),
                progress=progress,
                schedule=schedule, microbatches=m, partition="even", **plan_options)
        except AutoparError as exc:
            out.skipped[name] = str(exc)


def _dense_layouts(model, devices: int, degrees: list, program, tokens) -> dict:
    """name -> (mesh, pins, restriction, passes) of the 1-D and 2-D baselines, experts whole."""
    params = dict(model.named_parameters())
    whole_experts = (ExpertLayout(None),)
    layouts = {"dp": (Mesh.of(dp=devices), {n: "R" for n in params}, None, whole_experts),
               "zero3": (Mesh.of(dp=devices), {n: _fsdp(p, devices) for n, p in params.items()}, None, whole_experts)}
    for t in degrees:
        mesh = Mesh.of(dp=devices // t, tp=t)
        for fsdp in (False, True) if devices > t else (False,):
            pin = megatron_pins(model, t, devices // t if fsdp else 1)
            for sp in (False, True):
                name = f"megatron-tp{t}" + ("-fsdp" if fsdp else "") + ("-sp" if sp else "")
                layouts[name] = (mesh, pin, None if sp else _no_sequence_split(program, tokens, axis=1),
                                 ((NormsOverSequence(tokens[1]),) if sp and tokens else ()) + whole_experts)
    return layouts


def expert_parameters(model: nn.Module) -> dict[str, int]:
    """The stacked expert weights of the model's MoE layers that autopar plans as one op, with
    their expert counts."""
    return {f"{path}.{name}": m.gate_up_proj.shape[0] for path, m in model.named_modules()
            if computes_swiglu_experts(m) for name in ("gate_up_proj", "down_proj")}


def _expert_parallel_layouts(model, devices: int, degrees: list, program, tokens) -> dict:
    """The expert-parallel baselines of a model with MoE layers, experts split over dp: name ->
    layout, or why not (dp must divide the expert count)."""
    params, experts = dict(model.named_parameters()), expert_parameters(model)
    layouts: dict = {}
    if not experts:
        return layouts
    for t in [1] + degrees:
        dp = devices // t
        names = ["zero3-ep"] if t == 1 else [f"megatron-tp{t}-ep", f"megatron-tp{t}-ep-sp"]
        if dp == 1 or any(e % dp for e in experts.values()):
            why = (f"expert parallelism over dp={dp} needs an expert count it divides (the model has "
                   f"{', '.join(map(str, sorted(set(experts.values()))))})")
            layouts.update({name: why for name in names})
        elif t == 1:
            pin = {n: "S(0)" if n in experts else _fsdp(p, devices) for n, p in params.items()}
            layouts["zero3-ep"] = (Mesh.of(dp=devices), pin, None, (ExpertLayout("dp", tokens="routed"),))
        else:
            pin = {**megatron_pins(model, t), **{n: "S(0),R" for n in experts}}
            mesh, ep = Mesh.of(dp=dp, tp=t), (ExpertLayout("dp", tokens="routed"),)
            layouts[names[0]] = (mesh, pin, _no_sequence_split(program, tokens, axis=1), ep)
            layouts[names[1]] = (mesh, pin, None, ((NormsOverSequence(tokens[1]),) if tokens else ()) + ep)
    return layouts


def best(plans: dict):
    """(name, plan) with the least predicted step time."""
    if not plans:
        raise AutoparError("no baseline has a plan (each was over the memory budget)")
    return min(plans.items(), key=lambda kv: kv[1].predicted.step_time_s)


def megatron_pins(model: nn.Module, tp: int, dp: int = 1) -> dict[str, str]:
    """Megatron-LM's parameter layouts as ``pin=`` for autopar.plan on a mesh (a pipeline's
    stage mesh) of axes (dp, tp): the column- and row-parallel projections and the vocabulary
    split over tp (by module name, as the baselines find them), and with dp > 1 every parameter
    also split over dp (ZeRO-3 beside tensor parallelism, as torchtitan runs FSDP with TP)."""
    return {n: _megatron(n, p, tp, dp) for n, p in model.named_parameters()}


def _megatron(fqn: str, p: torch.Tensor, tp: int, dp: int) -> str:
    module = fqn.rpartition(".")[0]
    tp_dim = None
    if p.dim() == 2 and _COLUMN.search(module):
        tp_dim = 0
    elif p.dim() == 2 and _ROW.search(module):
        tp_dim = 1
    elif p.dim() == 2 and _VOCAB.search(module) or p.dim() == 1 and fqn.endswith(".bias") and _COLUMN.search(module):
        tp_dim = 0
    if tp_dim is not None and p.shape[tp_dim] % tp != 0:
        tp_dim = None
    dp_dim = None
    if dp > 1:
        dp_dim = next((d for d in range(p.dim()) if d != tp_dim and p.shape[d] % dp == 0 and p.shape[d] > 1), None)
    return f"{_placement(dp_dim)},{_placement(tp_dim)}"


def _fsdp(p: torch.Tensor, devices: int) -> str:
    dim = next((d for d in range(p.dim()) if p.shape[d] % devices == 0 and p.shape[d] > 1), None)
    return _placement(dim)


def _placement(dim: int | None) -> str:
    return "R" if dim is None else str(Shard(dim))


def _no_sequence_split(program, tokens: tuple[int, int] | None, axis: int):
    """No value the step computes (an activation, or a position embedding made from an arange)
    split along its sequence dim on mesh axis ``axis``: Megatron without sequence parallelism.
    The sequence dim is recognised by size and place: a dim of the sequence length that is not
    the last (feature) dim of a 2-D or 3-D value, any such dim of a 4-D attention value, or a
    flattened batch x sequence dim."""
    if tokens is None:
        return None
    batch, seq = tokens
    parameters = set(program.params)

    def is_sequence_dim(shape, d: int) -> bool:
        if shape[d] == batch * seq:
            return True
        return shape[d] == seq and (d < len(shape) - 1 or len(shape) == 4)

    def allowed(node, strategy) -> bool:
        if node.name in parameters:  # pinned
            return True
        for spec, shape in zip(strategy.out_specs, _shapes(node)):
            p = spec.placements[axis]
            if isinstance(p, Shard) and p.dim < len(shape) and is_sequence_dim(shape, p.dim):
                return False
        return True

    return allowed


class _LayoutRule(Pass):
    """A baseline's rule on one mesh axis (``axis``): the nodes ``restricted`` names keep only the
    strategies ``keeps`` accepts."""

    requires = ("strategies",)
    axis: str
    what: str  # what the restricted nodes are, for the plan's history

    def run(self, program, ctx) -> str:
        axis = ctx.mesh.axis_names.index(self.axis)
        restricted = self.restricted(program, program.table("strategies"), axis)
        ctx.constraints.forbid(lambda node, strategy: node.name in restricted and not self.keeps(node, strategy, axis))
        return f"{len(restricted)} {self.what} over {self.axis}"

    def restricted(self, program, strategies: dict, axis: int) -> set:
        raise NotImplementedError

    def keeps(self, node, strategy, axis: int) -> bool:
        raise NotImplementedError


class ExpertLayout(Pass):
    """A baseline's mixture-of-experts layers (autopar.ops.moe): expert parallel over mesh axis
    ``axis``, or with ``axis`` None never (their experts whole, or sharded and gathered per use).
    ``tokens``: "routed" (split over the axis too, sent to their experts by all-to-all),
    "whole" (every token on each rank of the axis, the outputs partial sums) or None (either,
    as the solver prices them)."""

    name = "expert_layout"
    requires = ("strategies",)

    def __init__(self, axis: str | None, tokens: str | None = None):
        if tokens not in (None, "routed", "whole"):
            raise AutoparError(f"ExpertLayout(tokens={tokens!r}): the tokens are 'routed', 'whole' or None (either)")
        self.axis, self.tokens = axis, tokens

    def run(self, program, ctx) -> str:
        want = None if self.axis is None else ctx.mesh.axis_names.index(self.axis)
        layers = {n.name for n in program.gm.graph.nodes if str(n.target) in KERNEL_OPS}

        def other(node, strategy) -> bool:
            if node.name not in layers:
                return False
            if expert_axis(strategy.in_specs) != want:
                return True
            return self.tokens is not None and want is not None and \
                tokens_whole(strategy.in_specs, want) != (self.tokens == "whole")
        ctx.constraints.forbid(other)
        tokens = "" if self.tokens is None else f", tokens {self.tokens}"
        return f"{len(layers)} MoE ops " + ("with their experts whole" if want is None else
                                            f"expert parallel over {self.axis}{tokens}")


class SequenceSplit(Pass):
    """A layout whose attention calls (autopar.ops.attention) split their sequence over mesh axis
    ``axis``; ``keys``: "gathered" (inside the kernel), "whole" (by the plan's moves), or None
    (either, as the solver prices them)."""

    name = "sequence_split"
    requires = ("strategies",)

    def __init__(self, axis: str, keys: str | None = None):
        if keys not in (None, "gathered", "whole"):
            raise AutoparError(f"SequenceSplit(keys={keys!r}): the keys are 'gathered', 'whole' or None (either)")
        self.axis, self.keys = axis, keys

    def run(self, program, ctx) -> str:
        axis = ctx.mesh.axis_names.index(self.axis)

        def elsewhere(node, strategy) -> bool:
            if node.target not in ATTENTION_RULES:
                return False
            if sequence_axis(query_spec(node.target, strategy.in_specs)) != axis:
                return True
            gathered = keys_gathered(key_spec(node.target, strategy.in_specs), axis)
            return self.keys is not None and gathered != (self.keys == "gathered")

        ctx.constraints.forbid(elsewhere)
        return f"attention's sequence split over {self.axis}" + (f", its keys {self.keys}" if self.keys else "")


class BatchOverDataParallel(_LayoutRule):
    """Every activation that carries the batch (a dim of one of ``batch_sizes``: the batch, and
    batch x sequence flattened for token ids), in forward and backward, split along it over mesh axis
    ``axis``, where one of its strategies does that (an op without a rule keeps its choice)."""

    name = "batch_over_dp"
    what = "activations split along the batch"

    def __init__(self, batch_sizes: frozenset, axis: str = "dp"):
        self.batch_sizes, self.axis = batch_sizes, axis
        self.activations: set[str] = set()

    def restricted(self, program, strategies: dict, axis: int) -> set:
        activations = descendants([program.node(n) for n in program.user_inputs]) & set(strategies)
        self.activations = activations - _expert_gradients(program)
        return {name for name in self.activations
                if any(self.keeps(program.node(name), s, axis) for s in strategies[name])}

    def keeps(self, node, strategy, axis: int) -> bool:
        """The strategy reads and writes every batch-carrying value split along the batch (a
        layout that gathers an input to compute would not be data parallel). Only activations
        carry the batch: a weight's dim of the batch's size (8 experts, batch 8) does not."""
        inputs = [(spec, _shapes(arg)[0]) for spec, arg in zip(strategy.in_specs, tensor_inputs(node))
                  if arg.name in self.activations]
        outputs = list(zip(strategy.out_specs, _shapes(node)))
        if str(node.target) in KERNEL_OPS:
            outputs = outputs[:_TOKEN_OUTPUTS]
        for spec, shape in outputs + inputs:
            batch_dims = [d for d, size in enumerate(shape) if size in self.batch_sizes]
            p = spec.placements[axis]
            if batch_dims and not (isinstance(p, Shard) and p.dim in batch_dims):
                return False
        return True


# of an MoE layer's ops' outputs, those of its tokens (the rest: its expert weights' gradients)
_TOKEN_OUTPUTS = 2


def _expert_gradients(program) -> set[str]:
    """The MoE layers' expert weight gradients (autopar.ops.moe's backward's last outputs): they
    derive from the batch but carry none of it (a dim of 8 experts beside a batch of 8 is no batch)."""
    return {n.name for n in program.gm.graph.nodes if n.target is operator.getitem
            and str(n.args[0].target) in KERNEL_OPS and n.args[1] >= _TOKEN_OUTPUTS}


class NormsOverSequence(_LayoutRule):
    """Megatron's sequence parallelism (Korthikanti et al. 2022): every norm (forward and
    backward) runs on sequence shards over the ``tp`` axis, so its activations are not
    replicated over tp. A norm is an op of a module named like one (``ln_1``, ``norm``,
    ``input_layernorm``); its sequence dim is dim 1 of a value of rank 3 whose size is the
    sequence length."""

    name = "norms_over_sequence"
    what = "norm ops split along the sequence"

    def __init__(self, seq: int, axis: str = "tp"):
        self.seq, self.axis = seq, axis

    def restricted(self, program, strategies: dict, axis: int) -> set:
        return {name for name, path in module_paths(program).items()
                if name in strategies and _NORM.search(path) and self.carries_sequence(program.node(name))}

    def carries_sequence(self, node) -> bool:
        return any(len(shape) == 3 and shape[1] == self.seq for shape in _shapes(node))

    def keeps(self, node, strategy, axis: int) -> bool:
        return all(spec.placements[axis] == Shard(1) for spec, shape in zip(strategy.out_specs, _shapes(node))
                   if len(shape) == 3 and shape[1] == self.seq)


def _shapes(node) -> list[tuple]:
    """Each output's global shape, () for an output that is no tensor (in step with out_specs)."""
    return [() if meta is None else meta.shape for meta in output_metas(node)]


def _call_tensors(example_inputs, kwargs: dict | None) -> list:
    """The call's inputs, positional then keyword."""
    inputs = list(example_inputs) if isinstance(example_inputs, (tuple, list)) else [example_inputs]
    return inputs + list((kwargs or {}).values())


def _batch(inputs: list) -> int:
    """The batch size: the first tensor input's dim 0."""
    first = next((x for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    if first is None:
        raise AutoparError("baselines split the batch over dp, and the example inputs hold no batched tensor")
    return int(first.shape[0])


def _tokens(inputs: list) -> tuple[int, int] | None:
    """(batch, sequence length) of the first integer input of rank 2 (token ids)."""
    for x in inputs:
        if isinstance(x, torch.Tensor) and not x.dtype.is_floating_point and x.dim() == 2:
            return int(x.shape[0]), int(x.shape[1])
    return None


def _heads_of(model: nn.Module) -> int | None:
    for module in model.modules():
        for holder in (getattr(module, "config", None), getattr(module, "cfg", None)):
            for attr in ("num_attention_heads", "n_head", "heads"):
                value = getattr(holder, attr, None)
                if isinstance(value, int):
                    return value
    return None
