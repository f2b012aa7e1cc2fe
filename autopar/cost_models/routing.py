"""Mixture-of-experts routing measured on a real batch: how unevenly tokens reach experts.

An expert-parallel layer waits for its busiest rank (autopar.ops.moe.ExpertsRule.inner_time);
the planner assumes balanced routing unless told ``moe_imbalance=``, which this measures:
the model runs once (no gradients) and each experts module's top-k choices are counted.
"""
from __future__ import annotations

import torch
from torch import nn

from autopar.errors import AutoparError


def routing_imbalance(model: nn.Module, *inputs, **kwargs) -> float:
    """The busiest expert's (token, expert) pairs over the mean per expert, the worst over the
    model's MoE layers, for ``model(*inputs, **kwargs)``: what to pass as ``moe_imbalance=``."""
    from autopar.capture.moe_regions import computes_swiglu_experts

    counts: list[torch.Tensor] = []

    def count(module, args):
        top_k_index = args[1]
        counts.append(torch.bincount(top_k_index.reshape(-1).cpu(), minlength=module.gate_up_proj.shape[0]))

    layers = [m for m in model.modules() if computes_swiglu_experts(m)]
    if not layers:
        raise AutoparError(f"{type(model).__name__} has no mixture-of-experts layer autopar plans as one (a Hugging "
                           f"Face experts module: gate_up_proj, down_proj, SwiGLU); there is no routing to measure")
    hooks = [m.register_forward_pre_hook(count) for m in layers]
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return max(float(c.max()) / float(c.float().mean()) for c in counts)
