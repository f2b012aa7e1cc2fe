"""Run a pipelined plan's stage programs under torch.distributed.pipelining's schedules.

Each stage this rank holds becomes a ``PipelineStage`` (torch's) whose submodule runs the
stage's forward program inside an autograd Function; torch's schedule (GPipe, 1F1B,
interleaved, zero-bubble, DualPipeV: the plan's) calls the stages' forward and backward for
every micro-batch, sends activations and their gradients between stages over its P2P, and
orders the actions. The Function's backward runs the stage's input-gradient program (I) with
the backward values the next stage sent back (autopar.lowering.stages: they ride in the
gradients of the values sent forward), so autograd never traces the programs; the
weight-gradient program (W) is what the stage's ``dw_builder`` hands torch, which runs it
right away or, in a zero-bubble schedule, in a later bubble.

Inputs: stage 0 receives from the schedule only each micro-batch's index (torch's schedule
splits every argument it is given along dim 0, and a tensor without the batch dim, position
ids of shape [1, S], say, must reach every micro-batch whole); the runner takes the micro-batch
from the call's tensors itself: rows of those that carry the batch, the others whole. With
inputs="local" each rank passes its data-parallel block of the batch, and micro-batch k is made
of every block's k-th m-th (the whole batch's rows in another order: the loss is the mean over
all rows, and each micro-batch's mean divides by as many, so the step is the same):
autopar.runtime.microbatch_inputs.

Static metadata: every slot's local shape and dtype are known from the plan, so each
``PipelineStage`` is built with its inputs' and outputs' examples and needs no shape-inference
round before the first step. A slot that carries no backward value is sent without a gradient.

Tied weights (Megatron's embedding group): a parameter read on two stages (an embedding and a
head that reads its weight) was captured as one copy per name (autopar.capture.capture's
untie_tied), each stage holds its own, and after the schedule's last micro-batch the ranks add
their copies' gradients over the pipeline group, so every copy takes the same gradient and, from
the same values, the same optimizer step (autopar.runtime.stage_state, which also holds each
rank's stages' parameters).

Gradients: each micro-batch's loss weighs 1/m (the loss function the schedule runs divides by
m), so the step's gradient is the mean of the micro-batches', as eager's mean over the whole
batch. Each stage's W keeps local gradients for every micro-batch but its last, which adds
them and runs the gradient collectives once (as DDP's no_sync). The step's gradients wait
until the returned loss's backward, which hands them to the parameters' ``.grad``.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.errors import AutoparError, PlanMismatchError, user_stacklevel
from autopar.ir.call import flatten_call, module_modes
from autopar.ir.placement import Spec
from autopar.ir.plan import Plan
from autopar.lowering.stages import StageProgram, stage_programs
from autopar.runtime.checkpoint_options import register_pipelined_model
from autopar.runtime.clipping import register_pipelined
from autopar.runtime.kfac import KfacWork
from autopar.runtime.microbatch_dropout import MicrobatchMasks
from autopar.runtime.microbatch_inputs import MicrobatchInputs, microbatch_inputs
from autopar.runtime.program import (
    COMPILE_OPTIONS,
    batch_blocks,
    check_local_batches,
    load_program,
    program_identity,
)
from autopar.runtime.rank_mesh import RankMesh, local_shard
from autopar.runtime.stage_state import hold_own_state, tied_copies
from autopar.runtime.state import as_dtensor, as_gradient, local
from autopar.runtime.traced_collectives import TracedCollectives

# the schedules whose class runs one stage per rank (the others take a list)
_SINGLE_STAGE = ("GPipe", "1F1B")


class StageRunner:
    """One stage's programs on this rank, called by its autograd Function."""

    def __init__(self, plan: Plan, program: StageProgram, module, rt: RankMesh, params: dict, buffers: dict,
                 given: Spec | None = None, compiled: bool = False):
        """``given``: the layout the call's tensors are in, where each rank passes its block
        (inputs="local"); None: they are whole. ``compiled``: the stage's programs run through
        torch.compile, as the flat runtime's do (autopar.runtime.program.RankProgram), their
        collectives functional ones inside the graphs."""
        self.plan, self.program, self.given = plan, program, given
        self.rt = TracedCollectives(rt) if compiled else rt  # what the programs call
        self.rank_mesh = rt
        functions = [getattr(module, f"{kind}_{program.index}") for kind in ("forward", "backward_input",
                                                                             "backward_weight")]
        if compiled:
            functions = [torch.compile(f, options=COMPILE_OPTIONS) for f in functions]
        self.forward_fn, self.input_fn, self.weight_fn = functions
        graph = plan.graph
        self.params = {fqn: params[fqn] for ph, fqn in graph.params.items() if ph in program.placeholders}
        self._placeholder_sources = [(ph, graph.params.get(ph), graph.buffers.get(ph)) for ph in program.placeholders]
        self._buffers = buffers
        self._input_index = {ph: i for i, ph in enumerate(graph.inputs)}
        self.inputs: MicrobatchInputs | None = None  # this step's call (stage 0 reads it)
        self.microbatches = plan.pipeline.microbatches
        self.weights = 0  # weight-gradient runs this step: the last one syncs
        self.pending: list = []  # what each backward left for its weight gradients, oldest first
        self.unsynced: dict = {}  # parameter -> local gradient summed over this step's earlier micro-batches
        self.staged: dict = {}  # parameter -> this step's gradient, until the loss's backward hands it out
        self.busy_s = 0.0  # seconds in its programs since the module's last reset: a bubble is the rest
        self._normalizers = [program.saved.index(v) for v in program.normalizers]
        self.normalizer_values: list[torch.Tensor] = []  # this step's, per micro-batch
        self.kfac = None  # autopar.runtime.kfac.KfacWork, under a K-FAC plan: runs its work after actions
        self.masks: MicrobatchMasks | None = None  # this step's dropout masks, as eager draws them
        self.values: list[list[torch.Tensor]] = []  # per micro-batch of this step: the model's other outputs
        self.counts = {"F": 0, "I": 0, "W": 0}  # this step's actions so far: the next one's micro-batch

    def begin_step(self, staged: dict, inputs: MicrobatchInputs) -> None:
        self.staged, self.normalizer_values, self.inputs, self.values = staged, [], inputs, []
        self.counts = dict.fromkeys(self.counts, 0)

    def _done(self, kind: str) -> None:
        """Count an action of ``kind`` as done and run the work placed after it."""
        microbatch = self.counts[kind]
        self.counts[kind] += 1
        if self.kfac is not None:
            label = f"{self.program.index}{{}}{microbatch}"
            for done in ("W", "B") if kind == "W" else (kind,):  # a full backward (B) ends with its W
                self.kfac.after(label.format(done), self.staged)

    def placeholders(self, inputs: list) -> list:
        """The forward program's placeholders: parameters' and buffers' blocks, and (stage 0)
        this rank's block of each model input of the micro-batch (``inputs``)."""
        out = []
        for ph, param, buffer in self._placeholder_sources:
            if param is not None:
                out.append(local(self.params[param]).detach())
            elif buffer is not None:
                out.append(local(self._buffers[buffer]))
            elif self.given is None:
                out.append(local_shard(inputs[self._input_index[ph]], self.plan.out_spec(ph), self.plan.mesh,
                                       self.rank_mesh.coords))
            else:
                out.append(self.rank_mesh.redistribute(inputs[self._input_index[ph]], self.given,
                                                       self.plan.out_spec(ph)))
        return out

    def forward(self, received: tuple):
        """(the stage's outputs for the schedule, what its backward needs)."""
        first = self.program.index == 0
        start = time.perf_counter()
        args = self.placeholders(self.inputs.microbatch(int(received[0])) if first else [])
        self.rank_mesh.given_masks = iter(self.masks.for_microbatch(self.program.index, self.counts["F"]))
        try:
            loss, sends, saved, values = self.forward_fn(self.rt, *args, *(() if first else received))
        finally:
            self.rank_mesh.given_masks = None
        if values:
            self.values.append([v.detach() for v in values])
        self.busy_s += time.perf_counter() - start
        kept = [a for a, ph in zip(args, self.program.placeholders) if ph not in self.program.inputs]
        self.normalizer_values += [saved[i].detach() for i in self._normalizers]
        self._done("F")
        return (loss if self.program.loss is not None else tuple(sends)), (kept, saved)

    def backward(self, state, grads: tuple) -> tuple:
        """The input gradient's part of backward (I): the backward values for the stage before,
        one per received slot (None where its slot carries none). What the weight gradients
        need waits in ``pending`` for ``weight_work``."""
        kept, saved = state
        if self.program.loss is not None:
            grads_in, grad_loss = [], grads[0]
        else:
            grads_in, grad_loss = [g for g, slot in zip(grads, self.program.sends) if slot.differentiable], None
        start = time.perf_counter()
        sent_back, for_weights = self.input_fn(self.rt, *kept, saved, grads_in, grad_loss)
        self.busy_s += time.perf_counter() - start
        self.pending.append((kept, for_weights, grad_loss))
        self._done("I")
        if self.program.index == 0:  # it received the micro-batch's index
            return (None,)
        back = iter(sent_back)
        return tuple(next(back) if slot.differentiable else None for slot in self.program.receives)

    def weight_work(self):
        """The weight gradients of the oldest backward (W), to run now or in a later bubble:
        torch's PipelineStage asks for it right after each backward (its ``dw_builder``)."""
        kept, for_weights, grad_loss = self.pending.pop(0)

        def run() -> None:
            start = time.perf_counter()
            self.weights += 1
            sync = self.weights == self.microbatches
            if sync:
                self.weights = 0
            microbatch = self.counts["W"]
            curvature = self.kfac.wants_operands(self.program.index, microbatch) if self.kfac else None
            with torch.no_grad():
                gradients = self.weight_fn(self.rt, *kept, for_weights, grad_loss, sync, self.unsynced, curvature)
            if sync:
                self.staged.update(gradients)
            else:
                for fqn, grad in gradients.items():
                    self.unsynced[fqn] = grad if fqn not in self.unsynced else self.unsynced[fqn] + grad
            self.busy_s += time.perf_counter() - start
            self._done("W")
        return run

    def hand_gradients(self, staged: dict, grad_loss: torch.Tensor) -> None:
        """Each of its parameters' staged gradient, times ``grad_loss``, added to ``.grad``."""
        scale = None if bool(grad_loss == 1) else grad_loss.to(self.rt.device)
        for fqn, param in self.params.items():
            if fqn in staged:
                grad = as_gradient(param, staged[fqn] if scale is None else staged[fqn] * scale)
                param.grad = grad if param.grad is None else param.grad + grad


class _StageStep(torch.autograd.Function):
    """A stage's forward program now, its backward program when autograd comes back to it."""

    @staticmethod
    def forward(ctx, runner: StageRunner, anchor, *received):
        ctx.set_materialize_grads(False)
        outputs, ctx.state = runner.forward(received)
        ctx.runner = runner
        if isinstance(outputs, tuple):
            ctx.mark_non_differentiable(*[o for o, slot in zip(outputs, runner.program.sends)
                                          if not slot.differentiable])
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        state, ctx.state = ctx.state, None
        with torch.no_grad():
            back = ctx.runner.backward(state, grads)
        return (None, None) + back


class _StageModule(nn.Module):
    """What torch's PipelineStage runs: the received tensors in, the stage's outputs out. The
    anchor, a tensor that wants a gradient, makes autograd run the stage's backward even where
    nothing it received needs one (stage 0 receives token ids)."""

    def __init__(self, runner: StageRunner):
        super().__init__()
        self.runner = runner
        self.anchor = torch.zeros((), requires_grad=True)

    def forward(self, *received):
        return _StageStep.apply(self.runner, self.anchor, *received)


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
                 init: Callable[[nn.Module], None] | None = None, compile: bool = False):
        """``local_inputs``: each rank passes its block of the batch (dim 0, split over the
        stage mesh's "dp" axes, as autopar.data_parallel_info says), not the whole batch.
        ``init``: how rank 0 initializes a module of a model on the meta device (see
        _hold_own_state). ``compile``: the stages' programs run through torch.compile."""
        super().__init__()
        from autopar.runtime.module import check_plan_matches

        check_plan_matches(plan, model)
        if rank_mesh.pipeline_group is None:
            raise AutoparError(f"plan {plan.hash} has {plan.pipeline.pp} pipeline stages: build the RankMesh with "
                               f"pipeline_stages={plan.pipeline.pp}")
        self.model, self.plan, self.rt = model, plan, rank_mesh
        pipeline = plan.pipeline
        programs = stage_programs(plan)
        mine = [p for p in programs if pipeline.stages[p.index].rank == rank_mesh.pipeline_rank]
        params, buffers = hold_own_state(model, plan, programs, mine, rank_mesh, init)
        module = load_program(source, f"autopar_pipeline_{plan.hash}")
        self.given = batch_blocks(plan.mesh) if local_inputs else None
        if compile and plan.pipeline.fill is not None:
            raise AutoparError(f"plan {plan.hash} fills its pipeline's bubbles with {plan.pipeline.fill.optimizer} "
                               f"work, which reads the programs' operands from Python between them: run it without "
                               f"compile=True")
        self.runners = [StageRunner(plan, p, module, rank_mesh, params, buffers, self.given, compile) for p in mine]
        self.kfac = _kfac_work(plan, rank_mesh, mine, params, self.runners)
        self.schedule = _schedule(plan, self.runners, rank_mesh)
        self.tied = tied_copies(plan, programs, mine)
        # clip_grad_norm_ takes the whole model's norm: a tied weight's copy counts on one rank only
        elsewhere = [params[name] for copies in self.tied if copies.names[0] not in copies.held
                     for name in copies.held]
        register_pipelined(params.values(), rank_mesh.pipeline_group, elsewhere)
        register_pipelined_model(model)  # its optimizer's state dict keyed by parameter name, for DCP
        self._last_rank = _pipeline_peer(rank_mesh, pipeline.stages[-1].rank)
        self._anchor = torch.zeros((), requires_grad=True)  # what makes the returned loss differentiable
        self._agreed = False
        self._warned_missing = False
        self._masks: MicrobatchMasks | None = None  # made at the first call, which tells the micro-batch's rows
        self._rows = 0  # a micro-batch's rows (the first call tells)
        self._blocks = None if self.given is None else plan.mesh.data_parallel(0)[1]  # data-parallel blocks given
        self._last_values = programs[-1].values  # the outputs the last stage computes

    def forward(self, *args, **kwargs):
        call = flatten_call(args, kwargs)
        if self.given is not None:
            check_local_batches(call, self.rt)
        inputs = microbatch_inputs(self.plan, call, self.rt.device, self.given is not None)
        _check_modes(self.plan, self.model)
        self._draw_dropout_masks(inputs)
        if not self._agreed:  # every rank must run the same plan, for the same call
            self.rt.agree("the plan and program they run", program_identity(self.plan, call.signature))
            self._agreed = True
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
        loss = _StagedGradients.apply(self._whole_loss(losses), self._anchor, self.runners, staged, self.kfac)
        return self._output(loss)

    def _draw_dropout_masks(self, inputs: MicrobatchInputs) -> None:
        """This step's dropout masks, every rank drawing them all as eager would (see
        autopar.runtime.microbatch_dropout), handed to this rank's stages."""
        if self._masks is None:
            self._rows = next(self.plan.graph.node(ph).outputs[0].shape[0]
                              for ph, split in zip(self.plan.graph.inputs, inputs.split) if split)
            self._masks = MicrobatchMasks(self.plan, [r.program for r in self.runners], self._rows, self._blocks)
            for runner in self.runners:
                runner.masks = self._masks
        self._masks.draw(self.rt.device)

    def _output(self, loss: torch.Tensor):
        """What the model returns, with the batch's loss in its place and its other outputs
        (logits) for the whole batch, where the last stage computes them with the batch in dim
        0 (_whole_values); the others come back as None, said once."""
        tree = self.plan.graph.output_tree
        if tree is None:
            return loss
        values = self._whole_values()
        missing = [name for name, value in zip(tree.value_names, values) if value is None] + tree.dropped
        if missing and not self._warned_missing:
            self._warned_missing = True
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
        computed = self._last_values
        out = []
        for name in graph.values:
            meta = graph.node(name).outputs[0]
            if name not in computed or not meta.shape or meta.shape[0] != self._rows:
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
            dist.broadcast(whole, src=self._last_rank, group=self.rt.pipeline_group)
            out.append(DTensor.from_local(whole, self.rt.device_mesh, [Replicate()] * self.rt.device_mesh.ndim,
                                          run_check=False))
        return out

    def _in_batch_order(self, microbatches: torch.Tensor) -> torch.Tensor:
        """[m, rows, ...] -> the batch's [m * rows, ...]: micro-batch k is the batch's k-th m-th,
        or (inputs="local") every data-parallel block's k-th part."""
        if self._blocks is None:
            return microbatches.flatten(0, 1)
        return microbatches.unflatten(1, (self._blocks, -1)).transpose(0, 1).flatten(0, 2)

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

    def take_busy_seconds(self) -> float:
        """Seconds this rank spent in its stages' programs since the last call (the rest of a
        step's time is its bubble and its waits for P2P)."""
        busy = sum(r.busy_s for r in self.runners)
        for r in self.runners:
            r.busy_s = 0.0
        return busy

    def _whole_loss(self, losses: list) -> torch.Tensor:
        """The batch's loss, on every rank (the last stage's ranks computed it)."""
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=self.rt.device)
        dist.broadcast(loss, src=self._last_rank, group=self.rt.pipeline_group)
        return loss

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


def _kfac_work(plan: Plan, rt: RankMesh, mine: list[StageProgram], params: dict, runners: list[StageRunner]):
    """The K-FAC work of this rank's stages, hooked to their runners (None without K-FAC)."""
    fill = plan.pipeline.fill
    if fill is None or fill.optimizer != "kfac":
        return None
    work = KfacWork(plan, rt, [p.index for p in mine], params)
    for runner in runners:
        runner.kfac = work
    return work


def _schedule(plan: Plan, runners: list[StageRunner], rt: RankMesh):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as torch_schedules

    pipeline = plan.pipeline
    n, m = len(pipeline.stages), pipeline.microbatches
    stages = [PipelineStage(_StageModule(r), r.program.index, n, rt.device, input_args=_inputs(plan, r.program),
                            output_args=_outputs(plan, r.program), group=rt.pipeline_group,
                            dw_builder=r.weight_work)
              for r in runners]
    cls = getattr(torch_schedules, f"Schedule{pipeline.schedule}")

    def loss_fn(output, target):  # each micro-batch's loss weighs 1/m: their sum is the batch's mean
        return output / m

    if pipeline.schedule in _SINGLE_STAGE:
        return cls(stages[0], m, loss_fn=loss_fn, scale_grads=False)
    return cls(stages, m, loss_fn=loss_fn, scale_grads=False)


def _inputs(plan: Plan, program: StageProgram) -> tuple:
    if program.index == 0:  # the index of its micro-batch
        return (torch.zeros(1, dtype=torch.int64),)
    return tuple(_example(s) for s in program.receives)


def _outputs(plan: Plan, program: StageProgram) -> tuple:
    if program.loss is not None:
        meta = plan.graph.node(program.loss).outputs[0]
        return (torch.empty(meta.shape, dtype=getattr(torch, meta.dtype), requires_grad=True),)
    return tuple(_example(s) for s in program.sends)


def _example(slot) -> torch.Tensor:
    return torch.empty(slot.shape, dtype=getattr(torch, slot.dtype), requires_grad=slot.differentiable)


def _pipeline_peer(rt: RankMesh, pipeline_rank: int) -> int:
    """The global rank at ``pipeline_rank`` on this rank's pipeline (same place on the other axes)."""
    return dist.get_global_rank(rt.pipeline_group, pipeline_rank)


def _check_modes(plan: Plan, model: nn.Module) -> None:
    if module_modes(model) != plan.graph.modes:
        raise PlanMismatchError(f"the model's modules are in other train/eval modes than plan {plan.hash} was made "
                                f"for; a pipelined plan runs the modes it was planned in: plan again in these modes")


