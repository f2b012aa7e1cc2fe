"""One pipeline stage's programs on a rank, as torch.distributed.pipelining runs them.

Each stage a rank holds becomes a ``PipelineStage`` (torch's) whose submodule runs the stage's
forward program inside an autograd Function; torch's schedule calls the stages' forward and
backward for every micro-batch, sends activations and their gradients between stages over its
P2P, and orders the actions. The Function's backward runs the stage's input-gradient program
(I) with the backward values the next stage sent back (autopar.lowering.stages: they ride in
the gradients of the values sent forward), so autograd never traces the programs; the
weight-gradient program (W) is what the stage's ``dw_builder`` hands torch, which runs it right
away or, in a zero-bubble schedule, in a later bubble.

Static metadata: every slot's local shape and dtype are known from the plan, so each
``PipelineStage`` is built with its inputs' and outputs' examples and needs no shape-inference
round before the first step. A slot that carries no backward value is sent without a gradient.

Gradients: each micro-batch's loss weighs 1/m (the loss function the schedule runs divides by
m), so the step's gradient is the mean of the micro-batches', as eager's mean over the whole
batch. Each stage's W keeps local gradients for every micro-batch but its last, which adds
them and runs the gradient collectives once (as DDP's no_sync).
"""
from __future__ import annotations

import time

import torch
from torch import nn

from autopar.ir.placement import Spec
from autopar.ir.plan import Plan
from autopar.lowering.stages import StageProgram
from autopar.runtime.compiling import compile_program
from autopar.runtime.kfac import KfacWork
from autopar.runtime.microbatch_dropout import MicrobatchMasks
from autopar.runtime.microbatch_inputs import MicrobatchInputs
from autopar.runtime.rank_mesh import RankMesh, local_shard
from autopar.runtime.stage_offload import HostStageState, detach_views, reattach
from autopar.runtime.state import as_gradient, local
from autopar.runtime.traced_collectives import TracedCollectives

# the schedules whose class runs one stage per rank (the others take a list)
_SINGLE_STAGE = ("GPipe", "1F1B")


class StageRunner:
    """One stage's programs on this rank, called by its autograd Function."""

    def __init__(self, plan: Plan, program: StageProgram, module, rt: RankMesh, params: dict, buffers: dict,
                 given: Spec | None = None, compiled: bool = False, host: HostStageState | None = None):
        """``given``: the layout the call's tensors are in, where each rank passes its block
        (inputs="local"); None: they are whole. ``compiled``: the stage's programs run through
        torch.compile, as the flat runtime's do (autopar.runtime.program.RankProgram), their
        collectives functional ones inside the graphs. ``host``: the parameters live in host
        memory, and each action brings them up (autopar.runtime.stage_offload)."""
        self.plan, self.program, self.given = plan, program, given
        self.rt = TracedCollectives(rt) if compiled else rt  # what the programs call
        self.rank_mesh = rt
        functions = [getattr(module, f"{kind}_{program.index}") for kind in ("forward", "backward_input",
                                                                             "backward_weight")]
        if compiled:
            functions = [compile_program(f) for f in functions]
        self.forward_fn, self.input_fn, self.weight_fn = functions
        graph = plan.graph
        self.params = {fqn: params[fqn] for ph, fqn in graph.params.items() if ph in program.placeholders}
        self._placeholder_sources = [(ph, graph.params.get(ph), graph.buffers.get(ph)) for ph in program.placeholders]
        self.host = host
        # which of forward's arguments, and of those it keeps for backward, are parameters
        self._args_params = [param is not None for _, param, _ in self._placeholder_sources]
        self._kept_params = [p for p, ph in zip(self._args_params, program.placeholders) if ph not in program.inputs]
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
        on_device, copies = self._up(args, self._args_params)
        self.rank_mesh.given_masks = iter(self.masks.for_microbatch(self.program.index, self.counts["F"]))
        try:
            loss, sends, saved, values = self.forward_fn(self.rt, *on_device, *(() if first else received))
        finally:
            self.rank_mesh.given_masks = None
        saved = self._release(copies, saved)
        if values:
            self.values.append([v.detach() for v in values])
        self.busy_s += time.perf_counter() - start
        # the parameters' host blocks where they live there: the backward actions bring them up again
        kept = [a for a, ph in zip(args, self.program.placeholders) if ph not in self.program.inputs]
        self.normalizer_values += [saved[i].detach() for i in self._normalizers]
        self._done("F")
        # torch's point-to-point sends take contiguous tensors only (a stage may end on a view)
        sends = tuple(t.contiguous() for t in sends)
        return (loss if self.program.loss is not None else sends), (kept, saved)

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
        on_device, copies = self._up(kept, self._kept_params)
        sent_back, for_weights = self.input_fn(self.rt, *on_device, reattach(saved, copies), grads_in, grad_loss)
        for_weights = self._release(copies, for_weights)
        self.busy_s += time.perf_counter() - start
        self.pending.append((kept, for_weights, grad_loss))
        self._done("I")
        if self.program.index == 0:  # it received the micro-batch's index
            return (None,)
        back = iter(sent_back)
        return tuple(next(back).contiguous() if slot.differentiable else None for slot in self.program.receives)

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
            on_device, copies = self._up(kept, self._kept_params)
            unsynced = self.unsynced
            if self.host is not None and sync and unsynced:  # the earlier micro-batches' sum, for the syncs
                sums = self.host.up(list(unsynced.values()))
                copies, unsynced = copies + sums, dict(zip(unsynced, sums))
                self.unsynced.clear()  # the program takes each sum from the device's dict
            with torch.no_grad():
                gradients = self.weight_fn(self.rt, *on_device, reattach(for_weights, copies), grad_loss, sync,
                                           unsynced, curvature)
            if self.host is not None:
                self.host.release(copies)
                gradients = self.host.down(gradients)
            if sync:
                self.staged.update(gradients)
            else:
                for fqn, grad in gradients.items():
                    self.unsynced[fqn] = grad if fqn not in self.unsynced else self.unsynced[fqn] + grad
            self.busy_s += time.perf_counter() - start
            self._done("W")
        return run

    def _up(self, args: list, is_param: list[bool]) -> tuple[list, list]:
        """(``args`` with each parameter's host block replaced by its device copy, the copies);
        ``args`` as they are where the parameters live on the device."""
        if self.host is None:
            return args, []
        copies = iter(self.host.up([a for a, p in zip(args, is_param) if p]))
        on_device = [next(copies) if p else a for a, p in zip(args, is_param)]
        return on_device, [a for a, p in zip(on_device, is_param) if p]

    def _release(self, copies: list, kept: list) -> list:
        """The action that read ``copies`` ended: what it keeps for a later one, without a hold on them."""
        if self.host is None:
            return kept
        self.host.release(copies)
        return detach_views(kept, copies)

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



def kfac_work(plan: Plan, rt: RankMesh, mine: list[StageProgram], params: dict, runners: list[StageRunner]):
    """The K-FAC work of this rank's stages, hooked to their runners (None without K-FAC)."""
    fill = plan.pipeline.fill
    if fill is None or fill.optimizer != "kfac":
        return None
    work = KfacWork(plan, rt, [p.index for p in mine], params)
    for runner in runners:
        runner.kfac = work
    return work


def torch_schedule(plan: Plan, runners: list[StageRunner], rt: RankMesh):
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

