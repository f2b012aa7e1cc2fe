"""Neural-network ATen ops in JAX: matrix products, normalization, softmax, losses, attention,
convolution and dropout. Backward ops take what ATen's take (saved statistics included) and are
the vector-Jacobian products of their forward functions (``jax.vjp``) where nothing is saved."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from autopar.backends.jax.aten.pointwise import _in_float32


def aten_mm(a, b):
    # accumulated in float32 and rounded once, as torch does: the operands are cast first, as XLA's
    # CPU dot does not run a bf16 x bf16 = f32 product for every layout, and a product of two bf16
    # or fp16 numbers is exact in float32, so the sums are the same
    return _in_float32(jnp.matmul, a, b)


def aten_addmm(bias, a, b, beta=1, alpha=1):
    if not jnp.issubdtype(a.dtype, jnp.inexact):  # integer tensors take the integral part of the scalars
        beta, alpha = int(beta), int(alpha)
    # the product, the sum and the bias in float32, rounded once (as aten_mm)
    return _in_float32(lambda x, y, c: beta * c + alpha * jnp.matmul(x, y), a, b, bias)


def aten_baddbmm(x, a, b, beta=1, alpha=1):
    return aten_addmm(x, a, b, beta, alpha)


def aten_native_dropout(x, p, train, mask=None):
    """Dropout with the mask given: the program draws it for the whole tensor (or autopar.check
    feeds torch's) and each rank passes its own block, so every layout drops the same elements."""
    if train is False:  # ATen's None is training
        return x, jnp.ones(x.shape, jnp.bool_)
    if mask is None:
        raise ValueError("dropout in training needs the mask the program drew for it (mask=...)")
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return x * mask.astype(x.dtype) * scale, mask


def aten_native_dropout_backward(grad, mask, scale):
    return grad * mask.astype(grad.dtype) * scale


def aten_safe_softmax(x, dim, dtype=None):
    """Softmax whose rows of -inf only (a fully masked query) are zeros rather than NaN."""
    x = x if dtype is None else x.astype(dtype)
    if not x.ndim:
        return jnp.where(x == -jnp.inf, jnp.zeros((), x.dtype), jnp.ones((), x.dtype))
    masked = jnp.all(x == -jnp.inf, axis=dim, keepdims=True)
    return jnp.where(masked, jnp.zeros((), x.dtype), jax.nn.softmax(x, axis=dim))


def aten_native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _in_float32(lambda a, w, b: _layer_norm(a, normalized_shape, w, b, eps), x, weight, bias)


def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True) + eps)
    out = (x - mean) * rstd
    out = out * weight if weight is not None else out
    return (out + bias if bias is not None else out), mean, rstd


def aten_native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    return _in_float32(lambda g, a, m, r, w: _layer_norm_backward(g, a, normalized_shape, m, r, w, bias),
                            grad_out, x, mean, rstd, weight)


def _layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    xhat = (x - mean) * rstd
    g = grad_out * weight if weight is not None else grad_out
    n = math.prod(normalized_shape)
    dx = rstd * (g - jnp.sum(g, axis=axes, keepdims=True) / n
                 - xhat * jnp.sum(g * xhat, axis=axes, keepdims=True) / n)
    dw = jnp.sum(grad_out * xhat, axis=lead) if weight is not None else None
    db = jnp.sum(grad_out, axis=lead) if bias is not None else None
    return dx, dw, db


def aten_log_softmax(x, dim, half_to_float=False):
    x = x.astype(jnp.float32) if half_to_float else x  # a half-precision input, a float32 result
    return _in_float32(lambda v: jax.nn.log_softmax(v, axis=dim), x) if x.ndim else jnp.zeros_like(x)


def aten_log_softmax_backward_data(grad, output, dim, input_dtype):
    return _in_float32(lambda g, out: g - jnp.exp(out) * jnp.sum(g, axis=dim if g.ndim else None, keepdims=True),
                       grad, output)


def aten_softmax(x, dim, half_to_float=False):
    x = x.astype(jnp.float32) if half_to_float else x
    return _in_float32(lambda v: jax.nn.softmax(v, axis=dim), x) if x.ndim else jnp.ones_like(x)


def aten_softmax_backward_data(grad, output, dim, input_dtype):
    return _in_float32(lambda g, out: out * (g - jnp.sum(g * out, axis=dim if g.ndim else None, keepdims=True)),
                       grad, output)


def _nll_terms(x, target, weight, ignore_index):
    keep = target != ignore_index
    safe = jnp.where(keep, target, 0)
    w = keep.astype(x.dtype) if weight is None else jnp.where(keep, weight[safe], 0).astype(x.dtype)
    return safe, w


def aten_nll_loss_forward(x, target, weight, reduction, ignore_index):
    safe, w = _nll_terms(x, target, weight, ignore_index)
    picked = jnp.take_along_axis(x, safe[..., None], axis=-1)[..., 0] if x.ndim > 1 else x[safe]
    if reduction == 0 and x.ndim == 1:  # one sample, unreduced: ATen's total weight is its weight then
        return -picked * w, w.astype(x.dtype)
    total = jnp.sum(w)
    losses = -picked * w
    if reduction == 0:
        return losses, jnp.zeros((), x.dtype)  # ATen leaves the total weight 0 when it does not reduce
    return (jnp.sum(losses) / total if reduction == 1 else jnp.sum(losses)), total


def aten_nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    safe, w = _nll_terms(x, target, weight, ignore_index)
    g = -grad * w / total_weight if reduction == 1 else -grad * w
    if x.ndim == 1:
        return jnp.zeros_like(x).at[safe].add(g)
    rows = jnp.arange(x.shape[0])
    return jnp.zeros_like(x).at[rows, safe].add(g)


def _attention(q, k, v, is_causal, scale, attn_mask=None):
    if q.dtype in (jnp.bfloat16, jnp.float16):  # scores and their log-sum-exp in float32, as torch's kernel
        out, lse = _attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), is_causal, scale,
                              attn_mask if attn_mask is None or attn_mask.dtype == bool
                              else attn_mask.astype(jnp.float32))
        return out.astype(q.dtype), lse
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = jnp.einsum("...qd,...kd->...qk", q, k) * scale
    if is_causal:
        s_q, s_k = scores.shape[-2:]
        scores = jnp.where(jnp.tril(jnp.ones((s_q, s_k), bool)), scores, -jnp.inf)
    if attn_mask is not None:  # a boolean mask keeps where True; a float mask adds
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == bool else scores + attn_mask
    lse = jax.nn.logsumexp(scores, axis=-1)
    return jnp.einsum("...qk,...kd->...qd", jnp.exp(scores - lse[..., None]), v), lse


def aten_sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    if dropout_p:
        raise NotImplementedError("attention dropout is not translated to JAX (its mask would differ from torch's)")
    return _attention(q, k, v, is_causal, scale, attn_mask)


def aten_sdpa_flash_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    if dropout_p:
        raise NotImplementedError("attention dropout is not translated to JAX (its mask would differ from torch's)")
    return jax.vjp(lambda a, b, c: _attention(a, b, c, is_causal, scale, attn_mask)[0], q, k, v)[1](grad_out)


def aten_convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _in_float32(lambda a, w, b: _convolution(a, w, b, stride, padding, dilation, transposed, output_padding,
                                                    groups), x, weight, bias)


def _convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    spatial = "DHW"[3 - (x.ndim - 2):]
    numbers = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    if transposed:
        weight, pads = _transposed_kernel(weight, padding, dilation, output_padding, groups)
        out = lax.conv_general_dilated(x, weight, window_strides=(1,) * len(spatial), padding=pads,
                                       lhs_dilation=stride, rhs_dilation=dilation, feature_group_count=groups,
                                       dimension_numbers=numbers)
    else:
        out = lax.conv_general_dilated(x, weight, window_strides=stride, padding=[(p, p) for p in padding],
                                       rhs_dilation=dilation, feature_group_count=groups, dimension_numbers=numbers)
    return out if bias is None else out + bias.reshape((1, -1) + (1,) * (x.ndim - 2))


def _transposed_kernel(weight, padding, dilation, output_padding, groups):
    """A transposed convolution as a convolution of the stride-dilated input: the kernel with its
    in/out channels swapped per group and its taps reversed, padded to the full overlap."""
    taps = weight.shape[2:]
    grouped = weight.reshape((groups, weight.shape[0] // groups, weight.shape[1]) + taps)
    kernel = jnp.swapaxes(grouped, 1, 2).reshape((groups * weight.shape[1], weight.shape[0] // groups) + taps)
    kernel = jnp.flip(kernel, tuple(range(2, kernel.ndim)))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + extra)
            for k, p, d, extra in zip(taps, padding, dilation, output_padding)]
    return kernel, pads


def aten_convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                              groups, output_mask):
    conv = lambda a, b: aten_convolution(a, b, None, stride, padding, dilation, transposed, output_padding, groups)
    grad_x, grad_w = jax.vjp(conv, x, weight)[1](grad)
    grad_b = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim))) if bias_sizes is not None else None
    return grad_x, grad_w, grad_b


def transformers_grouped_mm(x, weight, offs):
    """transformers' grouped matmul (Mixture of Experts): the rows up to offs[0] times weight[0],
    the next up to offs[1] times weight[1], ...; rows past the last offset are zeros."""
    return lax.ragged_dot(x, weight, jnp.diff(offs, prepend=0).astype(jnp.int32))


def transformers_grouped_mm_backward(x, weight, offs, grad):
    return jax.vjp(lambda a, b: transformers_grouped_mm(a, b, offs), x, weight)[1](grad)


def autopar_moe_experts(x, top_k_index, top_k_weights, gate_up, down):
    """autopar's mixture-of-experts op (autopar.ops.moe): each (token, expert) pair, sorted by
    expert, through its expert's SwiGLU by grouped matmuls, weighted and summed per token."""
    k, experts = top_k_index.shape[1], gate_up.shape[0]
    flat = top_k_index.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    tokens = order // k
    sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
    gate, up = jnp.split(lax.ragged_dot(x[tokens], jnp.swapaxes(gate_up, 1, 2), sizes), 2, axis=-1)
    outputs = lax.ragged_dot(jax.nn.silu(gate) * up, jnp.swapaxes(down, 1, 2), sizes)
    weighted = outputs * top_k_weights.reshape(-1)[order][:, None]
    return jnp.zeros(x.shape, jnp.promote_types(x.dtype, top_k_weights.dtype)).at[tokens].add(weighted)


def autopar_moe_experts_backward(grad, x, top_k_index, top_k_weights, gate_up, down):
    layer = lambda a, w, g, d: autopar_moe_experts(a, top_k_index, w, g, d)  # noqa: E731
    return jax.vjp(layer, x, top_k_weights, gate_up, down)[1](grad)
