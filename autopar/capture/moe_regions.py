"""Mixture-of-experts layers captured as one op each (autopar.ops.moe), not op by op.

Hugging Face's experts modules (Mixtral, Qwen2-MoE, DeepSeek-V3, ... — every class built with
transformers' ``use_experts_implementation``) take the tokens, each token's top-k experts and
their routing weights. Capture runs the model's structural copy with each such module's
forward replaced by ``autopar::moe_experts`` on its two stacked weights, so the planner
weighs the layer's layouts (expert parallelism among them) as one decision. A module the op
does not compute exactly (biases, transposed or interleaved weights, another activation, a
gate of its own) keeps its forward and is captured op by op, as before.
"""
from __future__ import annotations

import types

import torch
from torch import nn

import autopar.ops.moe  # noqa: F401  (defines torch.ops.autopar.moe_experts)

# use_experts_implementation's settings under which the module computes SwiGLU experts on
# [gate; up] stacked weights, (E, 2I, H) and (E, H, I)
_SWIGLU_LAYOUT = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
                  "has_post_expert_norm": False}


def computes_swiglu_experts(module: nn.Module) -> bool:
    """Whether ``module`` is a Hugging Face experts module that autopar::moe_experts computes."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter)):
        return False
    if gate_up.dim() != 3 or down.dim() != 3:
        return False
    experts, two_i, hidden = gate_up.shape
    if tuple(down.shape) != (experts, hidden, two_i // 2) or two_i % 2:
        return False
    if any(getattr(module, name, None) is not value for name, value in _SWIGLU_LAYOUT.items()):
        return False
    return _is_silu(getattr(module, "act_fn", None)) and _default_gate(module) and _dispatched_forward(module)


def _is_silu(act) -> bool:
    from transformers.activations import SiLUActivation
    return type(act) in (nn.SiLU, SiLUActivation)


def _default_gate(module: nn.Module) -> bool:
    from transformers.integrations.moe import _default_apply_gate
    return getattr(getattr(module, "_apply_gate", None), "__func__", None) is _default_apply_gate


def _dispatched_forward(module: nn.Module) -> bool:
    """The forward use_experts_implementation installs (each of its implementations computes
    the same layer), not one a subclass or the instance put in its place."""
    forward = type(module).forward
    code = getattr(forward, "__code__", None)  # functools.wraps gave the wrapper the wrapped one's names
    return ("forward" not in vars(module) and code is not None
            and code.co_qualname.startswith("use_experts_implementation."))


def _experts_op_forward(self, hidden_states, top_k_index, top_k_weights):
    if not torch.is_autocast_enabled("cpu"):  # capture traces mixed precision under CPU autocast
        return torch.ops.autopar.moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                                             self.down_proj)
    # as eager's linear layers under autocast: the experts' matmuls in the low precision; the
    # routing weights (float32 from the router's softmax) weigh and sum their outputs in float32,
    # and the sum comes out in the dtype of the tokens the module was given
    low = torch.get_autocast_dtype("cpu")
    out = torch.ops.autopar.moe_experts(hidden_states.to(low), top_k_index, top_k_weights,
                                        self.gate_up_proj.to(low), self.down_proj.to(low))
    return out.to(hidden_states.dtype)


def experts_as_one_op(model: nn.Module) -> None:
    """Replace the forward of every experts module of ``model`` (capture's structural copy) that
    autopar::moe_experts computes."""
    for module in model.modules():
        if type(module).__module__.startswith("transformers.") and computes_swiglu_experts(module):
            module.forward = types.MethodType(_experts_op_forward, module)
