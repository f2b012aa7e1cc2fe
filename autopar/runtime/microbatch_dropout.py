"""Dropout masks of a pipelined step equal to eager's.

Eager draws each dropout's mask for the whole batch, one dropout after another in forward's
order, from the random state the step starts with. A pipeline runs the micro-batches' forwards
interleaved over stages and ranks, so masks drawn as each stage meets its dropouts would be
other masks. Instead every rank draws, at the step's start, every dropout's mask for the
whole batch in forward's order, as eager would (so every rank's random state stays as eager
leaves it), keeps those of its own stages, and each micro-batch's forward takes its rows of
them (RankMesh.native_dropout then keeps this rank's block of that micro-batch's mask).

The rows are the micro-batch's along dim 0: a dropout whose input has the micro-batch's size
in dim 0 carries the batch there (the inputs are split along dim 0 and the decoders' and
encoders' activations keep it first); a dropout whose input does not draws its own masks, micro-batch by
micro-batch (the same distribution, not eager's numbers). With inputs="local", micro-batch k
holds every data-parallel block's k-th part, so its rows are gathered from each block.
"""
from __future__ import annotations

import torch

from autopar.ir.plan import Plan
from autopar.lowering.stages import StageProgram
from autopar.runtime.rank_mesh import global_dropout_mask

DROPOUT = "aten.native_dropout.default"


class MicrobatchMasks:
    """A pipelined plan's dropouts, and this rank's stages' masks of the current step."""

    def __init__(self, plan: Plan, mine: list[StageProgram], microbatch_size: int, blocks: int | None):
        """``microbatch_size``: the rows of a micro-batch; ``blocks``: the data-parallel blocks
        the call's rows come in (inputs="local"), None where the call is the whole batch."""
        self.m, self.blocks = plan.pipeline.microbatches, blocks
        # every dropout of the step in forward's order: (node, whole-batch shape or None, p)
        self.dropouts = []
        for node in plan.graph.nodes:
            if node.target != DROPOUT or not node.args[2]:  # train=False draws nothing
                continue
            shape = list(node.outputs[0].shape)
            whole = [shape[0] * self.m, *shape[1:]] if shape and shape[0] == microbatch_size else None
            self.dropouts.append((node.name, whole, float(node.args[1]), node.outputs[0].dtype))
        self.of_stage = {p.index: [s.node.name for s in p.forward if s.node is not None and s.node.target == DROPOUT]
                         for p in mine}
        self._masks: dict[str, torch.Tensor] = {}

    def draw(self, device) -> None:
        """Every dropout's whole-batch mask, in eager's order; this rank's stages' kept."""
        mine = {name for names in self.of_stage.values() for name in names}
        self._masks = {}
        for name, whole, p, dtype in self.dropouts:
            if whole is None:
                continue  # drawn micro-batch by micro-batch, as the stage meets it
            mask = global_dropout_mask(whole, getattr(torch, dtype), p, device)
            if name in mine:
                self._masks[name] = mask

    def for_microbatch(self, stage: int, microbatch: int) -> list[torch.Tensor | None]:
        """The masks of ``stage``'s dropouts for one micro-batch, in its program's order (None:
        one the stage draws itself)."""
        return [self._rows(self._masks[name], microbatch) if name in self._masks else None
                for name in self.of_stage[stage]]

    def _rows(self, mask: torch.Tensor, microbatch: int) -> torch.Tensor:
        if self.blocks is None:
            return mask.chunk(self.m)[microbatch]
        # block d's rows come first in the whole batch; micro-batch k takes each block's k-th part
        return mask.unflatten(0, (self.blocks, self.m, -1))[:, microbatch].flatten(0, 1)
