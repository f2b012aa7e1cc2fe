"""Run a pipelined plan's stage programs under torch.distributed.pipelining's schedules.

Each stage this rank holds runs its programs through torch's ``PipelineStage`` under the
plan's schedule (GPipe, 1F1B, interleaved, zero-bubble, DualPipeV): autopar.runtime.stage_runner.

Inputs: stage 0 receives from the schedule only each micro-batch's index (torch's schedule
splits every argument it is given along dim 0, and a tensor without the batch dim, position
ids of shape [1, S], say, must reach every micro-batch whole); the runner takes the micro-batch
from the call's tensors itself: rows of those that carry the batch, the others whole. With
inputs="local" each rank passes its data-parallel block of the batch, and micro-batch k is made
of every block's k-th m-th (the whole batch's rows in another order: the loss is the mean over
all rows, and each micro-batch's mean divides by as many, so the step is the same):
autopar.runtime.microbatch_inputs.

Tied weights (Megatron's embedding group): a parameter read on two stages (an embedding and a
head that reads its weight) was captured as one copy per name (autopar.capture.capture's
untie_tied), each stage holds its own, and after the schedule's last micro-batch the ranks add
their copies' gradients over the pipeline group, so every copy takes the same gradient and, from
the same values, the same optimizer step (autopar.runtime.stage_state, which also holds each
rank's stages' parameters).

Modes: a plan is captured in its modules' train/eval modes (dropout, BatchNorm's statistics).
A call in other modes (``model.eval()`` for validation) runs another plan of the model, made in
those modes on the same stages, schedule and parameter layouts, so it reads the parameters where
they live; autoparallelize's planner makes it at the first such call.

The step's gradients wait until the returned loss's backward, which hands them to the
parameters' ``.grad``.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError, PlanMismatchError, user_stacklevel
from autopar.ir.call import FlatCall, flatten_call, module_modes
from autopar.ir.plan import Plan
from autopar.lowering.stages import StageProgram, stage_programs
from autopar.runtime.checkpoint_options import register_pipelined_model
from autopar.runtime.clipping import register_pipelined
from autopar.runtime.microbatch_dropout import MicrobatchMasks
from autopar.runtime.microbatch_inputs import MicrobatchInputs, microbatch_inputs
from autopar.runtime.program import batch_blocks, check_local_batches, global_call, load_program, program_identity
from autopar.runtime.rank_mesh import RankMesh
from autopar.runtime.stage_offload import HostStageState
from autopar.runtime.stage_runner import StageRunner, kfac_work, torch_schedule
from autopar.runtime.stage_state import hold_own_state, tied_copies, whole_stand_in
from autopar.runtime.state import as_dtensor

# (model, call, layouts, pipeline) -> (plan, source): the model's step in its current modes,
# planned with its parameters and buffers in ``layouts`` (name -> placements text) and the
# first plan's stages, schedule and micro-batches (a Pipeline)
PipelinePlanner = Callable[..., tuple[Plan, str]]


class PipelinedModule(nn.Module):
    """A model whose pipelined plan this rank runs, called as the model is: ``loss =
    module(*args, **kwargs)`` runs the whole batch through the plan's schedule (every
    micro-batch's forward and backward) and returns the loss on every rank; ``loss.backward()``
    then hands each of this rank's parameters its gradient, scaled by the gradient backward
    seeds the loss with (as autograd would: a GradScaler's scale, a loss weight), and calls
    without ``backward`` leave ``.grad`` alone. Under ``torch.no_grad()`` a call runs the
    forwards alone. This rank holds only its stages' parameters (DTensors on its stage's
    mesh); the others are dropped (None), so an optimizer built
    afterwards on ``model.parameters()`` steps this rank's."""

    def __init__(self, model: nn.Module, plan: Plan, rank_mesh: RankMesh, source: str, local_inputs: bool = False,
                 init: Callable[[nn.Module], None] | None = None, compile: bool = False,
                 planner: PipelinePlanner | None = None):
        """``local_inputs``: each rank passes its block of the batch (dim 0, split over the
        stage mesh's "dp" axes, as autopar.data_parallel_info says), not the whole batch.
        ``init``: how rank 0 initializes a module of a model on the meta device (see
        hold_own_state). ``compile``: the stages' programs run through torch.compile.
        ``planner``: plans the model in other modes (see the module's docstring); None
        refuses calls in other modes."""
        super().__init__()
        from autopar.runtime.module import agree_on_plan, check_plan_matches

        check_plan_matches(plan, model)
        if rank_mesh.pipeline_group is None:
            raise AutoparError(f"plan {plan.hash} has {plan.pipeline.pp} pipeline stages: build the RankMesh with "
                               f"pipeline_stages={plan.pipeline.pp}")
        if compile and plan.pipeline.fill is not None:
            raise AutoparError(f"plan {plan.hash} fills its pipeline's bubbles with {plan.pipeline.fill.optimizer} "
                               f"work, which reads the programs' operands from Python between them: run it without "
                               f"compile=True")
        agree_on_plan(rank_mesh, plan)
        self.model, self.plan, self.rt = model, plan, rank_mesh
        self.planner, self.compile = planner, compile
        self.given = batch_blocks(plan.mesh) if local_inputs else None
        programs = stage_programs(plan)
        mine = _mine(plan, programs, rank_mesh)
        # an offloaded pipeline's parameters live in host memory in every mode it is called in
        self.host = HostStageState(rank_mesh.device) if plan.pipeline.offload is not None else None
        self.params, self.buffers = hold_own_state(model, plan, programs, mine, rank_mesh, init, self.host)
        first = _PlanRun(self, plan, source, programs, mine)
        self.runs = {plan.graph.modes: first}  # the model's modes -> the plan this rank runs in them
        self.kfac = first.kfac
        # clip_grad_norm_ takes the whole model's norm: a tied weight's copy counts on one rank only
        elsewhere = [self.params[name] for copies in first.tied if copies.names[0] not in copies.held
                     for name in copies.held]
        register_pipelined(self.params.values(), rank_mesh.pipeline_group, elsewhere, self.kfac is not None)
        register_pipelined_model(model)  # its optimizer's state dict keyed by parameter name, for DCP
        graph = plan.graph
        # later plans (other modes) lay the parameters and buffers out where this one put them
        self.layouts = {fqn: plan.out_spec(ph).to_json() for ph, fqn in {**graph.params, **graph.buffers}.items()}
        self.anchor = torch.zeros((), requires_grad=True)  # what makes the returned loss differentiable
        self.warned_missing = False

    def forward(self, *args, **kwargs):
        call = flatten_call(args, kwargs)
        if self.given is not None:
            check_local_batches(call, self.rt)
        return self._run_for(call).step(call)

    def _run_for(self, call: FlatCall) -> _PlanRun:
        """The plan for the model's current modes, planned now where none is."""
        modes = module_modes(self.model)
        run = self.runs.get(modes)
        if run is None:
            run = self.runs[modes] = self._new_run(call)
        return run

    def _new_run(self, call: FlatCall) -> _PlanRun:
        if self.planner is None:
            raise PlanMismatchError(f"the model's modules are in other train/eval modes than plan {self.plan.hash} "
                                    f"was made for, and this pipelined module has no planner: run it through "
                                    f"autopar.autoparallelize, which plans the pipeline in each mode it is called "
                                    f"in, or call it in the plan's modes")
        if self.kfac is not None and torch.is_grad_enabled():
            raise AutoparError(f"plan {self.plan.hash} runs K-FAC in its pipeline's bubbles, in the modes it was "
                               f"planned in: train in those modes, or call the model under torch.no_grad()")
        planned = call if self.given is None else global_call(call, self.plan.mesh)
        plan, source = self.planner(whole_stand_in(self.model, self.plan), planned, dict(self.layouts),
                                    self.plan.pipeline)
        programs = stage_programs(plan)
        mine = _mine(plan, programs, self.rt)
        needed = {plan.graph.params[ph] for p in mine for ph in p.placeholders if ph in plan.graph.params}
        if not needed <= set(self.params):
            raise AutoparError(f"in its current modes the model's stages on this rank read "
                               f"{sorted(needed - set(self.params))}, which the pipeline keeps on other ranks: call "
                               f"it in the modes it was planned in")
        return _PlanRun(self, plan, source, programs, mine)

    def take_busy_seconds(self) -> float:
        """Seconds this rank spent in its stages' programs since the last call (the rest of a
        step's time is its bubble and its waits for P2P)."""
        busy = 0.0
        for run in self.runs.values():
            for r in run.runners:
                busy, r.busy_s = busy + r.busy_s, 0.0
        return busy

    @contextlib.contextmanager
    def no_sync(self):
        """DDP's ``no_sync``, for accumulating several calls' gradients in ``.grad``: every call
        adds its own, synced (see require_gradient_sync)."""
        yield

    @property
    def require_gradient_sync(self) -> bool:
        return True

    @require_gradient_sync.setter
    def require_gradient_sync(self, value: bool) -> None:
        """Under no_sync() a call's gradients are still synced, once, at its last micro-batch:
        .grad then adds up every call's, as DDP's accumulation does. Deferring them to the next
        call would need each call's backward seed (a loss weight) before that call's sync, which
        the schedule runs before backward hands the seed over; a pipeline already syncs once per
        m micro-batches."""


class _PlanRun:
    """One plan's stage programs on this rank, run under its schedule: a step (or, under
    no_grad, the forwards alone) over the module's parameters."""

    def __init__(self, module: PipelinedModule, plan: Plan, source: str, programs: list[StageProgram],
                 mine: list[StageProgram]):
        self.module, self.plan, self.rt = module, plan, module.rt
        code = load_program(source, f"autopar_pipeline_{plan.hash}")
        self.runners = [StageRunner(plan, p, code, self.rt, module.params, module.buffers, module.given,
                                    module.compile, module.host) for p in mine]
        self.kfac = kfac_work(plan, self.rt, mine, module.params, self.runners)
        self.schedule = torch_schedule(plan, self.runners, self.rt)
        self.tied = tied_copies(plan, programs, mine)
        self.last_rank = _pipeline_peer(self.rt, plan.pipeline.stages[-1].rank)
        self.last_values = programs[-1].values  # the outputs the last stage computes
        self.agreed = False
        self.masks: MicrobatchMasks | None = None  # made at the first call, which tells the micro-batch's rows
        self.rows = 0  # a micro-batch's rows (the first call tells)
        self.blocks = None if module.given is None else plan.mesh.data_parallel(0)[1]  # data-parallel blocks given

    def step(self, call: FlatCall):
        """The model's output for ``call``: its loss (differentiable where grad is on) and values."""
        inputs = microbatch_inputs(self.plan, call, self.rt.device, self.module.given is not None)
        self._draw_dropout_masks(inputs)
        if not self.agreed:  # every rank must run the same plan, for the same call
            self.rt.agree("the plan and program they run", program_identity(self.plan, call.signature))
            self.agreed = True
        m = self.plan.pipeline.microbatches
        losses: list = []
        # torch's schedule splits its arguments and target into micro-batches: stage 0 takes the
        # index of its micro-batch, and the loss function takes no target (the stage program
        # computes the loss), so the target is a placeholder of m rows
        index, target = torch.arange(m, device=self.rt.device), torch.zeros(m)
        staged = {}
        for runner in self.runners:
            runner.begin_step(staged, inputs)
        if not torch.is_grad_enabled():
            self.schedule.eval(index, target=target, losses=losses, return_outputs=False)
            self._check_microbatches_alike()
            return self._output(self._whole_loss(losses))
        if self.kfac is not None:
            self.kfac.begin_step()
        self.schedule.step(index, target=target, losses=losses, return_outputs=False)
        self._check_microbatches_alike()
        for copies in self.tied:
            copies.sum_gradients(staged, self.rt)
        if self.kfac is not None:
            self.kfac.end_step(staged)
        loss = _StagedGradients.apply(self._whole_loss(losses), self.module.anchor, self.runners, staged, self.kfac)
        return self._output(loss)

    def _draw_dropout_masks(self, inputs: MicrobatchInputs) -> None:
        """This step's dropout masks, every rank drawing them all as eager would (see
        autopar.runtime.microbatch_dropout), handed to this rank's stages."""
        if self.masks is None:
            self.rows = next(self.plan.graph.node(ph).outputs[0].shape[0]
                             for ph, split in zip(self.plan.graph.inputs, inputs.split) if split)
            self.masks = MicrobatchMasks(self.plan, [r.program for r in self.runners], self.rows, self.blocks)
            for runner in self.runners:
                runner.masks = self.masks
        self.masks.draw(self.rt.device)

    def _output(self, loss: torch.Tensor):
        """What the model returns, with the batch's loss in its place and its other outputs
        (logits) for the whole batch, where the last stage computes them with the batch in dim
        0 (_whole_values); the others come back as None, said once."""
        tree = self.plan.graph.output_tree
        if tree is None:
            return loss
        values = self._whole_values()
        missing = [name for name, value in zip(tree.value_names, values) if value is None] + tree.dropped
        if missing and not self.module.warned_missing:
            self.module.warned_missing = True
            warnings.warn(f"{', '.join(missing)} of the pipelined model's output come back as None: a pipeline "
                          f"returns the outputs its last stage computes with the batch in dim 0 (for a Hugging "
                          f"Face model, pass use_cache=False)", stacklevel=user_stacklevel())
        return tree.rebuild(loss, values)

    def _whole_values(self) -> list:
        """Each of the model's other outputs for the whole batch on every rank, as a DTensor
        replicated over its stage's mesh (the same global value as the flat runtime's): the
        last stage's ranks gather each micro-batch's over their mesh, put the micro-batches'
        rows back in the batch's order, and broadcast the result over the pipeline. None for
        one the last stage does not compute, or whose dim 0 is not the micro-batch's rows."""
        from torch.distributed.tensor import Replicate

        graph, m = self.plan.graph, self.plan.pipeline.microbatches
        last = next((r for r in self.runners if r.program.index == len(self.plan.pipeline.stages) - 1), None)
        computed = self.last_values
        out = []
        for name in graph.values:
            meta = graph.node(name).outputs[0]
            if name not in computed or not meta.shape or meta.shape[0] != self.rows:
                out.append(None)
                continue
            if last is not None:
                index = computed.index(name)
                parts = [as_dtensor(values[index], self.rt.device_mesh, self.plan.out_spec(name).to_dtensor(),
                                    meta.shape).full_tensor() for values in last.values]
                whole = self._in_batch_order(torch.stack(parts))
            else:
                whole = torch.empty([meta.shape[0] * m, *meta.shape[1:]], dtype=getattr(torch, meta.dtype),
                                    device=self.rt.device)
            dist.broadcast(whole, src=self.last_rank, group=self.rt.pipeline_group)
            out.append(DTensor.from_local(whole, self.rt.device_mesh, [Replicate()] * self.rt.device_mesh.ndim,
                                          run_check=False))
        return out

    def _in_batch_order(self, microbatches: torch.Tensor) -> torch.Tensor:
        """[m, rows, ...] -> the batch's [m * rows, ...]: micro-batch k is the batch's k-th m-th,
        or (inputs="local") every data-parallel block's k-th part."""
        if self.blocks is None:
            return microbatches.flatten(0, 1)
        return microbatches.unflatten(1, (self.blocks, -1)).transpose(0, 1).flatten(0, 2)

    def _check_microbatches_alike(self) -> None:
        """Refuse a step whose micro-batches' mean losses divide by different counts (targets
        at ignore_index): the mean of their means is not the batch's mean then. Every rank
        learns of it, so all raise."""
        values = [v for r in self.runners for v in r.normalizer_values]
        differ = bool(values) and bool((torch.stack(values) != values[0]).any())
        uneven = torch.tensor([float(differ)], device=self.rt.device)  # on the device NCCL reduces
        dist.all_reduce(uneven, op=dist.ReduceOp.MAX)
        if uneven.item():
            raise AutoparError("the micro-batches of this batch hold different numbers of labelled targets (labels at "
                               "the loss's ignore_index, e.g. padding): each micro-batch's mean loss divides by its "
                               "own count, so their mean would not be the batch's mean; give every micro-batch as "
                               "many labelled targets, or plan without 'pp'")

    def _whole_loss(self, losses: list) -> torch.Tensor:
        """The batch's loss, on every rank (the last stage's ranks computed it)."""
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=self.rt.device)
        dist.broadcast(loss, src=self.last_rank, group=self.rt.pipeline_group)
        return loss


class _StagedGradients(torch.autograd.Function):
    """The loss of a step whose gradients the schedule computed already: its backward scales
    them by the loss's incoming gradient (they are linear in it) and adds them to ``.grad``."""

    @staticmethod
    def forward(ctx, loss, anchor, runners, staged, kfac):
        ctx.runners, ctx.staged, ctx.kfac = runners, staged, kfac
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.staged is None:
            raise RuntimeError("this pipelined step's gradients were handed out already (retain_graph is not "
                               "supported): call the model again")
        staged, ctx.staged = ctx.staged, None
        for runner in ctx.runners:
            runner.hand_gradients(staged, grad_loss)
        if ctx.kfac is not None:  # the KL clip weighs the gradients .grad holds
            ctx.kfac.seed = float(grad_loss)
        return None, None, None, None, None


def _pipeline_peer(rt: RankMesh, pipeline_rank: int) -> int:
    """The global rank at ``pipeline_rank`` on this rank's pipeline (same place on the other axes)."""
    return dist.get_global_rank(rt.pipeline_group, pipeline_rank)


def _mine(plan: Plan, programs: list[StageProgram], rt: RankMesh) -> list[StageProgram]:
    """The stage programs this rank runs: those of the stages on its pipeline rank."""
    return [p for p in programs if plan.pipeline.stages[p.index].rank == rt.pipeline_rank]
