# autopar: training step as a sharded JAX program (generated; do not edit)
# plan 9dc2b6f38b6f | graph 6d97ab77c17ffb6f | mesh (tp=2) | hardware h100-sxm
# predicted step 0.1920 ms = compute 0.1920 ms + communication 0.0000 ms
# passes:
#   shapes: 309 nodes
#   strategies: 309 nodes, 116 free, 391 strategies, 0 fallbacks
#   cluster_layers: no repeated layers
#   solve_sharding: 116 variables groups, 220 edges, 3027 booleans, optimal, objective 0.1920 ms, gap 0.00%
#   collectives: 0 redistributions, 0 collectives
#   recompute: peak 10.9 MB per device at _log_softmax_backward_data
#   predict: step 0.1920 ms (compute 0.1920, communication 0.0000 + 0.0000 hidden), 0% of FLOPs sharded
"""Run it: python THIS_FILE.py --params params.npz --batch batch.npz [--grads out.npz] [--seed N]
(one step; prints the loss; dropout masks are drawn from jax.random.key(N), or read from --masks masks.npz).
On several hosts, set JAX's multi-host variables (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) on each and run the same file: it calls jax.distributed.initialize()."""
import argparse
import math
import os

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

PLAN_HASH = '9dc2b6f38b6f'
AXES = ('tp',)
SHAPE = (2,)
PLACEHOLDERS = [
    'wte_weight', 'wpe_weight', 'blocks_0_ln1_weight', 'blocks_0_ln1_bias', 'blocks_0_attn_q_weight',
    'blocks_0_attn_q_bias', 'blocks_0_attn_k_weight', 'blocks_0_attn_k_bias', 'blocks_0_attn_v_weight',
    'blocks_0_attn_v_bias', 'blocks_0_attn_proj_weight', 'blocks_0_attn_proj_bias', 'blocks_0_ln2_weight',
    'blocks_0_ln2_bias', 'blocks_0_fc_weight', 'blocks_0_fc_bias', 'blocks_0_out_weight', 'blocks_0_out_bias',
    'blocks_1_ln1_weight', 'blocks_1_ln1_bias', 'blocks_1_attn_q_weight', 'blocks_1_attn_q_bias',
    'blocks_1_attn_k_weight', 'blocks_1_attn_k_bias', 'blocks_1_attn_v_weight', 'blocks_1_attn_v_bias',
    'blocks_1_attn_proj_weight', 'blocks_1_attn_proj_bias', 'blocks_1_ln2_weight', 'blocks_1_ln2_bias',
    'blocks_1_fc_weight', 'blocks_1_fc_bias', 'blocks_1_out_weight', 'blocks_1_out_bias', 'ln_f_weight', 'ln_f_bias',
    'head_weight', 'idx', 'targets',
]
# placeholder -> parameter name
PARAMETERS = {
    'wte_weight': 'wte.weight', 'wpe_weight': 'wpe.weight', 'blocks_0_ln1_weight': 'blocks.0.ln1.weight',
    'blocks_0_ln1_bias': 'blocks.0.ln1.bias', 'blocks_0_attn_q_weight': 'blocks.0.attn.q.weight',
    'blocks_0_attn_q_bias': 'blocks.0.attn.q.bias', 'blocks_0_attn_k_weight': 'blocks.0.attn.k.weight',
    'blocks_0_attn_k_bias': 'blocks.0.attn.k.bias', 'blocks_0_attn_v_weight': 'blocks.0.attn.v.weight',
    'blocks_0_attn_v_bias': 'blocks.0.attn.v.bias', 'blocks_0_attn_proj_weight': 'blocks.0.attn.proj.weight',
    'blocks_0_attn_proj_bias': 'blocks.0.attn.proj.bias', 'blocks_0_ln2_weight': 'blocks.0.ln2.weight',
    'blocks_0_ln2_bias': 'blocks.0.ln2.bias', 'blocks_0_fc_weight': 'blocks.0.fc.weight',
    'blocks_0_fc_bias': 'blocks.0.fc.bias', 'blocks_0_out_weight': 'blocks.0.out.weight',
    'blocks_0_out_bias': 'blocks.0.out.bias', 'blocks_1_ln1_weight': 'blocks.1.ln1.weight',
    'blocks_1_ln1_bias': 'blocks.1.ln1.bias', 'blocks_1_attn_q_weight': 'blocks.1.attn.q.weight',
    'blocks_1_attn_q_bias': 'blocks.1.attn.q.bias', 'blocks_1_attn_k_weight': 'blocks.1.attn.k.weight',
    'blocks_1_attn_k_bias': 'blocks.1.attn.k.bias', 'blocks_1_attn_v_weight': 'blocks.1.attn.v.weight',
    'blocks_1_attn_v_bias': 'blocks.1.attn.v.bias', 'blocks_1_attn_proj_weight': 'blocks.1.attn.proj.weight',
    'blocks_1_attn_proj_bias': 'blocks.1.attn.proj.bias', 'blocks_1_ln2_weight': 'blocks.1.ln2.weight',
    'blocks_1_ln2_bias': 'blocks.1.ln2.bias', 'blocks_1_fc_weight': 'blocks.1.fc.weight',
    'blocks_1_fc_bias': 'blocks.1.fc.bias', 'blocks_1_out_weight': 'blocks.1.out.weight',
    'blocks_1_out_bias': 'blocks.1.out.bias', 'ln_f_weight': 'ln_f.weight', 'ln_f_bias': 'ln_f.bias',
    'head_weight': 'head.weight',
}
# placeholder -> buffer name
BUFFERS = {}
# placeholders of the batch, in forward's argument order
INPUTS = ['idx', 'targets']
SPECS = {
    'wte_weight': P(None, None), 'wpe_weight': P(None, None), 'blocks_0_ln1_weight': P(None),
    'blocks_0_ln1_bias': P(None), 'blocks_0_attn_q_weight': P(None, None), 'blocks_0_attn_q_bias': P(None),
    'blocks_0_attn_k_weight': P(None, None), 'blocks_0_attn_k_bias': P(None), 'blocks_0_attn_v_weight': P(None, None),
    'blocks_0_attn_v_bias': P(None), 'blocks_0_attn_proj_weight': P(None, None), 'blocks_0_attn_proj_bias': P(None),
    'blocks_0_ln2_weight': P(None), 'blocks_0_ln2_bias': P(None), 'blocks_0_fc_weight': P(None, None),
    'blocks_0_fc_bias': P(None), 'blocks_0_out_weight': P(None, None), 'blocks_0_out_bias': P(None),
    'blocks_1_ln1_weight': P(None), 'blocks_1_ln1_bias': P(None), 'blocks_1_attn_q_weight': P(None, None),
    'blocks_1_attn_q_bias': P(None), 'blocks_1_attn_k_weight': P(None, None), 'blocks_1_attn_k_bias': P(None),
    'blocks_1_attn_v_weight': P(None, None), 'blocks_1_attn_v_bias': P(None),
    'blocks_1_attn_proj_weight': P(None, None), 'blocks_1_attn_proj_bias': P(None), 'blocks_1_ln2_weight': P(None),
    'blocks_1_ln2_bias': P(None), 'blocks_1_fc_weight': P(None, None), 'blocks_1_fc_bias': P(None),
    'blocks_1_out_weight': P(None, None), 'blocks_1_out_bias': P(None), 'ln_f_weight': P(None), 'ln_f_bias': P(None),
    'head_weight': P(None, None), 'idx': P(None, None), 'targets': P(None, None),
}
# dropout mask -> (global shape, probability of a zero), in the order forward draws them
MASKS = {}
MASK_SPECS = {}
# (kind, parameter name) of each value local_step returns
OUTPUTS = [
    ('loss', None), ('grad', 'wte.weight'), ('grad', 'wpe.weight'), ('grad', 'blocks.0.ln1.weight'),
    ('grad', 'blocks.0.ln1.bias'), ('grad', 'blocks.0.attn.q.weight'), ('grad', 'blocks.0.attn.q.bias'),
    ('grad', 'blocks.0.attn.k.weight'), ('grad', 'blocks.0.attn.k.bias'), ('grad', 'blocks.0.attn.v.weight'),
    ('grad', 'blocks.0.attn.v.bias'), ('grad', 'blocks.0.attn.proj.weight'), ('grad', 'blocks.0.attn.proj.bias'),
    ('grad', 'blocks.0.ln2.weight'), ('grad', 'blocks.0.ln2.bias'), ('grad', 'blocks.0.fc.weight'),
    ('grad', 'blocks.0.fc.bias'), ('grad', 'blocks.0.out.weight'), ('grad', 'blocks.0.out.bias'),
    ('grad', 'blocks.1.ln1.weight'), ('grad', 'blocks.1.ln1.bias'), ('grad', 'blocks.1.attn.q.weight'),
    ('grad', 'blocks.1.attn.q.bias'), ('grad', 'blocks.1.attn.k.weight'), ('grad', 'blocks.1.attn.k.bias'),
    ('grad', 'blocks.1.attn.v.weight'), ('grad', 'blocks.1.attn.v.bias'), ('grad', 'blocks.1.attn.proj.weight'),
    ('grad', 'blocks.1.attn.proj.bias'), ('grad', 'blocks.1.ln2.weight'), ('grad', 'blocks.1.ln2.bias'),
    ('grad', 'blocks.1.fc.weight'), ('grad', 'blocks.1.fc.bias'), ('grad', 'blocks.1.out.weight'),
    ('grad', 'blocks.1.out.bias'), ('grad', 'ln_f.weight'), ('grad', 'ln_f.bias'), ('grad', 'head.weight'),
]
OUTPUT_SPECS = (
    P(), P(None, None), P(None, None), P(None), P(None), P(None, None), P(None), P(None, None), P(None), P(None, None),
    P(None), P(None, None), P(None), P(None), P(None), P(None, None), P(None), P(None, None), P(None), P(None), P(None),
    P(None, None), P(None), P(None, None), P(None), P(None, None), P(None), P(None, None), P(None), P(None), P(None),
    P(None, None), P(None), P(None, None), P(None), P(None), P(None), P(None, None),
)


# ---- ATen ops in JAX (autopar.backends.jax.aten) ----
def aten_arange(start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(start, end, step, dtype=dtype) if end is not None else jnp.arange(start, dtype=dtype)

def aten_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight[indices]

def _category(dtype) -> int:
    if dtype == jnp.bool_:
        return 0
    return 1 if jnp.issubdtype(dtype, jnp.integer) else 2

def _promoted(*operands):
    """The operands cast to torch's result dtype (Python numbers stay numbers: JAX keeps them weak)."""
    arrays = [x for x in operands if hasattr(x, "dtype")]
    shaped = [x.dtype for x in arrays if x.ndim > 0]
    dtype = jnp.result_type(*shaped) if shaped else None
    scalar_dims = [x.dtype for x in arrays if x.ndim == 0]
    if scalar_dims:
        zero_dim = jnp.result_type(*scalar_dims)
        if dtype is None or _category(zero_dim) > _category(dtype):
            dtype = zero_dim
    numbers = [x for x in operands if not hasattr(x, "dtype")]
    if dtype is not None and any(isinstance(n, float) for n in numbers) and _category(dtype) < 2:
        dtype = jnp.float32
    elif dtype is not None and _category(dtype) == 0 and any(type(n) is int for n in numbers):
        dtype = jnp.int32
    if dtype is None:
        return operands
    return tuple(x.astype(dtype) if hasattr(x, "dtype") else x for x in operands)

def aten_add(a, b, alpha=1):
    a, b = _promoted(a, b)
    return a + b if alpha == 1 else a + alpha * b

def _wide(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x

def _in_float32(function, *xs):
    """function computed in float32 for low-precision inputs and rounded once, as torch's CPU
    kernels do; None arguments stay None, and each output of several is rounded."""
    dtype = xs[0].dtype
    if dtype not in (jnp.bfloat16, jnp.float16):
        return function(*xs)
    out = function(*(None if x is None else _wide(x) for x in xs))
    if isinstance(out, tuple):
        return tuple(None if o is None else o.astype(dtype) for o in out)
    return out.astype(dtype)

def _layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    rstd = lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True) + eps)
    out = (x - mean) * rstd
    out = out * weight if weight is not None else out
    return (out + bias if bias is not None else out), mean, rstd

def aten_native_layer_norm(x, normalized_shape, weight, bias, eps):
    return _in_float32(lambda a, w, b: _layer_norm(a, normalized_shape, w, b, eps), x, weight, bias)

def aten_view(x, size):
    return jnp.reshape(x, size)

def aten_t(x):
    return x.T if x.ndim == 2 else x

def aten_addmm(bias, a, b, beta=1, alpha=1):
    if not jnp.issubdtype(a.dtype, jnp.inexact):  # integer tensors take the integral part of the scalars
        beta, alpha = int(beta), int(alpha)
    if a.dtype in (jnp.bfloat16, jnp.float16):  # the sum and the bias in float32, rounded once
        product = jnp.matmul(a, b, preferred_element_type=jnp.float32)
        return (beta * bias.astype(jnp.float32) + alpha * product).astype(a.dtype)
    return beta * bias + alpha * (a @ b)

def aten_transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1) if x.ndim else x

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

def aten_identity(x, memory_format=None):
    return x

def aten_gelu(x, approximate="none"):
    return _in_float32(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)

def aten_mm(a, b):
    if a.dtype in (jnp.bfloat16, jnp.float16):  # accumulated in float32 and rounded once, as torch does
        return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
    return a @ b

def aten_log_softmax(x, dim, half_to_float=False):
    x = x.astype(jnp.float32) if half_to_float else x  # a half-precision input, a float32 result
    return _in_float32(lambda v: jax.nn.log_softmax(v, axis=dim), x) if x.ndim else jnp.zeros_like(x)

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

def _floating(x):
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)

def _is_integral(x) -> bool:
    return not jnp.issubdtype(x.dtype, jnp.inexact)

def aten_div(a, b, rounding_mode=None):
    if rounding_mode is None:
        a, b = _promoted(_floating(a) if hasattr(a, "dtype") else float(a), b)
        return a / b
    a, b = _promoted(a, b)
    integral = _is_integral(a) if hasattr(a, "dtype") else _is_integral(b)
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)
    if integral:  # C division truncates: floor, plus one where the remainder's sign differs from the divisor's
        floor = jnp.floor_divide(a, b)
        return floor + ((jnp.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(floor.dtype)
    return jnp.trunc(a / b)

def aten_ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones_like(x, dtype=dtype)

def aten_nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    safe, w = _nll_terms(x, target, weight, ignore_index)
    g = -grad * w / total_weight if reduction == 1 else -grad * w
    if x.ndim == 1:
        return jnp.zeros_like(x).at[safe].add(g)
    rows = jnp.arange(x.shape[0])
    return jnp.zeros_like(x).at[rows, safe].add(g)

def aten_log_softmax_backward_data(grad, output, dim, input_dtype):
    return _in_float32(lambda g, out: g - jnp.exp(out) * jnp.sum(g, axis=dim if g.ndim else None, keepdims=True),
                       grad, output)

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

def aten_native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    return _in_float32(lambda g, a, m, r, w: _layer_norm_backward(g, a, normalized_shape, m, r, w, bias),
                            grad_out, x, mean, rstd, weight)

def _accumulating(x, dtype):
    """x in the dtype to accumulate in, and the dtype to return."""
    if dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32), dtype
    if dtype is not None:
        return x.astype(dtype), dtype
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32), x.dtype
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x.astype(jnp.int32), jnp.int32
    return x, x.dtype

def _axes(x, dim):
    """``dim`` as JAX axes: None (or []) is every axis; a 0-dim tensor has none to name."""
    if x.ndim == 0 or dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim

def aten_sum(x, dim=None, keepdim=False, dtype=None):
    x, out = _accumulating(x, dtype)
    return jnp.sum(x, axis=_axes(x, dim), keepdims=keepdim).astype(out)

def aten_gelu_backward(grad, x, approximate="none"):
    return _in_float32(lambda g, v: jax.vjp(lambda u: jax.nn.gelu(u, approximate=approximate == "tanh"), v)[1](g)[0],
                       grad, x)

def aten_sdpa_flash_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    if dropout_p:
        raise NotImplementedError("attention dropout is not translated to JAX (its mask would differ from torch's)")
    return jax.vjp(lambda a, b, c: _attention(a, b, c, is_causal, scale, attn_mask)[0], q, k, v)[1](grad_out)

def aten_embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    width = grad.shape[-1]
    out = jnp.zeros((num_weights, width), grad.dtype).at[indices.reshape(-1)].add(grad.reshape(-1, width))
    return out.at[padding_idx].set(0) if padding_idx >= 0 else out


def forward_local(
    wte_weight, wpe_weight, blocks_0_ln1_weight, blocks_0_ln1_bias, blocks_0_attn_q_weight, blocks_0_attn_q_bias,
    blocks_0_attn_k_weight, blocks_0_attn_k_bias, blocks_0_attn_v_weight, blocks_0_attn_v_bias,
    blocks_0_attn_proj_weight, blocks_0_attn_proj_bias, blocks_0_ln2_weight, blocks_0_ln2_bias, blocks_0_fc_weight,
    blocks_0_fc_bias, blocks_0_out_weight, blocks_0_out_bias, blocks_1_ln1_weight, blocks_1_ln1_bias,
    blocks_1_attn_q_weight, blocks_1_attn_q_bias, blocks_1_attn_k_weight, blocks_1_attn_k_bias, blocks_1_attn_v_weight,
    blocks_1_attn_v_bias, blocks_1_attn_proj_weight, blocks_1_attn_proj_bias, blocks_1_ln2_weight, blocks_1_ln2_bias,
    blocks_1_fc_weight, blocks_1_fc_bias, blocks_1_out_weight, blocks_1_out_bias, ln_f_weight, ln_f_bias, head_weight,
    idx, targets,
):
    """One rank's forward program on its local blocks: (loss, the values backward reads)."""

    # ---- forward ----
    # <model>
    arange = aten_arange(32, device=None, pin_memory=False)
    # wte
    embedding = aten_embedding(wte_weight, idx)
    # wpe
    embedding_1 = aten_embedding(wpe_weight, arange)
    # <model>
    add = aten_add(embedding, embedding_1)
    # blocks.0.ln1
    native_layer_norm = aten_native_layer_norm(add, [128], blocks_0_ln1_weight, blocks_0_ln1_bias, 1e-05)
    getitem = native_layer_norm[0]
    getitem_1 = native_layer_norm[1]
    getitem_2 = native_layer_norm[2]
    # blocks.0.attn.q
    view = aten_view(getitem, [256, 128])
    t = aten_t(blocks_0_attn_q_weight)
    addmm = aten_addmm(blocks_0_attn_q_bias, view, t)
    view_1 = aten_view(addmm, [8, 32, 128])
    # blocks.0.attn
    view_2 = aten_view(view_1, [8, 32, 4, 32])
    transpose = aten_transpose(view_2, 1, 2)
    # blocks.0.attn.k
    view_3 = aten_view(getitem, [256, 128])
    t_1 = aten_t(blocks_0_attn_k_weight)
    addmm_1 = aten_addmm(blocks_0_attn_k_bias, view_3, t_1)
    view_4 = aten_view(addmm_1, [8, 32, 128])
    # blocks.0.attn
    view_5 = aten_view(view_4, [8, 32, 4, 32])
    transpose_1 = aten_transpose(view_5, 1, 2)
    # blocks.0.attn.v
    view_6 = aten_view(getitem, [256, 128])
    t_2 = aten_t(blocks_0_attn_v_weight)
    addmm_2 = aten_addmm(blocks_0_attn_v_bias, view_6, t_2)
    view_7 = aten_view(addmm_2, [8, 32, 128])
    # blocks.0.attn
    view_8 = aten_view(view_7, [8, 32, 4, 32])
    transpose_2 = aten_transpose(view_8, 1, 2)
    attention = aten_sdpa_flash_cpu(transpose, transpose_1, transpose_2, 0.0, True)
    getitem_3 = attention[0]
    getitem_4 = attention[1]
    detach = aten_identity(getitem_3)
    transpose_3 = aten_transpose(getitem_3, 1, 2)
    view_9 = aten_view(transpose_3, [8, 32, 128])
    # blocks.0.attn.proj
    view_10 = aten_view(view_9, [256, 128])
    t_3 = aten_t(blocks_0_attn_proj_weight)
    addmm_3 = aten_addmm(blocks_0_attn_proj_bias, view_10, t_3)
    view_11 = aten_view(addmm_3, [8, 32, 128])
    # blocks.0
    add_1 = aten_add(add, view_11)
    # blocks.0.ln2
    native_layer_norm_1 = aten_native_layer_norm(add_1, [128], blocks_0_ln2_weight, blocks_0_ln2_bias, 1e-05)
    getitem_5 = native_layer_norm_1[0]
    getitem_6 = native_layer_norm_1[1]
    getitem_7 = native_layer_norm_1[2]
    # blocks.0.fc
    view_12 = aten_view(getitem_5, [256, 128])
    t_4 = aten_t(blocks_0_fc_weight)
    addmm_4 = aten_addmm(blocks_0_fc_bias, view_12, t_4)
    view_13 = aten_view(addmm_4, [8, 32, 512])
    # blocks.0
    gelu = aten_gelu(view_13)
    # blocks.0.out
    view_14 = aten_view(gelu, [256, 512])
    t_5 = aten_t(blocks_0_out_weight)
    addmm_5 = aten_addmm(blocks_0_out_bias, view_14, t_5)
    view_15 = aten_view(addmm_5, [8, 32, 128])
    # blocks.0
    clone = aten_identity(view_15)
    add_2 = aten_add(add_1, clone)
    # blocks.1.ln1
    native_layer_norm_2 = aten_native_layer_norm(add_2, [128], blocks_1_ln1_weight, blocks_1_ln1_bias, 1e-05)
    getitem_8 = native_layer_norm_2[0]
    getitem_9 = native_layer_norm_2[1]
    getitem_10 = native_layer_norm_2[2]
    # blocks.1.attn.q
    view_16 = aten_view(getitem_8, [256, 128])
    t_6 = aten_t(blocks_1_attn_q_weight)
    addmm_6 = aten_addmm(blocks_1_attn_q_bias, view_16, t_6)
    view_17 = aten_view(addmm_6, [8, 32, 128])
    # blocks.1.attn
    view_18 = aten_view(view_17, [8, 32, 4, 32])
    transpose_4 = aten_transpose(view_18, 1, 2)
    # blocks.1.attn.k
    view_19 = aten_view(getitem_8, [256, 128])
    t_7 = aten_t(blocks_1_attn_k_weight)
    addmm_7 = aten_addmm(blocks_1_attn_k_bias, view_19, t_7)
    view_20 = aten_view(addmm_7, [8, 32, 128])
    # blocks.1.attn
    view_21 = aten_view(view_20, [8, 32, 4, 32])
    transpose_5 = aten_transpose(view_21, 1, 2)
    # blocks.1.attn.v
    view_22 = aten_view(getitem_8, [256, 128])
    t_8 = aten_t(blocks_1_attn_v_weight)
    addmm_8 = aten_addmm(blocks_1_attn_v_bias, view_22, t_8)
    view_23 = aten_view(addmm_8, [8, 32, 128])
    # blocks.1.attn
    view_24 = aten_view(view_23, [8, 32, 4, 32])
    transpose_6 = aten_transpose(view_24, 1, 2)
    attention_1 = aten_sdpa_flash_cpu(transpose_4, transpose_5, transpose_6, 0.0, True)
    getitem_11 = attention_1[0]
    getitem_12 = attention_1[1]
    detach_1 = aten_identity(getitem_11)
    transpose_7 = aten_transpose(getitem_11, 1, 2)
    view_25 = aten_view(transpose_7, [8, 32, 128])
    # blocks.1.attn.proj
    view_26 = aten_view(view_25, [256, 128])
    t_9 = aten_t(blocks_1_attn_proj_weight)
    addmm_9 = aten_addmm(blocks_1_attn_proj_bias, view_26, t_9)
    view_27 = aten_view(addmm_9, [8, 32, 128])
    # blocks.1
    add_3 = aten_add(add_2, view_27)
    # blocks.1.ln2
    native_layer_norm_3 = aten_native_layer_norm(add_3, [128], blocks_1_ln2_weight, blocks_1_ln2_bias, 1e-05)
    getitem_13 = native_layer_norm_3[0]
    getitem_14 = native_layer_norm_3[1]
    getitem_15 = native_layer_norm_3[2]
    # blocks.1.fc
    view_28 = aten_view(getitem_13, [256, 128])
    t_10 = aten_t(blocks_1_fc_weight)
    addmm_10 = aten_addmm(blocks_1_fc_bias, view_28, t_10)
    view_29 = aten_view(addmm_10, [8, 32, 512])
    # blocks.1
    gelu_1 = aten_gelu(view_29)
    # blocks.1.out
    view_30 = aten_view(gelu_1, [256, 512])
    t_11 = aten_t(blocks_1_out_weight)
    addmm_11 = aten_addmm(blocks_1_out_bias, view_30, t_11)
    view_31 = aten_view(addmm_11, [8, 32, 128])
    # blocks.1
    clone_1 = aten_identity(view_31)
    add_4 = aten_add(add_3, clone_1)
    # ln_f
    native_layer_norm_4 = aten_native_layer_norm(add_4, [128], ln_f_weight, ln_f_bias, 1e-05)
    getitem_16 = native_layer_norm_4[0]
    getitem_17 = native_layer_norm_4[1]
    getitem_18 = native_layer_norm_4[2]
    # head
    t_12 = aten_t(head_weight)
    view_32 = aten_view(getitem_16, [256, 128])
    mm = aten_mm(view_32, t_12)
    _unsafe_view = aten_view(mm, [8, 32, 256])
    # <model>
    view_33 = aten_view(_unsafe_view, [256, 256])
    view_34 = aten_view(targets, [256])
    _log_softmax = aten_log_softmax(view_33, 1, False)
    detach_2 = aten_identity(_log_softmax)
    nll_loss_forward_default = aten_nll_loss_forward(_log_softmax, view_34, None, 2, -100)
    getitem_42 = nll_loss_forward_default[0]
    getitem_43 = nll_loss_forward_default[1]
    div_tensor = aten_div(getitem_42, getitem_43)
    return div_tensor, [
        arange, add, getitem_1, getitem_2, view, transpose, view_3, transpose_1, view_6, transpose_2, getitem_4, detach,
        view_10, add_1, getitem_6, getitem_7, view_12, view_13, view_14, add_2, getitem_9, getitem_10, view_16, transpose_4,
        view_19, transpose_5, view_22, transpose_6, getitem_12, detach_1, view_26, add_3, getitem_14, getitem_15, view_28,
        view_29, view_30, add_4, getitem_17, getitem_18, view_32, view_34, _log_softmax, detach_2, getitem_43, div_tensor,
    ]


def backward_local(
    wte_weight, wpe_weight, blocks_0_ln1_weight, blocks_0_ln1_bias, blocks_0_attn_q_weight, blocks_0_attn_q_bias,
    blocks_0_attn_k_weight, blocks_0_attn_k_bias, blocks_0_attn_v_weight, blocks_0_attn_v_bias,
    blocks_0_attn_proj_weight, blocks_0_attn_proj_bias, blocks_0_ln2_weight, blocks_0_ln2_bias, blocks_0_fc_weight,
    blocks_0_fc_bias, blocks_0_out_weight, blocks_0_out_bias, blocks_1_ln1_weight, blocks_1_ln1_bias,
    blocks_1_attn_q_weight, blocks_1_attn_q_bias, blocks_1_attn_k_weight, blocks_1_attn_k_bias, blocks_1_attn_v_weight,
    blocks_1_attn_v_bias, blocks_1_attn_proj_weight, blocks_1_attn_proj_bias, blocks_1_ln2_weight, blocks_1_ln2_bias,
    blocks_1_fc_weight, blocks_1_fc_bias, blocks_1_out_weight, blocks_1_out_bias, ln_f_weight, ln_f_bias, head_weight,
    idx, targets, saved,
):
    """One rank's backward program: the gradients, in OUTPUTS' order after the loss."""
    [
        arange, add, getitem_1, getitem_2, view, transpose, view_3, transpose_1, view_6, transpose_2, getitem_4, detach,
        view_10, add_1, getitem_6, getitem_7, view_12, view_13, view_14, add_2, getitem_9, getitem_10, view_16, transpose_4,
        view_19, transpose_5, view_22, transpose_6, getitem_12, detach_1, view_26, add_3, getitem_14, getitem_15, view_28,
        view_29, view_30, add_4, getitem_17, getitem_18, view_32, view_34, _log_softmax, detach_2, getitem_43, div_tensor,
    ] = saved

    # ---- backward ----
    # <model>
    ones_like_default = aten_ones_like(div_tensor, pin_memory=False)
    nll_loss_backward = aten_nll_loss_backward(ones_like_default, _log_softmax, view_34, None, 1, -100, getitem_43)
    detach_3 = aten_identity(detach_2)
    _log_softmax_backward_data = aten_log_softmax_backward_data(nll_loss_backward, detach_3, 1, jnp.float32)
    view_35 = aten_view(_log_softmax_backward_data, [8, 32, 256])
    view_36 = aten_view(view_35, [256, 256])
    t_13 = aten_t(view_36)
    # head
    grad_head_weight = aten_mm(t_13, view_32)
    mm_2 = aten_mm(view_36, head_weight)
    view_37 = aten_view(mm_2, [8, 32, 128])
    # blocks.1
    native_layer_norm_backward = aten_native_layer_norm_backward(view_37, add_4, [128], getitem_17, getitem_18, ln_f_weight, ln_f_bias, [True, True, True])
    getitem_21 = native_layer_norm_backward[0]
    grad_ln_f_weight = native_layer_norm_backward[1]
    grad_ln_f_bias = native_layer_norm_backward[2]
    view_38 = aten_view(getitem_21, [256, 128])
    # blocks.1.out
    mm_3 = aten_mm(view_38, blocks_1_out_weight)
    # blocks.1
    t_18 = aten_t(view_38)
    # blocks.1.out
    grad_blocks_1_out_weight = aten_mm(t_18, view_30)
    # blocks.1
    sum_1 = aten_sum(view_38, [0], True)
    grad_blocks_1_out_bias = aten_view(sum_1, [128])
    # blocks.1.out
    view_40 = aten_view(mm_3, [8, 32, 512])
    # blocks.1.fc
    gelu_backward = aten_gelu_backward(view_40, view_29)
    view_41 = aten_view(gelu_backward, [256, 512])
    mm_5 = aten_mm(view_41, blocks_1_fc_weight)
    t_22 = aten_t(view_41)
    grad_blocks_1_fc_weight = aten_mm(t_22, view_28)
    sum_2 = aten_sum(view_41, [0], True)
    grad_blocks_1_fc_bias = aten_view(sum_2, [512])
    view_43 = aten_view(mm_5, [8, 32, 128])
    # blocks.1.ln2
    native_layer_norm_backward_1 = aten_native_layer_norm_backward(view_43, add_3, [128], getitem_14, getitem_15, blocks_1_ln2_weight, blocks_1_ln2_bias, [True, True, True])
    getitem_24 = native_layer_norm_backward_1[0]
    grad_blocks_1_ln2_weight = native_layer_norm_backward_1[1]
    grad_blocks_1_ln2_bias = native_layer_norm_backward_1[2]
    add_5 = aten_add(getitem_21, getitem_24)
    view_44 = aten_view(add_5, [256, 128])
    # blocks.1.attn.proj
    mm_7 = aten_mm(view_44, blocks_1_attn_proj_weight)
    # blocks.1.ln2
    t_26 = aten_t(view_44)
    # blocks.1.attn.proj
    grad_blocks_1_attn_proj_weight = aten_mm(t_26, view_26)
    # blocks.1.ln2
    sum_3 = aten_sum(view_44, [0], True)
    grad_blocks_1_attn_proj_bias = aten_view(sum_3, [128])
    # blocks.1.attn.proj
    view_46 = aten_view(mm_7, [8, 32, 128])
    view_47 = aten_view(view_46, [8, 32, 4, 32])
    transpose_8 = aten_transpose(view_47, 1, 2)
    # blocks.1.attn
    detach_4 = aten_identity(detach_1)
    attention_backward = aten_sdpa_flash_cpu_backward(transpose_8, transpose_4, transpose_5, transpose_6, detach_4, getitem_12, 0.0, True)
    getitem_27 = attention_backward[0]
    getitem_28 = attention_backward[1]
    getitem_29 = attention_backward[2]
    transpose_9 = aten_transpose(getitem_29, 1, 2)
    view_48 = aten_view(transpose_9, [8, 32, 128])
    view_49 = aten_view(view_48, [256, 128])
    # blocks.1.attn.v
    mm_9 = aten_mm(view_49, blocks_1_attn_v_weight)
    # blocks.1.attn
    t_30 = aten_t(view_49)
    # blocks.1.attn.v
    grad_blocks_1_attn_v_weight = aten_mm(t_30, view_22)
    # blocks.1.attn
    sum_4 = aten_sum(view_49, [0], True)
    grad_blocks_1_attn_v_bias = aten_view(sum_4, [128])
    # blocks.1.attn.v
    view_51 = aten_view(mm_9, [8, 32, 128])
    # blocks.1.attn
    transpose_10 = aten_transpose(getitem_28, 1, 2)
    view_52 = aten_view(transpose_10, [8, 32, 128])
    view_53 = aten_view(view_52, [256, 128])
    # blocks.1.attn.k
    mm_11 = aten_mm(view_53, blocks_1_attn_k_weight)
    # blocks.1.attn
    t_34 = aten_t(view_53)
    # blocks.1.attn.k
    grad_blocks_1_attn_k_weight = aten_mm(t_34, view_19)
    # blocks.1.attn
    sum_5 = aten_sum(view_53, [0], True)
    grad_blocks_1_attn_k_bias = aten_view(sum_5, [128])
    # blocks.1.attn.k
    view_55 = aten_view(mm_11, [8, 32, 128])
    # blocks.1.attn.v
    add_6 = aten_add(view_51, view_55)
    # blocks.1.attn
    transpose_11 = aten_transpose(getitem_27, 1, 2)
    view_56 = aten_view(transpose_11, [8, 32, 128])
    view_57 = aten_view(view_56, [256, 128])
    # blocks.1.attn.q
    mm_13 = aten_mm(view_57, blocks_1_attn_q_weight)
    # blocks.1.attn
    t_38 = aten_t(view_57)
    # blocks.1.attn.q
    grad_blocks_1_attn_q_weight = aten_mm(t_38, view_16)
    # blocks.1.attn
    sum_6 = aten_sum(view_57, [0], True)
    grad_blocks_1_attn_q_bias = aten_view(sum_6, [128])
    # blocks.1.attn.q
    view_59 = aten_view(mm_13, [8, 32, 128])
    # blocks.1.attn.v
    add_7 = aten_add(add_6, view_59)
    # blocks.1.ln1
    native_layer_norm_backward_2 = aten_native_layer_norm_backward(add_7, add_2, [128], getitem_9, getitem_10, blocks_1_ln1_weight, blocks_1_ln1_bias, [True, True, True])
    getitem_30 = native_layer_norm_backward_2[0]
    grad_blocks_1_ln1_weight = native_layer_norm_backward_2[1]
    grad_blocks_1_ln1_bias = native_layer_norm_backward_2[2]
    # blocks.1.ln2
    add_8 = aten_add(add_5, getitem_30)
    view_60 = aten_view(add_8, [256, 128])
    # blocks.0.out
    mm_15 = aten_mm(view_60, blocks_0_out_weight)
    # blocks.1.ln2
    t_42 = aten_t(view_60)
    # blocks.0.out
    grad_blocks_0_out_weight = aten_mm(t_42, view_14)
    # blocks.1.ln2
    sum_7 = aten_sum(view_60, [0], True)
    grad_blocks_0_out_bias = aten_view(sum_7, [128])
    # blocks.0.out
    view_62 = aten_view(mm_15, [8, 32, 512])
    # blocks.0.fc
    gelu_backward_1 = aten_gelu_backward(view_62, view_13)
    view_63 = aten_view(gelu_backward_1, [256, 512])
    mm_17 = aten_mm(view_63, blocks_0_fc_weight)
    t_46 = aten_t(view_63)
    grad_blocks_0_fc_weight = aten_mm(t_46, view_12)
    sum_8 = aten_sum(view_63, [0], True)
    grad_blocks_0_fc_bias = aten_view(sum_8, [512])
    view_65 = aten_view(mm_17, [8, 32, 128])
    # blocks.0.ln2
    native_layer_norm_backward_3 = aten_native_layer_norm_backward(view_65, add_1, [128], getitem_6, getitem_7, blocks_0_ln2_weight, blocks_0_ln2_bias, [True, True, True])
    getitem_33 = native_layer_norm_backward_3[0]
    grad_blocks_0_ln2_weight = native_layer_norm_backward_3[1]
    grad_blocks_0_ln2_bias = native_layer_norm_backward_3[2]
    # blocks.1.ln2
    add_9 = aten_add(add_8, getitem_33)
    view_66 = aten_view(add_9, [256, 128])
    # blocks.0.attn.proj
    mm_19 = aten_mm(view_66, blocks_0_attn_proj_weight)
    # blocks.1.ln2
    t_50 = aten_t(view_66)
    # blocks.0.attn.proj
    grad_blocks_0_attn_proj_weight = aten_mm(t_50, view_10)
    # blocks.1.ln2
    sum_9 = aten_sum(view_66, [0], True)
    grad_blocks_0_attn_proj_bias = aten_view(sum_9, [128])
    # blocks.0.attn.proj
    view_68 = aten_view(mm_19, [8, 32, 128])
    view_69 = aten_view(view_68, [8, 32, 4, 32])
    transpose_12 = aten_transpose(view_69, 1, 2)
    # blocks.0.attn
    detach_5 = aten_identity(detach)
    attention_backward_1 = aten_sdpa_flash_cpu_backward(transpose_12, transpose, transpose_1, transpose_2, detach_5, getitem_4, 0.0, True)
    getitem_36 = attention_backward_1[0]
    getitem_37 = attention_backward_1[1]
    getitem_38 = attention_backward_1[2]
    transpose_13 = aten_transpose(getitem_38, 1, 2)
    view_70 = aten_view(transpose_13, [8, 32, 128])
    view_71 = aten_view(view_70, [256, 128])
    # blocks.0.attn.v
    mm_21 = aten_mm(view_71, blocks_0_attn_v_weight)
    # blocks.0.attn
    t_54 = aten_t(view_71)
    # blocks.0.attn.v
    grad_blocks_0_attn_v_weight = aten_mm(t_54, view_6)
    # blocks.0.attn
    sum_10 = aten_sum(view_71, [0], True)
    grad_blocks_0_attn_v_bias = aten_view(sum_10, [128])
    # blocks.0.attn.v
    view_73 = aten_view(mm_21, [8, 32, 128])
    # blocks.0.attn
    transpose_14 = aten_transpose(getitem_37, 1, 2)
    view_74 = aten_view(transpose_14, [8, 32, 128])
    view_75 = aten_view(view_74, [256, 128])
    # blocks.0.attn.k
    mm_23 = aten_mm(view_75, blocks_0_attn_k_weight)
    # blocks.0.attn
    t_58 = aten_t(view_75)
    # blocks.0.attn.k
    grad_blocks_0_attn_k_weight = aten_mm(t_58, view_3)
    # blocks.0.attn
    sum_11 = aten_sum(view_75, [0], True)
    grad_blocks_0_attn_k_bias = aten_view(sum_11, [128])
    # blocks.0.attn.k
    view_77 = aten_view(mm_23, [8, 32, 128])
    # blocks.0.attn.v
    add_10 = aten_add(view_73, view_77)
    # blocks.0.attn
    transpose_15 = aten_transpose(getitem_36, 1, 2)
    view_78 = aten_view(transpose_15, [8, 32, 128])
    view_79 = aten_view(view_78, [256, 128])
    # blocks.0.attn.q
    mm_25 = aten_mm(view_79, blocks_0_attn_q_weight)
    # blocks.0.attn
    t_62 = aten_t(view_79)
    # blocks.0.attn.q
    grad_blocks_0_attn_q_weight = aten_mm(t_62, view)
    # blocks.0.attn
    sum_12 = aten_sum(view_79, [0], True)
    grad_blocks_0_attn_q_bias = aten_view(sum_12, [128])
    # blocks.0.attn.q
    view_81 = aten_view(mm_25, [8, 32, 128])
    # blocks.0.attn.v
    add_11 = aten_add(add_10, view_81)
    # blocks.0.ln1
    native_layer_norm_backward_4 = aten_native_layer_norm_backward(add_11, add, [128], getitem_1, getitem_2, blocks_0_ln1_weight, blocks_0_ln1_bias, [True, True, True])
    getitem_39 = native_layer_norm_backward_4[0]
    grad_blocks_0_ln1_weight = native_layer_norm_backward_4[1]
    grad_blocks_0_ln1_bias = native_layer_norm_backward_4[2]
    # blocks.1.ln2
    add_12 = aten_add(add_9, getitem_39)
    sum_13 = aten_sum(add_12, [0], True)
    view_82 = aten_view(sum_13, [32, 128])
    # <model>
    grad_wpe_weight = aten_embedding_dense_backward(view_82, arange, 32, -1, False)
    # blocks.1.ln2
    grad_wte_weight = aten_embedding_dense_backward(add_12, idx, 256, -1, False)
    return (grad_wte_weight, grad_wpe_weight, grad_blocks_0_ln1_weight, grad_blocks_0_ln1_bias, grad_blocks_0_attn_q_weight, grad_blocks_0_attn_q_bias, grad_blocks_0_attn_k_weight, grad_blocks_0_attn_k_bias, grad_blocks_0_attn_v_weight, grad_blocks_0_attn_v_bias, grad_blocks_0_attn_proj_weight, grad_blocks_0_attn_proj_bias, grad_blocks_0_ln2_weight, grad_blocks_0_ln2_bias, grad_blocks_0_fc_weight, grad_blocks_0_fc_bias, grad_blocks_0_out_weight, grad_blocks_0_out_bias, grad_blocks_1_ln1_weight, grad_blocks_1_ln1_bias, grad_blocks_1_attn_q_weight, grad_blocks_1_attn_q_bias, grad_blocks_1_attn_k_weight, grad_blocks_1_attn_k_bias, grad_blocks_1_attn_v_weight, grad_blocks_1_attn_v_bias, grad_blocks_1_attn_proj_weight, grad_blocks_1_attn_proj_bias, grad_blocks_1_ln2_weight, grad_blocks_1_ln2_bias, grad_blocks_1_fc_weight, grad_blocks_1_fc_bias, grad_blocks_1_out_weight, grad_blocks_1_out_bias, grad_ln_f_weight, grad_ln_f_bias, grad_head_weight,)


def local_step(
    wte_weight, wpe_weight, blocks_0_ln1_weight, blocks_0_ln1_bias, blocks_0_attn_q_weight, blocks_0_attn_q_bias,
    blocks_0_attn_k_weight, blocks_0_attn_k_bias, blocks_0_attn_v_weight, blocks_0_attn_v_bias,
    blocks_0_attn_proj_weight, blocks_0_attn_proj_bias, blocks_0_ln2_weight, blocks_0_ln2_bias, blocks_0_fc_weight,
    blocks_0_fc_bias, blocks_0_out_weight, blocks_0_out_bias, blocks_1_ln1_weight, blocks_1_ln1_bias,
    blocks_1_attn_q_weight, blocks_1_attn_q_bias, blocks_1_attn_k_weight, blocks_1_attn_k_bias, blocks_1_attn_v_weight,
    blocks_1_attn_v_bias, blocks_1_attn_proj_weight, blocks_1_attn_proj_bias, blocks_1_ln2_weight, blocks_1_ln2_bias,
    blocks_1_fc_weight, blocks_1_fc_bias, blocks_1_out_weight, blocks_1_out_bias, ln_f_weight, ln_f_bias, head_weight,
    idx, targets,
):
    """One rank's training step (run under shard_map): (loss, *gradients)."""
    loss, saved = forward_local(wte_weight, wpe_weight, blocks_0_ln1_weight, blocks_0_ln1_bias, blocks_0_attn_q_weight, blocks_0_attn_q_bias, blocks_0_attn_k_weight, blocks_0_attn_k_bias, blocks_0_attn_v_weight, blocks_0_attn_v_bias, blocks_0_attn_proj_weight, blocks_0_attn_proj_bias, blocks_0_ln2_weight, blocks_0_ln2_bias, blocks_0_fc_weight, blocks_0_fc_bias, blocks_0_out_weight, blocks_0_out_bias, blocks_1_ln1_weight, blocks_1_ln1_bias, blocks_1_attn_q_weight, blocks_1_attn_q_bias, blocks_1_attn_k_weight, blocks_1_attn_k_bias, blocks_1_attn_v_weight, blocks_1_attn_v_bias, blocks_1_attn_proj_weight, blocks_1_attn_proj_bias, blocks_1_ln2_weight, blocks_1_ln2_bias, blocks_1_fc_weight, blocks_1_fc_bias, blocks_1_out_weight, blocks_1_out_bias, ln_f_weight, ln_f_bias, head_weight, idx, targets)
    return (loss,) + backward_local(wte_weight, wpe_weight, blocks_0_ln1_weight, blocks_0_ln1_bias, blocks_0_attn_q_weight, blocks_0_attn_q_bias, blocks_0_attn_k_weight, blocks_0_attn_k_bias, blocks_0_attn_v_weight, blocks_0_attn_v_bias, blocks_0_attn_proj_weight, blocks_0_attn_proj_bias, blocks_0_ln2_weight, blocks_0_ln2_bias, blocks_0_fc_weight, blocks_0_fc_bias, blocks_0_out_weight, blocks_0_out_bias, blocks_1_ln1_weight, blocks_1_ln1_bias, blocks_1_attn_q_weight, blocks_1_attn_q_bias, blocks_1_attn_k_weight, blocks_1_attn_k_bias, blocks_1_attn_v_weight, blocks_1_attn_v_bias, blocks_1_attn_proj_weight, blocks_1_attn_proj_bias, blocks_1_ln2_weight, blocks_1_ln2_bias, blocks_1_fc_weight, blocks_1_fc_bias, blocks_1_out_weight, blocks_1_out_bias, ln_f_weight, ln_f_bias, head_weight, idx, targets, saved)


def block(x, axis, size, dim):
    """This rank's block of a replicated value along ``dim`` (Replicate -> Shard)."""
    n = x.shape[dim] // size
    return lax.dynamic_slice_in_dim(x, lax.axis_index(axis) * n, n, dim)


def make_mesh(devices=None):
    devices = np.asarray(jax.devices() if devices is None else devices)[: math.prod(SHAPE)]
    if devices.size < math.prod(SHAPE):
        raise RuntimeError(f"this plan needs {math.prod(SHAPE)} devices on a mesh {dict(zip(AXES, SHAPE))}; JAX sees "
                           f"{devices.size} (on CPU: "
                           f"XLA_FLAGS=--xla_force_host_platform_device_count={math.prod(SHAPE)})")
    return Mesh(devices.reshape(SHAPE), AXES)


def draw_masks(key):
    """Every dropout's mask for the whole tensor (True: kept), each from its own fold of ``key``."""
    return {name: jax.random.bernoulli(jax.random.fold_in(key, i), 1.0 - p, tuple(shape))
            for i, (name, (shape, p)) in enumerate(MASKS.items())}


def place(params, batch, mesh, masks=None):
    """The step's arguments, each laid out over the mesh as the plan places it (``masks``: name ->
    the dropout masks for the whole tensors; see draw_masks)."""
    values = []
    for name in PLACEHOLDERS:
        if name in PARAMETERS:
            value = params[PARAMETERS[name]]
        elif name in BUFFERS:
            value = params[BUFFERS[name]]
        else:
            value = batch[INPUTS.index(name)]
        values.append(jax.device_put(jnp.asarray(value), NamedSharding(mesh, SPECS[name])))
    if MASKS and masks is None:
        raise ValueError(f"this step draws {len(MASKS)} dropout masks: pass masks=draw_masks(jax.random.key(seed))")
    for name in MASKS:
        values.append(jax.device_put(jnp.asarray(masks[name], dtype=jnp.bool_), NamedSharding(mesh, MASK_SPECS[name])))
    return values


def train_step_fn(mesh):
    """jit(shard_map(local_step)): (placed arguments) -> (loss, *gradients)."""
    in_specs = tuple(SPECS[n] for n in PLACEHOLDERS) + tuple(MASK_SPECS[n] for n in MASKS)
    sharded = jax.shard_map(local_step, mesh=mesh, in_specs=in_specs, out_specs=OUTPUT_SPECS, check_vma=False)
    return jax.jit(sharded)


def train_step(params, batch, mesh=None, masks=None, seed=0):
    """(loss, {parameter name: gradient}) for ``params`` (name -> array) and ``batch`` (the model's
    inputs); dropout masks are ``masks`` (name -> whole mask) or drawn from ``seed``."""
    mesh = make_mesh() if mesh is None else mesh
    masks = draw_masks(jax.random.key(seed)) if masks is None else masks
    out = train_step_fn(mesh)(*place(params, batch, mesh, masks))
    return out[0], {fqn: g for (_, fqn), g in zip(OUTPUTS[1:], out[1:])}


def sgd_update(params, grads, lr=0.1):
    return {k: v - lr * grads[k] if k in grads else v for k, v in params.items()}


def adamw_update(params, grads, state, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """One AdamW step (Loshchilov and Hutter 2019); ``state`` starts as {} and is returned updated."""
    step = state.get("step", 0) + 1
    new_params, new_state = {}, {"step": step}
    for k, v in params.items():
        if k not in grads:
            new_params[k] = v
            continue
        m = betas[0] * state.get(("m", k), 0.0) + (1 - betas[0]) * grads[k]
        s = betas[1] * state.get(("v", k), 0.0) + (1 - betas[1]) * grads[k] ** 2
        m_hat, s_hat = m / (1 - betas[0] ** step), s / (1 - betas[1] ** step)
        new_params[k] = v * (1 - lr * weight_decay) - lr * m_hat / (jnp.sqrt(s_hat) + eps)
        new_state[("m", k)], new_state[("v", k)] = m, s
    return new_params, new_state


def main():
    parser = argparse.ArgumentParser(description="one training step of the planned model")
    parser.add_argument("--params", required=True, help=".npz of parameters (and buffers) by name")
    parser.add_argument("--batch", required=True, help=".npz of the inputs, arrays named x0, x1, ...")
    parser.add_argument("--grads", help="write the gradients (and the loss) to this .npz")
    parser.add_argument("--seed", type=int, default=0, help="the jax.random key the dropout masks are drawn from")
    parser.add_argument("--masks", help=".npz of the dropout masks by name (MASKS), instead of drawing them")
    args = parser.parse_args()
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize()
    params = dict(np.load(args.params))
    saved = np.load(args.batch)
    batch = [saved[f"x{i}"] for i in range(len(saved.files))]
    masks = dict(np.load(args.masks)) if args.masks else None
    loss, grads = train_step(params, batch, masks=masks, seed=args.seed)
    print(f"loss {float(loss):.8f}")
    if args.grads:
        np.savez(args.grads, __loss__=np.asarray(loss), **{k: np.asarray(v) for k, v in grads.items()})


if __name__ == "__main__":
    main()
