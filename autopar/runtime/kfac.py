"""K-FAC (Martens & Grosse 2015) on a pipelined plan, its work run in the schedule's bubbles.

The plan (autopar.planning.bubbles) places each piece of K-FAC's work after one action of torch's
schedule on its rank, in one step of a refresh cycle; ``KfacWork`` runs those pieces when the
stage's programs finish that action (autopar.runtime.pipeline calls ``after``), so the work rides
on torch.distributed.pipelining's own actions. What it computes, per preconditioned weight W
(``[out, in]``) of a layer with inputs ``a`` and output gradients ``g`` (rows: batch x sequence):
- factors of each micro-batch, on this device's rows: ``A = aᵀa/n`` and ``G = ĝᵀĝ/n`` with
  ``ĝ = N·g`` (N: the batch's rows; for a mean loss, ĝ is each row's own loss gradient);
- the cycle's mean over its micro-batches, averaged over the stage's devices;
- at inversion: the running factors ``A ← ε·A + (1-ε)·Ā`` (the first cycle: ``Ā``), damped with
  factored Tikhonov damping (π = sqrt((tr A/d_A)/(tr G/d_G)); A + π√λ·I, G + √λ/π·I, Martens &
  Grosse §6.3) and inverted, in float32 (as the planner prices it); the new inverses take effect
  in the cycle's last step;
- every step: ``W.grad ← G⁻¹ · W.grad · A⁻¹`` (a weight without inverses yet keeps its gradient).
autopar.KFAC, the optimizer (autopar/optim.py), scales those gradients by Ba et al. (2017)'s KL
clip ``ν = min(1, sqrt(κ / (lr² Σ⟨P, ∇W⟩)))`` and takes an SGD step (momentum, weight decay).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from autopar.errors import AutoparError
from autopar.ir.bubbles import END, FACTOR, START, TAIL
from autopar.lowering.curvature import curvature_layers
from autopar.runtime.rank_mesh import local_shard


@dataclass
class _Settings:
    damping: float
    factor_decay: float


class KfacWork:
    """One rank's K-FAC state and the placed work of its stages."""

    def __init__(self, plan, rt, stages: list[int], params: dict):
        """``stages``: the ones this rank runs; ``params``: name -> the parameters it holds."""
        self.plan, self.rt, self.fill, self.params = plan, rt, plan.pipeline.fill, params
        self.layers = {la.weight: la for la in curvature_layers(plan)[0]}
        self.specs = {fqn: plan.strategies[ph].out_specs[0] for ph, fqn in plan.graph.params.items()}
        self.microbatches = plan.pipeline.microbatches
        self.placed: dict[tuple[int, str], list] = {}  # (phase, action it follows) -> its stages' work, in order
        for w in sorted(self.fill.work, key=lambda w: w.start_s):
            if w.stage in stages:
                self.placed.setdefault((w.phase, w.after), []).append(w)
        self.settings: _Settings | None = None
        self.step = 0  # training steps run: the phase of the cycle is step % refresh
        self.operands: dict[tuple[int, int], dict] = {}  # (stage, micro-batch) -> weight -> its mm's operands
        self.sums: dict[str, list] = {}  # weight -> [Σ A, Σ G, contributions] of this cycle
        self.factors: dict[str, tuple] = {}  # weight -> running (A, G)
        self.pending: dict[str, tuple] = {}  # weight -> (A⁻¹, G⁻¹) that take effect at the cycle's end
        self.inverses: dict[str, tuple] = {}  # weight -> (A⁻¹, G⁻¹) in use
        self.inner = 0.0  # Σ ⟨P, ∇W⟩ of this step's preconditioned weights (for the KL clip)
        self.preconditioned: set[str] = set()
        self.seed = 1.0  # the gradient backward seeded the loss with: .grad = seed x the staged gradient
        self.active = False  # within a training step
        self.unstepped = False  # a training step ran that KFAC.step has not applied yet
        wanted = [w for w in self.fill.work if w.kind == FACTOR and w.stage in stages]
        self.capture_at = {(w.phase, w.stage, w.microbatch) for w in wanted}

    @property
    def phase(self) -> int:
        return self.step % self.fill.refresh

    def configure(self, damping: float, factor_decay: float) -> None:
        self.settings = _Settings(damping, factor_decay)

    def wants_operands(self, stage: int, microbatch: int) -> dict | None:
        """A dict for the stage's weight-gradient program to put its operands in, where this step
        computes that micro-batch's factors (None elsewhere: nothing is kept)."""
        if (self.phase, stage, microbatch) not in self.capture_at:
            return None
        return self.operands.setdefault((stage, microbatch), {})

    def begin_step(self) -> None:
        """A training step starts: the work placed at its start runs now, before the schedule's."""
        if self.unstepped:
            raise AutoparError("autopar.KFAC takes one step per training call of the model (its curvature cycle "
                               "counts calls, and its KL clip weighs one call's gradients): call opt.step() after "
                               "each loss.backward(), rather than accumulating gradients over calls")
        self.inner, self.preconditioned, self.operands, self.active = 0.0, set(), {}, True
        self.unstepped = self.settings is not None  # until KFAC.step (a model without one: no clip to keep)
        self.after(START, {})

    def after(self, action: str, staged: dict) -> None:
        """Run the work placed after ``action`` (or TAIL: after the schedule's last) in this
        training step (an evaluation's forwards run none)."""
        for work in self.placed.get((self.phase, action), ()) if self.active else ():
            getattr(self, f"_{work.kind}")(work, staged)

    def end_step(self, staged: dict) -> None:
        """The schedule has returned on this rank: the work placed at its end, then past the step's."""
        self.after(END, staged)
        self.after(TAIL, staged)
        self.step += 1
        self.active = False

    # --- the pieces of work
    def _factor(self, work, staged) -> None:
        (weight,) = work.layers
        layer = self.layers[weight]
        first, second = (self._gathered(x.float(), gathers) for x, gathers in
                         zip(self.operands[work.stage, work.microbatch].pop(weight), layer.operand_gathers))
        a, g = layer.input_and_output_grad(first, second)
        g = g * (layer.rows * self.microbatches)  # ĝ: each row's own loss gradient, for a mean loss
        n = a.shape[0]
        sums = self.sums.setdefault(weight, [0.0, 0.0, 0])
        sums[0] = sums[0] + a.t() @ a / n
        sums[1] = sums[1] + g.t() @ g / n
        sums[2] += 1

    def _reduce(self, work, staged) -> None:
        """The stage's cycle sums averaged over its devices (each holds its rows' factors)."""
        for weight in work.layers:
            sums = self.sums[weight]
            for i in (0, 1):
                for axis in self.plan.mesh.axis_names:
                    sums[i] = self.rt.all_reduce(sums[i].contiguous(), axis)
                sums[i] = sums[i] / self.plan.mesh.size

    def _invert(self, work, staged) -> None:
        if self.settings is None:
            raise AutoparError("this plan runs K-FAC's work in its bubbles: build autopar.KFAC(model, lr=...) "
                               "before the first training step")
        (weight,) = work.layers
        sum_a, sum_g, count = self.sums.pop(weight)
        mean = (sum_a / count, sum_g / count)
        decay = self.settings.factor_decay
        old = self.factors.get(weight)
        self.factors[weight] = mean if old is None else tuple(decay * o + (1 - decay) * f for o, f in zip(old, mean))
        self.pending[weight] = damped_inverses(*self.factors[weight], self.settings.damping)

    def _precondition(self, work, staged) -> None:
        if self.phase == self.fill.refresh - 1:
            self.inverses.update({w: self.pending.pop(w) for w in work.layers if w in self.pending})
        for weight in work.layers:
            if weight not in self.inverses:
                continue
            a_inv, g_inv = self.inverses[weight]
            layer = self.layers[weight]
            grad = self._gathered(staged[weight], layer.weight_gathers)
            p = g_inv.to(grad.dtype) @ grad @ a_inv.to(grad.dtype)
            self.inner = self.inner + (p.double() * grad.double()).sum()  # read once, at the optimizer step
            staged[weight] = local_shard(p, self.specs[weight], self.plan.mesh, self.rt.coords) \
                if layer.weight_gathers else p
            self.preconditioned.add(weight)

    def _gathered(self, x: torch.Tensor, gathers) -> torch.Tensor:
        """``x`` whole along the dims the plan splits over the stage's devices (tensor parallelism)."""
        for axis, dim in gathers:
            x = self.rt.all_gather(x.contiguous(), axis, dim)
        return x


def damped_inverses(a: torch.Tensor, g: torch.Tensor, damping: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(A⁻¹, G⁻¹) under factored Tikhonov damping (Martens & Grosse 2015, §6.3)."""
    trace_a, trace_g = float(torch.trace(a)) / a.shape[0], float(torch.trace(g)) / g.shape[0]
    # π balances the two traces; a zero factor comes with a zero weight gradient (all-zero inputs
    # or output gradients), whose preconditioned step is zero whatever the balance
    pi = math.sqrt(trace_a / trace_g) if trace_a > 0 and trace_g > 0 else 1.0
    root = math.sqrt(damping)
    eye_a = torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    eye_g = torch.eye(g.shape[0], dtype=g.dtype, device=g.device)
    return torch.linalg.inv(a + pi * root * eye_a), torch.linalg.inv(g + root / pi * eye_g)
