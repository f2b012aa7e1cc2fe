"""Kernels an emitted program calls by what they compute, not by one device's implementation.

Capture runs on fake CPU tensors (this project's torch build has no CUDA kernels, and fake
CUDA tensors abort in it), so attention comes out of capture as CPU's flash kernel, which
has no CUDA implementation (autopar.ops.devices lists such ops). The program calls these
functions instead, which run the kernel of the device the tensors are on: CPU's flash
attention on the CPU, the memory-efficient kernel on CUDA (its forward keeps the
log-sum-exp backward needs, as CPU's does; its sequence dim is padded to a multiple of 32
there, which no rule splits).
"""
from __future__ import annotations

import torch

from autopar.errors import AutoparError

aten = torch.ops.aten

def attention_forward(query, key, value, dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask=None,
                      scale=None):
    """(output, log-sum-exp) of scaled dot-product attention."""
    if query.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                 attn_mask=attn_mask, scale=scale)
    _refuse_dropout(dropout_p)
    output, logsumexp, _, _ = aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, True, 0.0, is_causal, scale=scale)
    return output, logsumexp


def attention_backward(grad_output, query, key, value, output, logsumexp, dropout_p: float = 0.0,
                       is_causal: bool = False, *, attn_mask=None, scale=None):
    """(grad query, grad key, grad value) of attention_forward."""
    if query.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_output, query, key, value, output, logsumexp, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    _refuse_dropout(dropout_p)
    unused = torch.empty((), dtype=torch.int64, device=query.device)  # the random state of a dropout it has not
    grad_query, grad_key, grad_value, _ = aten._scaled_dot_product_efficient_attention_backward(
        grad_output.contiguous(), query, key, value, attn_mask, output, logsumexp, unused, unused, 0.0,
        [True, True, True, False], is_causal, scale=scale)
    return grad_query, grad_key, grad_value


def _refuse_dropout(dropout_p: float) -> None:
    if dropout_p:
        raise AutoparError(f"attention dropout (p={dropout_p}) on CUDA is not run by autopar's programs yet: its "
                           f"mask would come from the CUDA kernel's own random state; train with attention "
                           f"dropout 0, or on the CPU")
