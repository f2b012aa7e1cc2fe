"""What a pipeline rank holds of its model: its stages' parameters and buffers, and the copies
of tied weights that several stages read.

A rank of a pipelined plan keeps only its stages' blocks (DTensors on its stage's mesh) and
drops every other parameter and buffer, as a torchtitan pipeline rank holds its model chunk.
A weight read on two stages (an embedding and the head that reads its weight) is held on both
(Megatron's embedding group); its copies' gradients are added over the pipeline group once per
step, so every copy takes the same optimizer step.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError
from autopar.ir.plan import Plan
from autopar.lowering.stages import StageProgram
from autopar.runtime.rank_mesh import RankMesh
from autopar.runtime.replaced import adopt_replacements, remember_replaced
from autopar.runtime.stage_offload import HostStageState


def hold_own_state(model: nn.Module, plan: Plan, programs: list[StageProgram], mine: list[StageProgram],
                   rt: RankMesh, init: Callable[[nn.Module], None] | None,
                   host: HostStageState | None = None) -> tuple[dict, dict]:
    """This rank's stages' parameters and buffers as DTensors of its blocks; every other
    parameter and buffer is dropped (None, as a Linear without bias holds), so the model's
    parameters, state dict and checkpoint on this rank are its stages' own, as a torchtitan
    pipeline rank's model chunk. Where every rank holds the model's values, each takes its
    blocks from its own copy (which must be alike: checked); where any holds it on the meta
    device, rank 0 sends each rank its blocks, of its own values or of ``init`` run on one
    module at a time (autopar.runtime.state.distribute), so they equal a single-process
    initialization from rank 0's random state. ``host``: the parameters' blocks live in host
    memory (an offloaded pipeline's). (name -> parameter, name -> buffer) of the ones it holds."""
    from autopar.runtime.state import distribute

    graph = plan.graph
    held = {ph for p in mine for ph in p.placeholders}
    params = {fqn: plan.out_spec(ph) for ph, fqn in graph.params.items() if ph in held}
    buffers = {fqn: plan.out_spec(ph) for ph, fqn in graph.buffers.items() if ph in held}
    in_host = None if host is None else _parameters_in(host, plan)
    if _any_rank_on_meta(model, rt.device):
        distribute(model, {fqn: plan.out_spec(ph) for ph, fqn in graph.params.items()},
                   {fqn: plan.out_spec(ph) for ph, fqn in graph.buffers.items()}, plan.mesh, rt, init=init,
                   holders=_holders(plan, programs, rt), host=in_host)
    else:
        _check_models_agree(model, rt.device)
        distribute(model, params, buffers, plan.mesh, rt, own_copy=True, host=in_host)
    # every name of a tied weight (a copy per stage that reads it) that this rank does not hold
    for fqn, p in list(model.named_parameters(remove_duplicate=False)):
        if fqn not in params:
            _owner(model, fqn)._parameters[fqn.rpartition(".")[2]] = None
            if not isinstance(p.data, DTensor):  # the model's own, not the copy this rank holds
                remember_replaced(p, fqn, None)
    for fqn, _ in list(model.named_buffers(remove_duplicate=False)):
        if fqn not in buffers:
            _owner(model, fqn)._buffers[fqn.rpartition(".")[2]] = None
    adopt_replacements()  # an optimizer built before: this rank's parameters in place of the model's
    named = dict(model.named_parameters(remove_duplicate=False))
    return {fqn: named[fqn] for fqn in params}, {fqn: model.get_buffer(fqn) for fqn in buffers}


def _parameters_in(host: HostStageState, plan: Plan) -> Callable[[str, tuple], torch.Tensor | None]:
    """(name, block shape) -> the host memory for that parameter's block (None: a buffer, which
    stays on the device), as autopar.runtime.state.distribute takes it."""
    dtypes = {fqn: getattr(torch, plan.graph.node(ph).outputs[0].dtype) for ph, fqn in plan.graph.params.items()}

    def block(name: str, shape: tuple) -> torch.Tensor | None:
        return host.host_block(shape, dtypes[name]) if name in dtypes else None
    return block


def _holders(plan: Plan, programs: list[StageProgram], rt: RankMesh) -> dict[str, frozenset[int]]:
    """Each parameter's and buffer's name -> the global ranks that hold it: every rank of the
    pipeline ranks whose stages read it (for a tied weight, any of its names: they are one
    tensor in the model, made once)."""
    graph, pipeline = plan.graph, plan.pipeline
    names = {**graph.params, **graph.buffers}
    reading: dict[str, set[int]] = {}
    for p in programs:
        for ph in p.placeholders:
            if ph in names:
                reading.setdefault(names[ph], set()).add(pipeline.stages[p.index].rank)
    tie_ranks: dict[str, set[int]] = {}  # a tied weight's primary name (a name alone) -> its pipeline ranks
    for name, ranks in reading.items():
        tie_ranks.setdefault(graph.tied.get(name, name), set()).update(ranks)
    return {name: frozenset(r for r in range(rt.whole.size) if rt.whole.coords(r)[0] in
                            tie_ranks[graph.tied.get(name, name)])
            for name in reading}


def _any_rank_on_meta(model: nn.Module, device) -> bool:
    on_meta = any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    flag = torch.tensor([float(on_meta)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _owner(model: nn.Module, fqn: str) -> nn.Module:
    return model.get_submodule(fqn.rpartition(".")[0])


def _check_models_agree(model: nn.Module, device: torch.device) -> None:
    """Every rank takes its blocks from its own copy of the model: refuse copies that differ
    (built without a common seed, say), which would train a model no rank was given."""
    with torch.no_grad():
        sums = [float(t.double().sum()) for t in list(model.parameters()) + list(model.buffers())
                if not t.is_meta and t.is_floating_point()]
    mine = torch.tensor([len(sums), sum(sums), sum(abs(x) for x in sums)], dtype=torch.float64, device=device)
    lowest, highest = mine.clone(), mine.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    if not torch.allclose(lowest, highest, rtol=1e-12, atol=0.0):
        raise AutoparError("a pipelined model takes each rank's parameters from its own copy of the model, and the "
                           "ranks' copies differ: build the model on every rank from the same seed (torch.manual_seed "
                           "before constructing it), or load the same checkpoint on every rank")


class TiedCopies:
    """The names of one tied weight in a pipelined plan, and the local block of its gradient."""

    def __init__(self, names: list[str], held: list[str], shape: tuple, dtype: str):
        self.names, self.held, self.shape, self.dtype = names, held, shape, dtype

    def sum_gradients(self, staged: dict, rt: RankMesh) -> None:
        """Every copy's gradient, added over the pipeline group, in place of this rank's: under the
        first name it holds (the copies it holds are one parameter here, whose gradient they share)."""
        mine = [staged.pop(name) for name in self.held if name in staged]
        total = sum(mine[1:], mine[0]) if mine else torch.zeros(self.shape, dtype=getattr(torch, self.dtype),
                                                                 device=rt.device)
        # ranks that hold no copy add zeros: the pipeline group is every rank's, so no group per tie;
        # reduced on the device, where an offloaded pipeline's gradients are in host memory
        summed = total.to(rt.device)
        dist.all_reduce(summed, group=rt.pipeline_group)
        if self.held:
            staged[self.held[0]] = summed.to(total.device)


def tied_copies(plan: Plan, programs: list[StageProgram], mine: list[StageProgram]) -> list[TiedCopies]:
    """The tied weights whose copies lie on more than one pipeline rank, in one order on every rank."""
    graph, pipeline = plan.graph, plan.pipeline
    placeholder_of = {fqn: ph for ph, fqn in graph.params.items()}
    stage_of = {graph.params[ph]: p.index for p in programs for ph in p.placeholders
                if ph in graph.params}
    held = {graph.params[ph] for p in mine for ph in p.placeholders if ph in graph.params}
    names: dict[str, list[str]] = {}
    for alias, primary in sorted(graph.tied.items()):
        names.setdefault(primary, [primary]).append(alias)
    found = []
    for primary, group in sorted(names.items()):
        if len({pipeline.stages[stage_of[n]].rank for n in group if n in stage_of}) < 2:
            continue  # one rank holds every copy: they are one parameter there, whose gradient adds them
        ph = placeholder_of[primary]
        meta = graph.node(ph).outputs[0]
        shape = tuple(plan.out_spec(ph).local_shape(meta.shape, plan.mesh))
        found.append(TiedCopies(group, [n for n in group if n in held], shape, meta.dtype))
    return found


def whole_stand_in(model: nn.Module, plan: Plan) -> nn.Module:
    """A copy of ``model`` with every parameter and buffer ``plan`` names, in its whole shape on
    the meta device, and its tied names one tensor again (this rank holds only its stages'
    blocks, and a copy of a tied weight per stage): what a plan of the model in other modes is
    captured from."""

    def meta(shape, dtype, requires_grad=None):
        empty = torch.empty(tuple(shape), dtype=dtype, device="meta")
        return empty if requires_grad is None else nn.Parameter(empty, requires_grad=requires_grad)

    graph = plan.graph
    memo = {id(p): meta(p.shape, p.dtype, p.requires_grad) for p in model.parameters()}
    memo.update({id(b): meta(b.shape, b.dtype) for b in model.buffers()})
    stand_in = copy.deepcopy(model, memo)
    for ph, fqn in graph.params.items():
        if fqn not in graph.tied and _slot(stand_in, fqn) is None:
            out = graph.node(ph).outputs[0]
            setattr(_owner(stand_in, fqn), fqn.rpartition(".")[2],
                    meta(out.shape, getattr(torch, out.dtype), fqn not in graph.frozen))
    for alias, primary in graph.tied.items():
        setattr(_owner(stand_in, alias), alias.rpartition(".")[2], _slot(stand_in, primary))
    for ph, fqn in graph.buffers.items():
        if _slot(stand_in, fqn) is None:
            out = graph.node(ph).outputs[0]
            _owner(stand_in, fqn).register_buffer(fqn.rpartition(".")[2], meta(out.shape, getattr(torch, out.dtype)))
    return stand_in


def _slot(model: nn.Module, fqn: str):
    """The parameter or buffer named ``fqn``, or None where the rank dropped it."""
    return getattr(_owner(model, fqn), fqn.rpartition(".")[2])
