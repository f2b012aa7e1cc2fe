"""A pipelined step's call, as its micro-batches take it.

Torch's schedule would split every argument along dim 0; a tensor without the batch dim
(position ids of shape [1, S]) must instead reach every micro-batch whole, so stage 0 takes its
micro-batch from the call itself: the rows of each tensor that carries the batch, the others
whole. With inputs="local" each rank passes its data-parallel block of the batch.
"""
from __future__ import annotations

import torch

from autopar.errors import PlanMismatchError
from autopar.ir.call import FlatCall
from autopar.ir.plan import Plan
from autopar.runtime.program import global_call


class MicrobatchInputs:
    """A call's tensors as the micro-batches take them: the rows of each tensor that carries the
    batch (``split``), every other tensor whole."""

    def __init__(self, tensors: list[torch.Tensor], split: list[bool], microbatches: int):
        self.tensors, self.split, self.microbatches = tensors, split, microbatches

    def microbatch(self, index: int) -> list[torch.Tensor]:
        return [t.chunk(self.microbatches)[index] if split else t for t, split in zip(self.tensors, self.split)]


def microbatch_inputs(plan: Plan, call: FlatCall, device, local: bool = False) -> MicrobatchInputs:
    """The call a pipelined plan was made for, as its micro-batches take it: each tensor is m
    micro-batches of the planned one along dim 0 (it carries the batch) or the planned one
    itself (it goes whole to every micro-batch, as planned: autopar.ir.call.batch_size).
    ``local``: the call holds this rank's data-parallel blocks (inputs="local"), every tensor
    its block of m micro-batches."""
    graph, m = plan.graph, plan.pipeline.microbatches
    if call.structure != graph.input_structure or len(call.tensors) != len(graph.inputs):
        raise PlanMismatchError(f"the model is called with other arguments than plan {plan.hash} was made for "
                                f"(planned: {graph.input_structure}; given: {call.structure})")
    split = []
    # the whole batch's shapes (a local call's blocks put together: refused without a batch dim)
    for ph, t in zip(graph.inputs, global_call(call, plan.mesh).tensors if local else call.tensors):
        meta = graph.node(ph).outputs[0]
        batched = [meta.shape[0] * m, *meta.shape[1:]] if meta.shape else None
        if str(t.dtype).removeprefix("torch.") != meta.dtype or list(t.shape) not in (batched, list(meta.shape)):
            raise PlanMismatchError(f"an input has shape {list(t.shape)} ({t.dtype}) where plan {plan.hash} takes "
                                    f"{batched} ({meta.dtype}): {m} micro-batches of {list(meta.shape)}"
                                    f"{f', or {list(meta.shape)} whole' if meta.shape else ''}; plan again for "
                                    f"this batch")
        split.append(list(t.shape) == batched)
    if local and not all(split):
        raise PlanMismatchError(f"with inputs='local' every tensor of the call is this rank's block of the batch "
                                f"(m={m} micro-batches of plan {plan.hash}'s); pass each whole batch's block")
    rows = {t.shape[0] for t in call.tensors}
    if local and any(r % m for r in rows):  # every rank's blocks alike: every rank refuses, none waits
        raise PlanMismatchError(f"with inputs='local' micro-batch k is every data-parallel block's k-th part, and "
                                f"this rank's block of {min(rows)} rows does not split into plan {plan.hash}'s {m} "
                                f"micro-batches: pass blocks of a multiple of {m} rows, or plan fewer micro-batches "
                                f"(microbatches=)")
    if not any(split):
        raise PlanMismatchError(f"no input of this call carries the batch plan {plan.hash} splits into {m} "
                                f"micro-batches (each would be the same): pass the batch planned for")
    return MicrobatchInputs([t.to(device) for t in call.tensors], split, m)
