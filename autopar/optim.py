"""autopar.KFAC: the optimizer step of K-FAC, whose curvature work a pipelined plan made with
``optimizer="kfac"`` runs in its bubbles (autopar.runtime.kfac)."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from autopar.errors import AutoparError
from autopar.parallelize import parallel_module
from autopar.runtime.kfac import KfacWork
from autopar.runtime.pipeline import PipelinedModule


class KFAC(torch.optim.SGD):
    """K-FAC for a model whose plan was made with ``optimizer="kfac"``: the model's step computes
    the curvature and preconditions the gradients in its pipeline's bubbles; ``step()`` applies
    the KL clip (``kl_clip``; the effective learning rate's bound) and an SGD step (``lr``,
    ``momentum``, ``weight_decay``). ``damping`` (λ) and ``factor_decay`` (ε) set the curvature.
    Build it before the first training step, after autoparallelize (or on its PipelinedModule)."""

    def __init__(self, model, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, damping: float = 1e-3,
                 factor_decay: float = 0.95, kl_clip: float = 1e-3):
        if not (damping > 0 and 0 <= factor_decay < 1 and kl_clip > 0):
            raise AutoparError(f"K-FAC needs damping > 0, 0 <= factor_decay < 1 and kl_clip > 0 (got {damping}, "
                               f"{factor_decay}, {kl_clip})")
        self.work = _kfac_work_of(model)
        self.work.configure(damping, factor_decay)
        self.kl_clip = kl_clip
        # torch's optimizers refuse an empty list: a rank whose stages hold no parameters (the loss
        # alone) steps an empty tensor, and still joins the clip's all-reduce
        params = [p for p in model.parameters() if not p.is_meta] or [torch.zeros(0, requires_grad=True)]
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise AutoparError("autopar.KFAC takes no closure: call the model and loss.backward() before step()")
        if len(self.param_groups) != 1:  # the KL clip bounds one learning rate's step
            raise AutoparError("autopar.KFAC clips its step with one learning rate: keep its one parameter group "
                               "(no add_param_group)")
        work = self.work
        work.unstepped = False
        total = torch.tensor([float(work.inner) * work.seed ** 2], dtype=torch.float64, device=work.rt.device)
        if work.rt.pipeline_group is not None:  # every stage's weights share one clip
            dist.all_reduce(total, group=work.rt.pipeline_group)
        lr = self.param_groups[0]["lr"]
        if total.item() > 0:
            nu = min(1.0, math.sqrt(self.kl_clip / (lr ** 2 * total.item())))
            for weight in work.preconditioned:
                if work.params[weight].grad is not None:
                    work.params[weight].grad.mul_(nu)
        return super().step()


def _kfac_work_of(model) -> KfacWork:
    module = model if isinstance(model, PipelinedModule) else parallel_module(model)
    work = getattr(module, "kfac", None)
    if work is None:
        raise AutoparError("autopar.KFAC runs on a model autoparallelized with a plan made with optimizer='kfac' on a "
                           "mesh with 'pp' (call the model once first, or pass example_inputs to autoparallelize)")
    return work
