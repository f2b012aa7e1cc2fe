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

A baseline whose ``dp`` does not divide the batch is left out (``skipped`` says why).

Tensor-parallel degrees are those that divide the device count, fit in a node, and
divide the attention heads (``heads``, read from the model's config when not given).
A baseline whose memory does not fit the budget is left out (``skipped`` says why).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection

import torch
from torch import nn

from autopar.capture.export import capture
from autopar.capture.module_paths import module_paths
from autopar.cost_models.hardware import get_hardware
from autopar.errors import AutoparError
from autopar.ir.mesh import Mesh
from autopar.ir.placement import Shard
from autopar.ir.precision import parse_precision
from autopar.ir.program import descendants, output_metas, tensor_inputs
from autopar.ir.request import DEFAULT_HARDWARE
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
    heads = heads or _heads_of(model)
    params = dict(model.named_parameters())
    tensors = _call_tensors(example_inputs, kwargs)
    tokens = _tokens(tensors)
    batch = _batch(tensors)
    batch_over_dp = (BatchOverDataParallel(frozenset({batch} | ({batch * tokens[1]} if tokens else set()))),)
    if program is None:  # under mixed precision the step's graph holds autocast's casts
        program = capture(model, example_inputs, kwargs=kwargs,
                          precision=parse_precision(plan_options.get("precision")))
    plan_options["kwargs"] = kwargs
    layouts = {"dp": (Mesh.of(dp=devices), {n: "R" for n in params}, None, ()),
               "zero3": (Mesh.of(dp=devices), {n: _fsdp(p, devices) for n, p in params.items()}, None, ())}
    degrees = tp_degrees if tp_degrees is not None else [
        t for t in range(2, devices + 1) if devices % t == 0 and hw.devices_per_node % t == 0
        and (heads is None or heads % t == 0)]
    for t in degrees:
        mesh = Mesh.of(dp=devices // t, tp=t)
        for fsdp in (False, True) if devices > t else (False,):
            pin = megatron_pins(model, t, devices // t if fsdp else 1)
            for sp in (False, True):
                name = f"megatron-tp{t}" + ("-fsdp" if fsdp else "") + ("-sp" if sp else "")
                layouts[name] = (mesh, pin, None if sp else _no_sequence_split(program, tokens, axis=1),
                                 (NormsOverSequence(tokens[1]),) if sp and tokens else ())
    out = Baselines()
    plan_options.setdefault("offload", False)  # the hand-written configurations hold their state on the device
    tp = max(degrees, default=1)
    pipelines = _pipelined_layouts(devices, tp, hw)
    wanted = _wanted(only, list(layouts) + list(pipelines))
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
                passes=(BatchOverDataParallel(micro_batch),) if dp > 1 else (), progress=progress,
                schedule=schedule, microbatches=m, partition="even", **plan_options)
        except AutoparError as exc:
            out.skipped[name] = str(exc)


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


class BatchOverDataParallel(_LayoutRule):
    """Every activation that carries the batch (a dim of one of ``batch_sizes``: the batch, and
    batch x sequence flattened for token ids), in forward and backward, split along it over mesh axis
    ``axis``, where one of its strategies does that (an op without a rule keeps its choice)."""

    name = "batch_over_dp"
    what = "activations split along the batch"

    def __init__(self, batch_sizes: frozenset, axis: str = "dp"):
        self.batch_sizes, self.axis = batch_sizes, axis

    def restricted(self, program, strategies: dict, axis: int) -> set:
        activations = descendants([program.node(n) for n in program.user_inputs]) & set(strategies)
        return {name for name in activations
                if any(self.keeps(program.node(name), s, axis) for s in strategies[name])}

    def keeps(self, node, strategy, axis: int) -> bool:
        """The strategy reads and writes every batch-carrying value split along the batch (a
        layout that gathers an input to compute would not be data parallel)."""
        inputs = [_shapes(arg)[0] for arg in tensor_inputs(node)]
        for spec, shape in list(zip(strategy.out_specs, _shapes(node))) + list(zip(strategy.in_specs, inputs)):
            batch_dims = [d for d, size in enumerate(shape) if size in self.batch_sizes]
            p = spec.placements[axis]
            if batch_dims and not (isinstance(p, Shard) and p.dim in batch_dims):
                return False
        return True


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
