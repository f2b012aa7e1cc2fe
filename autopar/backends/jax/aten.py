"""ATen ops in JAX, one function per op with ATen's signature, so the JAX program calls them
with the same arguments the torch program passes (printed by autopar.backends.printer).

Each runs on one rank's local block, as the ATen op does in the torch program. Backward
ops are the vector-Jacobian products of their forward functions (``jax.vjp``) where ATen's
backward takes only what the forward took; where it takes saved statistics (layer norm's
mean and rstd, nll_loss's total weight) it uses them, as ATen does. The emitted program
carries the source of the functions it calls, so it needs JAX and nothing of autopar.

``TABLE`` maps an ATen target to its function; an op missing from it cannot be emitted
(autopar.backends.jax.codegen names the op and the node).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax


def aten_view(x, size):
    return jnp.reshape(x, size)


def aten_t(x):
    return x.T if x.ndim == 2 else x


def aten_transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1)


def aten_permute(x, dims):
    return jnp.transpose(x, dims)


def aten_expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    return jnp.broadcast_to(x, [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)])


def aten_unsqueeze(x, dim):
    return jnp.expand_dims(x, dim)


def aten_squeeze_dim(x, dim):
    return jnp.squeeze(x, dim) if x.shape[dim] == 1 else x


def aten_identity(x, memory_format=None):
    return x


def aten_to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else x.astype(dtype)


def aten_addmm(bias, a, b, beta=1, alpha=1):
    return beta * bias + alpha * (a @ b)


def aten_mm(a, b):
    return a @ b


def aten_add(a, b, alpha=1):
    return a + alpha * b


def aten_sub(a, b, alpha=1):
    return a - alpha * b


def aten_mul(a, b):
    return a * b


def aten_div(a, b, rounding_mode=None):
    return a / b


def aten_pow_(x, exponent):
    return x ** exponent


def aten_neg(x):
    return -x


def aten_sum_dims(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(x, axis=tuple(dim) if dim else None, keepdims=keepdim, dtype=dtype)


def aten_mean_dims(x, dim=None, keepdim=False, dtype=None):
    return jnp.mean(x, axis=tuple(dim) if dim else None, keepdims=keepdim, dtype=dtype)


def aten_gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


def aten_gelu_backward(grad, x, approximate="none"):
    return jax.vjp(lambda v: aten_gelu(v, approximate), x)[1](grad)[0]


def aten_tanh(x):
    return jnp.tanh(x)


def aten_tanh_backward(grad, output):
    return grad * (1 - output * output)


def aten_ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones_like(x, dtype=dtype)


def aten_zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros_like(x, dtype=dtype)


def aten_arange(end, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(end, dtype=dtype)


def aten_native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True) + eps)
    out = (x - mean) * rstd
    out = out * weight if weight is not None else out
    return (out + bias if bias is not None else out), mean, rstd


def aten_native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
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


def aten_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight[indices]


def aten_embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    width = grad.shape[-1]
    out = jnp.zeros((num_weights, width), grad.dtype).at[indices.reshape(-1)].add(grad.reshape(-1, width))
    return out.at[padding_idx].set(0) if padding_idx >= 0 else out


def aten_log_softmax(x, dim, half_to_float=False):
    return jax.nn.log_softmax(x, axis=dim)


def aten_log_softmax_backward_data(grad, output, dim, input_dtype):
    return grad - jnp.exp(output) * jnp.sum(grad, axis=dim, keepdims=True)


def aten_softmax(x, dim, half_to_float=False):
    return jax.nn.softmax(x, axis=dim)


def aten_softmax_backward_data(grad, output, dim, input_dtype):
    return output * (grad - jnp.sum(grad * output, axis=dim, keepdims=True))


def _nll_terms(x, target, weight, ignore_index):
    keep = target != ignore_index
    safe = jnp.where(keep, target, 0)
    w = keep.astype(x.dtype) if weight is None else jnp.where(keep, weight[safe], 0).astype(x.dtype)
    return safe, w


def aten_nll_loss_forward(x, target, weight, reduction, ignore_index):
    safe, w = _nll_terms(x, target, weight, ignore_index)
    picked = jnp.take_along_axis(x, safe[..., None], axis=-1)[..., 0] if x.ndim > 1 else x[safe]
    total = jnp.sum(w)
    losses = -picked * w
    if reduction == 0:
        return losses, total
    return (jnp.sum(losses) / total if reduction == 1 else jnp.sum(losses)), total


def aten_nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    safe, w = _nll_terms(x, target, weight, ignore_index)
    g = -grad * w / total_weight if reduction == 1 else -grad * w
    if x.ndim == 1:
        return jnp.zeros_like(x).at[safe].add(g)
    rows = jnp.arange(x.shape[0])
    return jnp.zeros_like(x).at[rows, safe].add(g)


def _attention(q, k, v, is_causal, scale, attn_mask=None):
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


def aten_where(condition, a, b):
    return jnp.where(condition, a, b)


def aten_masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value, x.dtype), x)


def aten_cat(tensors, dim=0):
    kept = [x for x in tensors if not (x.ndim == 1 and x.shape[0] == 0)]  # ATen skips empty 1-D tensors
    return jnp.concatenate(kept, axis=dim) if kept else tensors[0]


def aten_constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):  # ATen pads the last dim first
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return jnp.pad(x, widths, constant_values=value)


def aten_slice(x, dim=0, start=None, end=None, step=1):
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


def aten_slice_backward(grad, input_sizes, dim, start, end, step):
    index = [slice(None)] * len(input_sizes)
    index[dim] = slice(start, end, step)
    return jnp.zeros(input_sizes, grad.dtype).at[tuple(index)].set(grad)


def aten_select(x, dim, index):
    return jnp.take(x, index, axis=dim)


def aten_select_backward(grad, input_sizes, dim, index):
    where = [slice(None)] * len(input_sizes)
    where[dim] = index
    return jnp.zeros(input_sizes, grad.dtype).at[tuple(where)].set(grad)


def aten_split(x, split_size, dim=0):
    return [lax.slice_in_dim(x, i, min(i + split_size, x.shape[dim]), axis=dim)
            for i in range(0, x.shape[dim], split_size)]


def aten_gather(x, dim, index, sparse_grad=False):
    return jnp.take_along_axis(x, index, axis=dim)


def aten_scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, dtype=dtype)


def aten_ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(size, dtype=dtype)


def aten_zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, dtype=dtype)


def aten_empty_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros_like(x, dtype=dtype)  # never read before written: zeros are as good


def aten_fill(x, value):
    return jnp.full_like(x, value)


def aten_le(a, b):
    return a <= b


def aten_lt(a, b):
    return a < b


def aten_ge(a, b):
    return a >= b


def aten_gt(a, b):
    return a > b


def aten_eq(a, b):
    return a == b


def aten_bitwise_and(a, b):
    return a & b


def aten_bitwise_not(x):
    return ~x


def aten_cos(x):
    return jnp.cos(x)


def aten_sin(x):
    return jnp.sin(x)


def aten_exp(x):
    return jnp.exp(x)


def aten_rsqrt(x):
    return lax.rsqrt(x)


def aten_sigmoid(x):
    return jax.nn.sigmoid(x)


def aten_silu(x):
    return jax.nn.silu(x)


def aten_silu_backward(grad, x):
    sig = jax.nn.sigmoid(x)
    return grad * sig * (1 + x * (1 - sig))


def aten_convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise NotImplementedError("transposed convolution is not translated to JAX yet")
    spatial = "DHW"[3 - (x.ndim - 2):]
    out = lax.conv_general_dilated(x, weight, window_strides=stride, padding=[(p, p) for p in padding],
                                   rhs_dilation=dilation, feature_group_count=groups,
                                   dimension_numbers=("NC" + spatial, "OI" + spatial, "NC" + spatial))
    return out if bias is None else out + bias.reshape((1, -1) + (1,) * (x.ndim - 2))


def aten_convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                              groups, output_mask):
    conv = lambda a, b: aten_convolution(a, b, None, stride, padding, dilation, transposed, output_padding, groups)
    grad_x, grad_w = jax.vjp(conv, x, weight)[1](grad)
    grad_b = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim))) if bias_sizes is not None else None
    return grad_x, grad_w, grad_b


TABLE = {
    "aten.view.default": aten_view,
    "aten._unsafe_view.default": aten_view,
    "aten.reshape.default": aten_view,
    "aten.t.default": aten_t,
    "aten.transpose.int": aten_transpose,
    "aten.permute.default": aten_permute,
    "aten.expand.default": aten_expand,
    "aten.unsqueeze.default": aten_unsqueeze,
    "aten.squeeze.dim": aten_squeeze_dim,
    "aten.clone.default": aten_identity,
    "aten.detach.default": aten_identity,
    "aten.alias.default": aten_identity,
    "aten._to_copy.default": aten_to_copy,
    "aten.addmm.default": aten_addmm,
    "aten.mm.default": aten_mm,
    "aten.bmm.default": aten_mm,
    "aten.add.Tensor": aten_add,
    "aten.sub.Tensor": aten_sub,
    "aten.mul.Tensor": aten_mul,
    "aten.mul.Scalar": aten_mul,
    "aten.div.Tensor": aten_div,
    "aten.div.Scalar": aten_div,
    "aten.pow.Tensor_Scalar": aten_pow_,
    "aten.neg.default": aten_neg,
    "aten.sum.dim_IntList": aten_sum_dims,
    "aten.sum.default": aten_sum_dims,
    "aten.mean.dim": aten_mean_dims,
    "aten.mean.default": aten_mean_dims,
    "aten.gelu.default": aten_gelu,
    "aten.gelu_backward.default": aten_gelu_backward,
    "aten.tanh.default": aten_tanh,
    "aten.tanh_backward.default": aten_tanh_backward,
    "aten.ones_like.default": aten_ones_like,
    "aten.zeros_like.default": aten_zeros_like,
    "aten.arange.default": aten_arange,
    "aten.native_layer_norm.default": aten_native_layer_norm,
    "aten.native_layer_norm_backward.default": aten_native_layer_norm_backward,
    "aten.embedding.default": aten_embedding,
    "aten.embedding_dense_backward.default": aten_embedding_dense_backward,
    "aten._log_softmax.default": aten_log_softmax,
    "aten._log_softmax_backward_data.default": aten_log_softmax_backward_data,
    "aten._softmax.default": aten_softmax,
    "aten._softmax_backward_data.default": aten_softmax_backward_data,
    "aten.nll_loss_forward.default": aten_nll_loss_forward,
    "aten.nll_loss_backward.default": aten_nll_loss_backward,
    "aten._scaled_dot_product_flash_attention_for_cpu.default": aten_sdpa_flash_cpu,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": aten_sdpa_flash_cpu_backward,
    "aten.where.self": aten_where,
    "aten.masked_fill.Scalar": aten_masked_fill,
    "aten.cat.default": aten_cat,
    "aten.constant_pad_nd.default": aten_constant_pad_nd,
    "aten.slice.Tensor": aten_slice,
    "aten.slice_backward.default": aten_slice_backward,
    "aten.select.int": aten_select,
    "aten.select_backward.default": aten_select_backward,
    "aten.split.Tensor": aten_split,
    "aten.gather.default": aten_gather,
    "aten.scalar_tensor.default": aten_scalar_tensor,
    "aten.ones.default": aten_ones,
    "aten.zeros.default": aten_zeros,
    "aten.empty_like.default": aten_empty_like,
    "aten.fill.Scalar": aten_fill,
    "aten.lift_fresh_copy.default": aten_identity,
    "aten.add.Scalar": aten_add,
    "aten.sub.Scalar": aten_sub,
    "aten.le.Tensor": aten_le,
    "aten.le.Scalar": aten_le,
    "aten.lt.Tensor": aten_lt,
    "aten.lt.Scalar": aten_lt,
    "aten.ge.Tensor": aten_ge,
    "aten.ge.Scalar": aten_ge,
    "aten.gt.Tensor": aten_gt,
    "aten.gt.Scalar": aten_gt,
    "aten.eq.Tensor": aten_eq,
    "aten.eq.Scalar": aten_eq,
    "aten.bitwise_and.Tensor": aten_bitwise_and,
    "aten.bitwise_not.default": aten_bitwise_not,
    "aten.cos.default": aten_cos,
    "aten.sin.default": aten_sin,
    "aten.exp.default": aten_exp,
    "aten.rsqrt.default": aten_rsqrt,
    "aten.sigmoid.default": aten_sigmoid,
    "aten.silu.default": aten_silu,
    "aten.silu_backward.default": aten_silu_backward,
    "aten.convolution.default": aten_convolution,
    "aten.convolution_backward.default": aten_convolution_backward,
}

# functions a table entry calls besides itself (the emitted program carries them too)
DEPENDS = {
    aten_gelu_backward: (aten_gelu,),
    aten_nll_loss_forward: (_nll_terms,),
    aten_nll_loss_backward: (_nll_terms,),
    aten_sdpa_flash_cpu: (_attention,),
    aten_sdpa_flash_cpu_backward: (_attention,),
    aten_convolution_backward: (aten_convolution,),
}
