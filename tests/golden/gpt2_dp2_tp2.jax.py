# autopar: training step as a sharded JAX program (generated; do not edit)
# plan 8e70889be121 | graph f9c235857f9b1ca1 | mesh (dp=2, tp=2) | hardware h100-sxm
# predicted step 0.5905 ms = compute 0.4483 ms + communication 0.1421 ms
# parameter layouts (S(d): split along dim d; R: replicated):
#   wte.weight                 [256, 2048]   R on dp, R on tp
#   wpe.weight                 [64, 2048]    R on dp, R on tp
#   blocks.0.ln1.weight        [2048]        R on dp, R on tp
#   blocks.0.ln1.bias          [2048]        R on dp, R on tp
#   blocks.0.attn.q.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.0.attn.q.bias       [2048]        R on dp, S(0) on tp
#   blocks.0.attn.k.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.0.attn.k.bias       [2048]        R on dp, S(0) on tp
#   blocks.0.attn.v.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.0.attn.v.bias       [2048]        R on dp, S(0) on tp
#   blocks.0.attn.proj.weight  [2048, 2048]  R on dp, S(1) on tp
#   blocks.0.attn.proj.bias    [2048]        R on dp, R on tp
#   blocks.0.ln2.weight        [2048]        R on dp, R on tp
#   blocks.0.ln2.bias          [2048]        R on dp, R on tp
#   blocks.0.fc.weight         [8192, 2048]  R on dp, S(0) on tp
#   blocks.0.fc.bias           [8192]        R on dp, S(0) on tp
#   blocks.0.out.weight        [2048, 8192]  R on dp, S(1) on tp
#   blocks.0.out.bias          [2048]        R on dp, R on tp
#   blocks.1.ln1.weight        [2048]        R on dp, R on tp
#   blocks.1.ln1.bias          [2048]        R on dp, R on tp
#   blocks.1.attn.q.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.1.attn.q.bias       [2048]        R on dp, S(0) on tp
#   blocks.1.attn.k.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.1.attn.k.bias       [2048]        R on dp, S(0) on tp
#   blocks.1.attn.v.weight     [2048, 2048]  R on dp, S(0) on tp
#   blocks.1.attn.v.bias       [2048]        R on dp, S(0) on tp
#   blocks.1.attn.proj.weight  [2048, 2048]  R on dp, S(1) on tp
#   blocks.1.attn.proj.bias    [2048]        R on dp, R on tp
#   blocks.1.ln2.weight        [2048]        R on dp, R on tp
#   blocks.1.ln2.bias          [2048]        R on dp, R on tp
#   blocks.1.fc.weight         [8192, 2048]  R on dp, S(0) on tp
#   blocks.1.fc.bias           [8192]        R on dp, S(0) on tp
#   blocks.1.out.weight        [2048, 8192]  R on dp, S(1) on tp
#   blocks.1.out.bias          [2048]        R on dp, R on tp
#   ln_f.weight                [2048]        R on dp, R on tp
#   ln_f.bias                  [2048]        R on dp, R on tp
#   head.weight                [256, 2048]   R on dp, R on tp
# passes:
#   shapes: 309 nodes
#   strategies: 309 nodes, 116 free, 1222 strategies, 0 fallbacks
#   cluster_layers: no repeated layers
#   solve_sharding: 116 variables groups, 220 edges, 32917 booleans, optimal, objective 0.5905 ms, gap 0.00%
#   collectives: 56 redistributions, 50 collectives
#   recompute: peak 844.3 MB per device at mm_26__r55_pending
#   predict: step 0.5905 ms (compute 0.4483, communication 0.1421 + 0.2438 hidden), 100% of FLOPs sharded
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

PLAN_HASH = '8e70889be121'
AXES = ('dp', 'tp')
SHAPE = (2, 2)
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
    'blocks_0_ln1_bias': P(None), 'blocks_0_attn_q_weight': P('tp', None), 'blocks_0_attn_q_bias': P('tp'),
    'blocks_0_attn_k_weight': P('tp', None), 'blocks_0_attn_k_bias': P('tp'), 'blocks_0_attn_v_weight': P('tp', None),
    'blocks_0_attn_v_bias': P('tp'), 'blocks_0_attn_proj_weight': P(None, 'tp'), 'blocks_0_attn_proj_bias': P(None),
    'blocks_0_ln2_weight': P(None), 'blocks_0_ln2_bias': P(None), 'blocks_0_fc_weight': P('tp', None),
    'blocks_0_fc_bias': P('tp'), 'blocks_0_out_weight': P(None, 'tp'), 'blocks_0_out_bias': P(None),
    'blocks_1_ln1_weight': P(None), 'blocks_1_ln1_bias': P(None), 'blocks_1_attn_q_weight': P('tp', None),
    'blocks_1_attn_q_bias': P('tp'), 'blocks_1_attn_k_weight': P('tp', None), 'blocks_1_attn_k_bias': P('tp'),
    'blocks_1_attn_v_weight': P('tp', None), 'blocks_1_attn_v_bias': P('tp'),
    'blocks_1_attn_proj_weight': P(None, 'tp'), 'blocks_1_attn_proj_bias': P(None), 'blocks_1_ln2_weight': P(None),
    'blocks_1_ln2_bias': P(None), 'blocks_1_fc_weight': P('tp', None), 'blocks_1_fc_bias': P('tp'),
    'blocks_1_out_weight': P(None, 'tp'), 'blocks_1_out_bias': P(None), 'ln_f_weight': P(None), 'ln_f_bias': P(None),
    'head_weight': P(None, None), 'idx': P('dp', None), 'targets': P(None, None),
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
    P(), P(None, None), P(None, None), P(None), P(None), P('tp', None), P('tp'), P('tp', None), P('tp'), P('tp', None),
    P('tp'), P(None, 'tp'), P(None), P(None), P(None), P('tp', None), P('tp'), P(None, 'tp'), P(None), P(None), P(None),
    P('tp', None), P('tp'), P('tp', None), P('tp'), P('tp', None), P('tp'), P(None, 'tp'), P(None), P(None), P(None),
    P('tp', None), P('tp'), P(None, 'tp'), P(None), P(None), P(None), P(None, None),
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
    # the product, the sum and the bias in float32, rounded once (as aten_mm)
    return _in_float32(lambda x, y, c: beta * c + alpha * jnp.matmul(x, y), a, b, bias)

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
    # accumulated in float32 and rounded once, as torch does: the operands are cast first, as XLA's
    # CPU dot does not run a bf16 x bf16 = f32 product for every layout, and a product of two bf16
    # or fp16 numbers is exact in float32, so the sums are the same
    return _in_float32(jnp.matmul, a, b)

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
    arange = aten_arange(64, device=None, pin_memory=False)
    # wte
    wte_embedding = aten_embedding(wte_weight, idx)
    # wpe
    wpe_embedding = aten_embedding(wpe_weight, arange)
    # <model>
    add = aten_add(wte_embedding, wpe_embedding)
    # blocks.0.ln1
    blocks_0_ln1_native_layer_norm = aten_native_layer_norm(add, [2048], blocks_0_ln1_weight, blocks_0_ln1_bias, 1e-05)
    blocks_0_ln1_getitem = blocks_0_ln1_native_layer_norm[0]
    blocks_0_ln1_getitem_1 = blocks_0_ln1_native_layer_norm[1]
    blocks_0_ln1_getitem_2 = blocks_0_ln1_native_layer_norm[2]
    # blocks.0.attn.q
    blocks_0_attn_q_view = aten_view(blocks_0_ln1_getitem, [256, 2048])
    blocks_0_attn_q_t = aten_t(blocks_0_attn_q_weight)
    blocks_0_attn_q_addmm = aten_addmm(blocks_0_attn_q_bias, blocks_0_attn_q_view, blocks_0_attn_q_t)
    blocks_0_attn_q_view_1 = aten_view(blocks_0_attn_q_addmm, [4, 64, 1024])
    # blocks.0.attn
    blocks_0_attn_view = aten_view(blocks_0_attn_q_view_1, [4, 64, 16, 64])
    blocks_0_attn_transpose = aten_transpose(blocks_0_attn_view, 1, 2)
    # blocks.0.attn.k
    blocks_0_attn_k_view = aten_view(blocks_0_ln1_getitem, [256, 2048])
    blocks_0_attn_k_t = aten_t(blocks_0_attn_k_weight)
    blocks_0_attn_k_addmm = aten_addmm(blocks_0_attn_k_bias, blocks_0_attn_k_view, blocks_0_attn_k_t)
    blocks_0_attn_k_view_1 = aten_view(blocks_0_attn_k_addmm, [4, 64, 1024])
    # blocks.0.attn
    blocks_0_attn_view_1 = aten_view(blocks_0_attn_k_view_1, [4, 64, 16, 64])
    blocks_0_attn_transpose_1 = aten_transpose(blocks_0_attn_view_1, 1, 2)
    # blocks.0.attn.v
    blocks_0_attn_v_view = aten_view(blocks_0_ln1_getitem, [256, 2048])
    blocks_0_attn_v_t = aten_t(blocks_0_attn_v_weight)
    blocks_0_attn_v_addmm = aten_addmm(blocks_0_attn_v_bias, blocks_0_attn_v_view, blocks_0_attn_v_t)
    blocks_0_attn_v_view_1 = aten_view(blocks_0_attn_v_addmm, [4, 64, 1024])
    # blocks.0.attn
    blocks_0_attn_view_2 = aten_view(blocks_0_attn_v_view_1, [4, 64, 16, 64])
    blocks_0_attn_transpose_2 = aten_transpose(blocks_0_attn_view_2, 1, 2)
    attention = aten_sdpa_flash_cpu(blocks_0_attn_transpose, blocks_0_attn_transpose_1, blocks_0_attn_transpose_2, 0.0, True)
    blocks_0_attn_getitem = attention[0]
    blocks_0_attn_getitem_1 = attention[1]
    blocks_0_attn_detach = aten_identity(blocks_0_attn_getitem)
    blocks_0_attn_transpose_3 = aten_transpose(blocks_0_attn_getitem, 1, 2)
    blocks_0_attn_view_3 = aten_view(blocks_0_attn_transpose_3, [4, 64, 1024])
    # blocks.0.attn.proj
    blocks_0_attn_proj_view = aten_view(blocks_0_attn_view_3, [256, 1024])
    blocks_0_attn_proj_t = aten_t(blocks_0_attn_proj_weight)
    blocks_0_attn_proj_bias__r0 = jnp.where(lax.axis_index('tp') == 0, blocks_0_attn_proj_bias, jnp.zeros_like(blocks_0_attn_proj_bias))  # r0: (R, R) -> (R, P)
    blocks_0_attn_proj_addmm = aten_addmm(blocks_0_attn_proj_bias__r0, blocks_0_attn_proj_view, blocks_0_attn_proj_t)
    blocks_0_attn_proj_view_1 = aten_view(blocks_0_attn_proj_addmm, [4, 64, 2048])
    blocks_0_attn_proj_view_1__r1 = lax.psum(blocks_0_attn_proj_view_1, 'tp')  # r1: (S(0), P) -> (S(0), R)
    # blocks.0
    blocks_0_add = aten_add(add, blocks_0_attn_proj_view_1__r1)
    # blocks.0.ln2
    blocks_0_ln2_native_layer_norm = aten_native_layer_norm(blocks_0_add, [2048], blocks_0_ln2_weight, blocks_0_ln2_bias, 1e-05)
    blocks_0_ln2_getitem = blocks_0_ln2_native_layer_norm[0]
    blocks_0_ln2_getitem_1 = blocks_0_ln2_native_layer_norm[1]
    blocks_0_ln2_getitem_2 = blocks_0_ln2_native_layer_norm[2]
    # blocks.0.fc
    blocks_0_fc_view = aten_view(blocks_0_ln2_getitem, [256, 2048])
    blocks_0_fc_t = aten_t(blocks_0_fc_weight)
    blocks_0_fc_addmm = aten_addmm(blocks_0_fc_bias, blocks_0_fc_view, blocks_0_fc_t)
    blocks_0_fc_view_1 = aten_view(blocks_0_fc_addmm, [4, 64, 4096])
    # blocks.0
    blocks_0_gelu = aten_gelu(blocks_0_fc_view_1)
    # blocks.0.out
    blocks_0_out_view = aten_view(blocks_0_gelu, [256, 4096])
    blocks_0_out_t = aten_t(blocks_0_out_weight)
    blocks_0_out_bias__r2 = jnp.where(lax.axis_index('tp') == 0, blocks_0_out_bias, jnp.zeros_like(blocks_0_out_bias))  # r2: (R, R) -> (R, P)
    blocks_0_out_addmm = aten_addmm(blocks_0_out_bias__r2, blocks_0_out_view, blocks_0_out_t)
    blocks_0_out_view_1 = aten_view(blocks_0_out_addmm, [4, 64, 2048])
    # blocks.0
    blocks_0_clone = aten_identity(blocks_0_out_view_1)
    blocks_0_clone__r3 = lax.psum(blocks_0_clone, 'tp')  # r3: (S(0), P) -> (S(0), R)
    blocks_0_add_1 = aten_add(blocks_0_add, blocks_0_clone__r3)
    # blocks.1.ln1
    blocks_1_ln1_native_layer_norm = aten_native_layer_norm(blocks_0_add_1, [2048], blocks_1_ln1_weight, blocks_1_ln1_bias, 1e-05)
    blocks_1_ln1_getitem = blocks_1_ln1_native_layer_norm[0]
    blocks_1_ln1_getitem_1 = blocks_1_ln1_native_layer_norm[1]
    blocks_1_ln1_getitem_2 = blocks_1_ln1_native_layer_norm[2]
    # blocks.1.attn.q
    blocks_1_attn_q_view = aten_view(blocks_1_ln1_getitem, [256, 2048])
    blocks_1_attn_q_t = aten_t(blocks_1_attn_q_weight)
    blocks_1_attn_q_addmm = aten_addmm(blocks_1_attn_q_bias, blocks_1_attn_q_view, blocks_1_attn_q_t)
    blocks_1_attn_q_view_1 = aten_view(blocks_1_attn_q_addmm, [4, 64, 1024])
    # blocks.1.attn
    blocks_1_attn_view = aten_view(blocks_1_attn_q_view_1, [4, 64, 16, 64])
    blocks_1_attn_transpose = aten_transpose(blocks_1_attn_view, 1, 2)
    # blocks.1.attn.k
    blocks_1_attn_k_view = aten_view(blocks_1_ln1_getitem, [256, 2048])
    blocks_1_attn_k_t = aten_t(blocks_1_attn_k_weight)
    blocks_1_attn_k_addmm = aten_addmm(blocks_1_attn_k_bias, blocks_1_attn_k_view, blocks_1_attn_k_t)
    blocks_1_attn_k_view_1 = aten_view(blocks_1_attn_k_addmm, [4, 64, 1024])
    # blocks.1.attn
    blocks_1_attn_view_1 = aten_view(blocks_1_attn_k_view_1, [4, 64, 16, 64])
    blocks_1_attn_transpose_1 = aten_transpose(blocks_1_attn_view_1, 1, 2)
    # blocks.1.attn.v
    blocks_1_attn_v_view = aten_view(blocks_1_ln1_getitem, [256, 2048])
    blocks_1_attn_v_t = aten_t(blocks_1_attn_v_weight)
    blocks_1_attn_v_addmm = aten_addmm(blocks_1_attn_v_bias, blocks_1_attn_v_view, blocks_1_attn_v_t)
    blocks_1_attn_v_view_1 = aten_view(blocks_1_attn_v_addmm, [4, 64, 1024])
    # blocks.1.attn
    blocks_1_attn_view_2 = aten_view(blocks_1_attn_v_view_1, [4, 64, 16, 64])
    blocks_1_attn_transpose_2 = aten_transpose(blocks_1_attn_view_2, 1, 2)
    attention_1 = aten_sdpa_flash_cpu(blocks_1_attn_transpose, blocks_1_attn_transpose_1, blocks_1_attn_transpose_2, 0.0, True)
    blocks_1_attn_getitem = attention_1[0]
    blocks_1_attn_getitem_1 = attention_1[1]
    blocks_1_attn_detach = aten_identity(blocks_1_attn_getitem)
    blocks_1_attn_transpose_3 = aten_transpose(blocks_1_attn_getitem, 1, 2)
    blocks_1_attn_view_3 = aten_view(blocks_1_attn_transpose_3, [4, 64, 1024])
    # blocks.1.attn.proj
    blocks_1_attn_proj_view = aten_view(blocks_1_attn_view_3, [256, 1024])
    blocks_1_attn_proj_t = aten_t(blocks_1_attn_proj_weight)
    blocks_1_attn_proj_bias__r4 = jnp.where(lax.axis_index('tp') == 0, blocks_1_attn_proj_bias, jnp.zeros_like(blocks_1_attn_proj_bias))  # r4: (R, R) -> (R, P)
    blocks_1_attn_proj_addmm = aten_addmm(blocks_1_attn_proj_bias__r4, blocks_1_attn_proj_view, blocks_1_attn_proj_t)
    blocks_1_attn_proj_view_1 = aten_view(blocks_1_attn_proj_addmm, [4, 64, 2048])
    blocks_1_attn_proj_view_1__r5 = lax.psum(blocks_1_attn_proj_view_1, 'tp')  # r5: (S(0), P) -> (S(0), R)
    # blocks.1
    blocks_1_add = aten_add(blocks_0_add_1, blocks_1_attn_proj_view_1__r5)
    # blocks.1.ln2
    blocks_1_ln2_native_layer_norm = aten_native_layer_norm(blocks_1_add, [2048], blocks_1_ln2_weight, blocks_1_ln2_bias, 1e-05)
    blocks_1_ln2_getitem = blocks_1_ln2_native_layer_norm[0]
    blocks_1_ln2_getitem_1 = blocks_1_ln2_native_layer_norm[1]
    blocks_1_ln2_getitem_2 = blocks_1_ln2_native_layer_norm[2]
    # blocks.1.fc
    blocks_1_fc_view = aten_view(blocks_1_ln2_getitem, [256, 2048])
    blocks_1_fc_t = aten_t(blocks_1_fc_weight)
    blocks_1_fc_addmm = aten_addmm(blocks_1_fc_bias, blocks_1_fc_view, blocks_1_fc_t)
    blocks_1_fc_view_1 = aten_view(blocks_1_fc_addmm, [4, 64, 4096])
    # blocks.1
    blocks_1_gelu = aten_gelu(blocks_1_fc_view_1)
    # blocks.1.out
    blocks_1_out_view = aten_view(blocks_1_gelu, [256, 4096])
    blocks_1_out_t = aten_t(blocks_1_out_weight)
    blocks_1_out_bias__r6 = jnp.where(lax.axis_index('tp') == 0, blocks_1_out_bias, jnp.zeros_like(blocks_1_out_bias))  # r6: (R, R) -> (R, P)
    blocks_1_out_addmm = aten_addmm(blocks_1_out_bias__r6, blocks_1_out_view, blocks_1_out_t)
    blocks_1_out_view_1 = aten_view(blocks_1_out_addmm, [4, 64, 2048])
    # blocks.1
    blocks_1_clone = aten_identity(blocks_1_out_view_1)
    blocks_1_clone__r7 = lax.psum(blocks_1_clone, 'tp')  # r7: (S(0), P) -> (S(0), R)
    blocks_1_add_1 = aten_add(blocks_1_add, blocks_1_clone__r7)
    # ln_f
    ln_f_native_layer_norm = aten_native_layer_norm(blocks_1_add_1, [2048], ln_f_weight, ln_f_bias, 1e-05)
    ln_f_getitem = ln_f_native_layer_norm[0]
    ln_f_getitem_1 = ln_f_native_layer_norm[1]
    ln_f_getitem_2 = ln_f_native_layer_norm[2]
    # head
    head_t = aten_t(head_weight)
    head_view = aten_view(ln_f_getitem, [256, 2048])
    head_mm = aten_mm(head_view, head_t)
    head__unsafe_view = aten_view(head_mm, [4, 64, 256])
    # <model>
    view_33 = aten_view(head__unsafe_view, [256, 256])
    view_34 = aten_view(targets, [512])
    _log_softmax = aten_log_softmax(view_33, 1, False)
    detach_2 = aten_identity(_log_softmax)
    _log_softmax__r8 = lax.all_gather(_log_softmax, 'dp', axis=0, tiled=True)  # r8: (S(0), R) -> (R, R)
    nll_loss_forward_default = aten_nll_loss_forward(_log_softmax__r8, view_34, None, 2, -100)
    getitem_42 = nll_loss_forward_default[0]
    getitem_43 = nll_loss_forward_default[1]
    div_tensor = aten_div(getitem_42, getitem_43)
    return div_tensor, [
        arange, add, blocks_0_ln1_getitem_1, blocks_0_ln1_getitem_2, blocks_0_attn_q_view, blocks_0_attn_transpose,
        blocks_0_attn_k_view, blocks_0_attn_transpose_1, blocks_0_attn_v_view, blocks_0_attn_transpose_2,
        blocks_0_attn_getitem_1, blocks_0_attn_detach, blocks_0_attn_proj_view, blocks_0_add, blocks_0_ln2_getitem_1,
        blocks_0_ln2_getitem_2, blocks_0_fc_view, blocks_0_fc_view_1, blocks_0_out_view, blocks_0_add_1,
        blocks_1_ln1_getitem_1, blocks_1_ln1_getitem_2, blocks_1_attn_q_view, blocks_1_attn_transpose, blocks_1_attn_k_view,
        blocks_1_attn_transpose_1, blocks_1_attn_v_view, blocks_1_attn_transpose_2, blocks_1_attn_getitem_1,
        blocks_1_attn_detach, blocks_1_attn_proj_view, blocks_1_add, blocks_1_ln2_getitem_1, blocks_1_ln2_getitem_2,
        blocks_1_fc_view, blocks_1_fc_view_1, blocks_1_out_view, blocks_1_add_1, ln_f_getitem_1, ln_f_getitem_2, head_view,
        view_34, _log_softmax, detach_2, getitem_43, div_tensor,
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
        arange, add, blocks_0_ln1_getitem_1, blocks_0_ln1_getitem_2, blocks_0_attn_q_view, blocks_0_attn_transpose,
        blocks_0_attn_k_view, blocks_0_attn_transpose_1, blocks_0_attn_v_view, blocks_0_attn_transpose_2,
        blocks_0_attn_getitem_1, blocks_0_attn_detach, blocks_0_attn_proj_view, blocks_0_add, blocks_0_ln2_getitem_1,
        blocks_0_ln2_getitem_2, blocks_0_fc_view, blocks_0_fc_view_1, blocks_0_out_view, blocks_0_add_1,
        blocks_1_ln1_getitem_1, blocks_1_ln1_getitem_2, blocks_1_attn_q_view, blocks_1_attn_transpose, blocks_1_attn_k_view,
        blocks_1_attn_transpose_1, blocks_1_attn_v_view, blocks_1_attn_transpose_2, blocks_1_attn_getitem_1,
        blocks_1_attn_detach, blocks_1_attn_proj_view, blocks_1_add, blocks_1_ln2_getitem_1, blocks_1_ln2_getitem_2,
        blocks_1_fc_view, blocks_1_fc_view_1, blocks_1_out_view, blocks_1_add_1, ln_f_getitem_1, ln_f_getitem_2, head_view,
        view_34, _log_softmax, detach_2, getitem_43, div_tensor,
    ] = saved

    # ---- backward ----
    # <model>
    ones_like_default = aten_ones_like(div_tensor, pin_memory=False)
    view_34__r9 = block(view_34, 'dp', 2, 0)  # r9: (R, R) -> (S(0), R)
    nll_loss_backward = aten_nll_loss_backward(ones_like_default, _log_softmax, view_34__r9, None, 1, -100, getitem_43)
    detach_3 = aten_identity(detach_2)
    _log_softmax_backward_data = aten_log_softmax_backward_data(nll_loss_backward, detach_3, 1, jnp.float32)
    view_35 = aten_view(_log_softmax_backward_data, [4, 64, 256])
    # head
    head_view_1 = aten_view(view_35, [256, 256])
    head_t_1 = aten_t(head_view_1)
    grad_head_weight = aten_mm(head_t_1, head_view)
    grad_head_weight__r46_pending = lax.psum(grad_head_weight, 'dp')  # r46: (P, R) -> (R, R)
    head_mm_1 = aten_mm(head_view_1, head_weight)
    head_view_2 = aten_view(head_mm_1, [4, 64, 2048])
    # ln_f
    ln_f_native_layer_norm_backward = aten_native_layer_norm_backward(head_view_2, blocks_1_add_1, [2048], ln_f_getitem_1, ln_f_getitem_2, ln_f_weight, ln_f_bias, [True, True, True])
    ln_f_getitem_3 = ln_f_native_layer_norm_backward[0]
    grad_ln_f_weight = ln_f_native_layer_norm_backward[1]
    grad_ln_f_weight__r44_pending = lax.psum(grad_ln_f_weight, 'dp')  # r44: (P, R) -> (R, R)
    grad_ln_f_bias = ln_f_native_layer_norm_backward[2]
    grad_ln_f_bias__r45_pending = lax.psum(grad_ln_f_bias, 'dp')  # r45: (P, R) -> (R, R)
    # blocks.1.out
    blocks_1_out_view_2 = aten_view(ln_f_getitem_3, [256, 2048])
    blocks_1_out_mm = aten_mm(blocks_1_out_view_2, blocks_1_out_weight)
    blocks_1_out_t_1 = aten_t(blocks_1_out_view_2)
    blocks_1_out_t_1__r10 = lax.all_gather(blocks_1_out_t_1, 'dp', axis=1, tiled=True)  # r10: (S(1), R) -> (R, R)
    blocks_1_out_view__r11 = lax.all_gather(blocks_1_out_view, 'dp', axis=0, tiled=True)  # r11: (S(0), S(1)) -> (R, S(1))
    grad_blocks_1_out_weight = aten_mm(blocks_1_out_t_1__r10, blocks_1_out_view__r11)
    blocks_1_out_sum = aten_sum(blocks_1_out_view_2, [0], True)
    grad_blocks_1_out_bias = aten_view(blocks_1_out_sum, [2048])
    grad_blocks_1_out_bias__r43_pending = lax.psum(grad_blocks_1_out_bias, 'dp')  # r43: (P, R) -> (R, R)
    blocks_1_out_view_3 = aten_view(blocks_1_out_mm, [4, 64, 4096])
    # blocks.1
    blocks_1_gelu_backward = aten_gelu_backward(blocks_1_out_view_3, blocks_1_fc_view_1)
    # blocks.1.fc
    blocks_1_fc_view_2 = aten_view(blocks_1_gelu_backward, [256, 4096])
    blocks_1_fc_mm = aten_mm(blocks_1_fc_view_2, blocks_1_fc_weight)
    blocks_1_fc_t_1 = aten_t(blocks_1_fc_view_2)
    blocks_1_fc_t_1__r12 = lax.all_gather(blocks_1_fc_t_1, 'dp', axis=1, tiled=True)  # r12: (S(1), S(0)) -> (R, S(0))
    blocks_1_fc_view__r13 = lax.all_gather(blocks_1_fc_view, 'dp', axis=0, tiled=True)  # r13: (S(0), R) -> (R, R)
    grad_blocks_1_fc_weight = aten_mm(blocks_1_fc_t_1__r12, blocks_1_fc_view__r13)
    blocks_1_fc_sum = aten_sum(blocks_1_fc_view_2, [0], True)
    grad_blocks_1_fc_bias = aten_view(blocks_1_fc_sum, [4096])
    grad_blocks_1_fc_bias__r42_pending = lax.psum(grad_blocks_1_fc_bias, 'dp')  # r42: (P, S(0)) -> (R, S(0))
    blocks_1_fc_view_3 = aten_view(blocks_1_fc_mm, [4, 64, 2048])
    blocks_1_fc_view_3__r14 = lax.psum(blocks_1_fc_view_3, 'tp')  # r14: (S(0), P) -> (S(0), R)
    # blocks.1.ln2
    blocks_1_ln2_native_layer_norm_backward = aten_native_layer_norm_backward(blocks_1_fc_view_3__r14, blocks_1_add, [2048], blocks_1_ln2_getitem_1, blocks_1_ln2_getitem_2, blocks_1_ln2_weight, blocks_1_ln2_bias, [True, True, True])
    blocks_1_ln2_getitem_3 = blocks_1_ln2_native_layer_norm_backward[0]
    grad_blocks_1_ln2_weight = blocks_1_ln2_native_layer_norm_backward[1]
    grad_blocks_1_ln2_weight__r40_pending = lax.psum(grad_blocks_1_ln2_weight, 'dp')  # r40: (P, R) -> (R, R)
    grad_blocks_1_ln2_bias = blocks_1_ln2_native_layer_norm_backward[2]
    grad_blocks_1_ln2_bias__r41_pending = lax.psum(grad_blocks_1_ln2_bias, 'dp')  # r41: (P, R) -> (R, R)
    blocks_1_ln2_add = aten_add(ln_f_getitem_3, blocks_1_ln2_getitem_3)
    # blocks.1.attn.proj
    blocks_1_attn_proj_view_2 = aten_view(blocks_1_ln2_add, [256, 2048])
    blocks_1_attn_proj_mm = aten_mm(blocks_1_attn_proj_view_2, blocks_1_attn_proj_weight)
    blocks_1_attn_proj_t_1 = aten_t(blocks_1_attn_proj_view_2)
    grad_blocks_1_attn_proj_weight = aten_mm(blocks_1_attn_proj_t_1, blocks_1_attn_proj_view)
    grad_blocks_1_attn_proj_weight__r47_pending = lax.psum(grad_blocks_1_attn_proj_weight, 'dp')  # r47: (P, S(1)) -> (R, S(1))
    blocks_1_attn_proj_sum = aten_sum(blocks_1_attn_proj_view_2, [0], True)
    grad_blocks_1_attn_proj_bias = aten_view(blocks_1_attn_proj_sum, [2048])
    grad_blocks_1_attn_proj_bias__r39_pending = lax.psum(grad_blocks_1_attn_proj_bias, 'dp')  # r39: (P, R) -> (R, R)
    blocks_1_attn_proj_view_3 = aten_view(blocks_1_attn_proj_mm, [4, 64, 1024])
    # blocks.1.attn
    blocks_1_attn_view_4 = aten_view(blocks_1_attn_proj_view_3, [4, 64, 16, 64])
    blocks_1_attn_transpose_4 = aten_transpose(blocks_1_attn_view_4, 1, 2)
    blocks_1_attn_detach_1 = aten_identity(blocks_1_attn_detach)
    attention_backward = aten_sdpa_flash_cpu_backward(blocks_1_attn_transpose_4, blocks_1_attn_transpose, blocks_1_attn_transpose_1, blocks_1_attn_transpose_2, blocks_1_attn_detach_1, blocks_1_attn_getitem_1, 0.0, True)
    blocks_1_attn_getitem_2 = attention_backward[0]
    blocks_1_attn_getitem_3 = attention_backward[1]
    blocks_1_attn_getitem_4 = attention_backward[2]
    blocks_1_attn_transpose_5 = aten_transpose(blocks_1_attn_getitem_4, 1, 2)
    blocks_1_attn_view_5 = aten_view(blocks_1_attn_transpose_5, [4, 64, 1024])
    # blocks.1.attn.v
    blocks_1_attn_v_view_2 = aten_view(blocks_1_attn_view_5, [256, 1024])
    blocks_1_attn_v_mm = aten_mm(blocks_1_attn_v_view_2, blocks_1_attn_v_weight)
    blocks_1_attn_v_t_1 = aten_t(blocks_1_attn_v_view_2)
    grad_blocks_1_attn_v_weight = aten_mm(blocks_1_attn_v_t_1, blocks_1_attn_v_view)
    grad_blocks_1_attn_v_weight__r48_pending = lax.psum(grad_blocks_1_attn_v_weight, 'dp')  # r48: (P, S(0)) -> (R, S(0))
    blocks_1_attn_v_sum = aten_sum(blocks_1_attn_v_view_2, [0], True)
    grad_blocks_1_attn_v_bias = aten_view(blocks_1_attn_v_sum, [1024])
    grad_blocks_1_attn_v_bias__r38_pending = lax.psum(grad_blocks_1_attn_v_bias, 'dp')  # r38: (P, S(0)) -> (R, S(0))
    blocks_1_attn_v_view_3 = aten_view(blocks_1_attn_v_mm, [4, 64, 2048])
    # blocks.1.attn
    blocks_1_attn_transpose_6 = aten_transpose(blocks_1_attn_getitem_3, 1, 2)
    blocks_1_attn_view_6 = aten_view(blocks_1_attn_transpose_6, [4, 64, 1024])
    # blocks.1.attn.k
    blocks_1_attn_k_view_2 = aten_view(blocks_1_attn_view_6, [256, 1024])
    blocks_1_attn_k_mm = aten_mm(blocks_1_attn_k_view_2, blocks_1_attn_k_weight)
    blocks_1_attn_k_t_1 = aten_t(blocks_1_attn_k_view_2)
    grad_blocks_1_attn_k_weight = aten_mm(blocks_1_attn_k_t_1, blocks_1_attn_k_view)
    grad_blocks_1_attn_k_weight__r49_pending = lax.psum(grad_blocks_1_attn_k_weight, 'dp')  # r49: (P, S(0)) -> (R, S(0))
    blocks_1_attn_k_sum = aten_sum(blocks_1_attn_k_view_2, [0], True)
    grad_blocks_1_attn_k_bias = aten_view(blocks_1_attn_k_sum, [1024])
    grad_blocks_1_attn_k_bias__r37_pending = lax.psum(grad_blocks_1_attn_k_bias, 'dp')  # r37: (P, S(0)) -> (R, S(0))
    blocks_1_attn_k_view_3 = aten_view(blocks_1_attn_k_mm, [4, 64, 2048])
    # blocks.1.attn.v
    blocks_1_attn_v_add = aten_add(blocks_1_attn_v_view_3, blocks_1_attn_k_view_3)
    # blocks.1.attn
    blocks_1_attn_transpose_7 = aten_transpose(blocks_1_attn_getitem_2, 1, 2)
    blocks_1_attn_view_7 = aten_view(blocks_1_attn_transpose_7, [4, 64, 1024])
    # blocks.1.attn.q
    blocks_1_attn_q_view_2 = aten_view(blocks_1_attn_view_7, [256, 1024])
    blocks_1_attn_q_mm = aten_mm(blocks_1_attn_q_view_2, blocks_1_attn_q_weight)
    blocks_1_attn_q_t_1 = aten_t(blocks_1_attn_q_view_2)
    grad_blocks_1_attn_q_weight = aten_mm(blocks_1_attn_q_t_1, blocks_1_attn_q_view)
    grad_blocks_1_attn_q_weight__r50_pending = lax.psum(grad_blocks_1_attn_q_weight, 'dp')  # r50: (P, S(0)) -> (R, S(0))
    blocks_1_attn_q_sum = aten_sum(blocks_1_attn_q_view_2, [0], True)
    grad_blocks_1_attn_q_bias = aten_view(blocks_1_attn_q_sum, [1024])
    grad_blocks_1_attn_q_bias__r36_pending = lax.psum(grad_blocks_1_attn_q_bias, 'dp')  # r36: (P, S(0)) -> (R, S(0))
    blocks_1_attn_q_view_3 = aten_view(blocks_1_attn_q_mm, [4, 64, 2048])
    # blocks.1.attn.v
    blocks_1_attn_v_add_1 = aten_add(blocks_1_attn_v_add, blocks_1_attn_q_view_3)
    blocks_1_attn_v_add_1__r15 = lax.psum(blocks_1_attn_v_add_1, 'tp')  # r15: (S(0), P) -> (S(0), R)
    # blocks.1.ln1
    blocks_1_ln1_native_layer_norm_backward = aten_native_layer_norm_backward(blocks_1_attn_v_add_1__r15, blocks_0_add_1, [2048], blocks_1_ln1_getitem_1, blocks_1_ln1_getitem_2, blocks_1_ln1_weight, blocks_1_ln1_bias, [True, True, True])
    blocks_1_ln1_getitem_3 = blocks_1_ln1_native_layer_norm_backward[0]
    grad_blocks_1_ln1_weight = blocks_1_ln1_native_layer_norm_backward[1]
    grad_blocks_1_ln1_weight__r34_pending = lax.psum(grad_blocks_1_ln1_weight, 'dp')  # r34: (P, R) -> (R, R)
    grad_blocks_1_ln1_bias = blocks_1_ln1_native_layer_norm_backward[2]
    grad_blocks_1_ln1_bias__r35_pending = lax.psum(grad_blocks_1_ln1_bias, 'dp')  # r35: (P, R) -> (R, R)
    # blocks.1.ln2
    blocks_1_ln2_add_1 = aten_add(blocks_1_ln2_add, blocks_1_ln1_getitem_3)
    # blocks.0.out
    blocks_0_out_view_2 = aten_view(blocks_1_ln2_add_1, [256, 2048])
    blocks_0_out_mm = aten_mm(blocks_0_out_view_2, blocks_0_out_weight)
    blocks_0_out_t_1 = aten_t(blocks_0_out_view_2)
    blocks_0_out_t_1__r16 = lax.all_gather(blocks_0_out_t_1, 'dp', axis=1, tiled=True)  # r16: (S(1), R) -> (R, R)
    blocks_0_out_view__r17 = lax.all_gather(blocks_0_out_view, 'dp', axis=0, tiled=True)  # r17: (S(0), S(1)) -> (R, S(1))
    grad_blocks_0_out_weight = aten_mm(blocks_0_out_t_1__r16, blocks_0_out_view__r17)
    blocks_0_out_sum = aten_sum(blocks_0_out_view_2, [0], True)
    grad_blocks_0_out_bias = aten_view(blocks_0_out_sum, [2048])
    grad_blocks_0_out_bias__r33_pending = lax.psum(grad_blocks_0_out_bias, 'dp')  # r33: (P, R) -> (R, R)
    blocks_0_out_view_3 = aten_view(blocks_0_out_mm, [4, 64, 4096])
    # blocks.0
    blocks_0_gelu_backward = aten_gelu_backward(blocks_0_out_view_3, blocks_0_fc_view_1)
    # blocks.0.fc
    blocks_0_fc_view_2 = aten_view(blocks_0_gelu_backward, [256, 4096])
    blocks_0_fc_mm = aten_mm(blocks_0_fc_view_2, blocks_0_fc_weight)
    blocks_0_fc_t_1 = aten_t(blocks_0_fc_view_2)
    grad_blocks_0_fc_weight = aten_mm(blocks_0_fc_t_1, blocks_0_fc_view)
    grad_blocks_0_fc_weight__r51_pending = lax.psum(grad_blocks_0_fc_weight, 'dp')  # r51: (P, S(0)) -> (R, S(0))
    blocks_0_fc_sum = aten_sum(blocks_0_fc_view_2, [0], True)
    grad_blocks_0_fc_bias = aten_view(blocks_0_fc_sum, [4096])
    grad_blocks_0_fc_bias__r32_pending = lax.psum(grad_blocks_0_fc_bias, 'dp')  # r32: (P, S(0)) -> (R, S(0))
    blocks_0_fc_view_3 = aten_view(blocks_0_fc_mm, [4, 64, 2048])
    blocks_0_fc_view_3__r18 = lax.psum(blocks_0_fc_view_3, 'tp')  # r18: (S(0), P) -> (S(0), R)
    # blocks.0.ln2
    blocks_0_ln2_native_layer_norm_backward = aten_native_layer_norm_backward(blocks_0_fc_view_3__r18, blocks_0_add, [2048], blocks_0_ln2_getitem_1, blocks_0_ln2_getitem_2, blocks_0_ln2_weight, blocks_0_ln2_bias, [True, True, True])
    blocks_0_ln2_getitem_3 = blocks_0_ln2_native_layer_norm_backward[0]
    grad_blocks_0_ln2_weight = blocks_0_ln2_native_layer_norm_backward[1]
    grad_blocks_0_ln2_weight__r30_pending = lax.psum(grad_blocks_0_ln2_weight, 'dp')  # r30: (P, R) -> (R, R)
    grad_blocks_0_ln2_bias = blocks_0_ln2_native_layer_norm_backward[2]
    grad_blocks_0_ln2_bias__r31_pending = lax.psum(grad_blocks_0_ln2_bias, 'dp')  # r31: (P, R) -> (R, R)
    # blocks.1.ln2
    blocks_1_ln2_add_2 = aten_add(blocks_1_ln2_add_1, blocks_0_ln2_getitem_3)
    # blocks.0.attn.proj
    blocks_0_attn_proj_view_2 = aten_view(blocks_1_ln2_add_2, [256, 2048])
    blocks_0_attn_proj_mm = aten_mm(blocks_0_attn_proj_view_2, blocks_0_attn_proj_weight)
    blocks_0_attn_proj_t_1 = aten_t(blocks_0_attn_proj_view_2)
    grad_blocks_0_attn_proj_weight = aten_mm(blocks_0_attn_proj_t_1, blocks_0_attn_proj_view)
    grad_blocks_0_attn_proj_weight__r52_pending = lax.psum(grad_blocks_0_attn_proj_weight, 'dp')  # r52: (P, S(1)) -> (R, S(1))
    blocks_0_attn_proj_sum = aten_sum(blocks_0_attn_proj_view_2, [0], True)
    grad_blocks_0_attn_proj_bias = aten_view(blocks_0_attn_proj_sum, [2048])
    grad_blocks_0_attn_proj_bias__r29_pending = lax.psum(grad_blocks_0_attn_proj_bias, 'dp')  # r29: (P, R) -> (R, R)
    blocks_0_attn_proj_view_3 = aten_view(blocks_0_attn_proj_mm, [4, 64, 1024])
    # blocks.0.attn
    blocks_0_attn_view_4 = aten_view(blocks_0_attn_proj_view_3, [4, 64, 16, 64])
    blocks_0_attn_transpose_4 = aten_transpose(blocks_0_attn_view_4, 1, 2)
    blocks_0_attn_detach_1 = aten_identity(blocks_0_attn_detach)
    attention_backward_1 = aten_sdpa_flash_cpu_backward(blocks_0_attn_transpose_4, blocks_0_attn_transpose, blocks_0_attn_transpose_1, blocks_0_attn_transpose_2, blocks_0_attn_detach_1, blocks_0_attn_getitem_1, 0.0, True)
    blocks_0_attn_getitem_2 = attention_backward_1[0]
    blocks_0_attn_getitem_3 = attention_backward_1[1]
    blocks_0_attn_getitem_4 = attention_backward_1[2]
    blocks_0_attn_transpose_5 = aten_transpose(blocks_0_attn_getitem_4, 1, 2)
    blocks_0_attn_view_5 = aten_view(blocks_0_attn_transpose_5, [4, 64, 1024])
    # blocks.0.attn.v
    blocks_0_attn_v_view_2 = aten_view(blocks_0_attn_view_5, [256, 1024])
    blocks_0_attn_v_mm = aten_mm(blocks_0_attn_v_view_2, blocks_0_attn_v_weight)
    blocks_0_attn_v_t_1 = aten_t(blocks_0_attn_v_view_2)
    grad_blocks_0_attn_v_weight = aten_mm(blocks_0_attn_v_t_1, blocks_0_attn_v_view)
    grad_blocks_0_attn_v_weight__r53_pending = lax.psum(grad_blocks_0_attn_v_weight, 'dp')  # r53: (P, S(0)) -> (R, S(0))
    blocks_0_attn_v_sum = aten_sum(blocks_0_attn_v_view_2, [0], True)
    grad_blocks_0_attn_v_bias = aten_view(blocks_0_attn_v_sum, [1024])
    grad_blocks_0_attn_v_bias__r28_pending = lax.psum(grad_blocks_0_attn_v_bias, 'dp')  # r28: (P, S(0)) -> (R, S(0))
    blocks_0_attn_v_view_3 = aten_view(blocks_0_attn_v_mm, [4, 64, 2048])
    # blocks.0.attn
    blocks_0_attn_transpose_6 = aten_transpose(blocks_0_attn_getitem_3, 1, 2)
    blocks_0_attn_view_6 = aten_view(blocks_0_attn_transpose_6, [4, 64, 1024])
    # blocks.0.attn.k
    blocks_0_attn_k_view_2 = aten_view(blocks_0_attn_view_6, [256, 1024])
    blocks_0_attn_k_mm = aten_mm(blocks_0_attn_k_view_2, blocks_0_attn_k_weight)
    blocks_0_attn_k_t_1 = aten_t(blocks_0_attn_k_view_2)
    grad_blocks_0_attn_k_weight = aten_mm(blocks_0_attn_k_t_1, blocks_0_attn_k_view)
    grad_blocks_0_attn_k_weight__r54_pending = lax.psum(grad_blocks_0_attn_k_weight, 'dp')  # r54: (P, S(0)) -> (R, S(0))
    blocks_0_attn_k_sum = aten_sum(blocks_0_attn_k_view_2, [0], True)
    grad_blocks_0_attn_k_bias = aten_view(blocks_0_attn_k_sum, [1024])
    grad_blocks_0_attn_k_bias__r27_pending = lax.psum(grad_blocks_0_attn_k_bias, 'dp')  # r27: (P, S(0)) -> (R, S(0))
    blocks_0_attn_k_view_3 = aten_view(blocks_0_attn_k_mm, [4, 64, 2048])
    # blocks.0.attn.v
    blocks_0_attn_v_add = aten_add(blocks_0_attn_v_view_3, blocks_0_attn_k_view_3)
    # blocks.0.attn
    blocks_0_attn_transpose_7 = aten_transpose(blocks_0_attn_getitem_2, 1, 2)
    blocks_0_attn_view_7 = aten_view(blocks_0_attn_transpose_7, [4, 64, 1024])
    # blocks.0.attn.q
    blocks_0_attn_q_view_2 = aten_view(blocks_0_attn_view_7, [256, 1024])
    blocks_0_attn_q_mm = aten_mm(blocks_0_attn_q_view_2, blocks_0_attn_q_weight)
    blocks_0_attn_q_t_1 = aten_t(blocks_0_attn_q_view_2)
    grad_blocks_0_attn_q_weight = aten_mm(blocks_0_attn_q_t_1, blocks_0_attn_q_view)
    grad_blocks_0_attn_q_weight__r55_pending = lax.psum(grad_blocks_0_attn_q_weight, 'dp')  # r55: (P, S(0)) -> (R, S(0))
    blocks_0_attn_q_sum = aten_sum(blocks_0_attn_q_view_2, [0], True)
    grad_blocks_0_attn_q_bias = aten_view(blocks_0_attn_q_sum, [1024])
    grad_blocks_0_attn_q_bias__r26_pending = lax.psum(grad_blocks_0_attn_q_bias, 'dp')  # r26: (P, S(0)) -> (R, S(0))
    blocks_0_attn_q_view_3 = aten_view(blocks_0_attn_q_mm, [4, 64, 2048])
    # blocks.0.attn.v
    blocks_0_attn_v_add_1 = aten_add(blocks_0_attn_v_add, blocks_0_attn_q_view_3)
    blocks_0_attn_v_add_1__r19 = lax.psum(blocks_0_attn_v_add_1, 'tp')  # r19: (S(0), P) -> (S(0), R)
    # blocks.0.ln1
    blocks_0_ln1_native_layer_norm_backward = aten_native_layer_norm_backward(blocks_0_attn_v_add_1__r19, add, [2048], blocks_0_ln1_getitem_1, blocks_0_ln1_getitem_2, blocks_0_ln1_weight, blocks_0_ln1_bias, [True, True, True])
    blocks_0_ln1_getitem_3 = blocks_0_ln1_native_layer_norm_backward[0]
    grad_blocks_0_ln1_weight = blocks_0_ln1_native_layer_norm_backward[1]
    grad_blocks_0_ln1_weight__r24_pending = lax.psum(grad_blocks_0_ln1_weight, 'dp')  # r24: (P, R) -> (R, R)
    grad_blocks_0_ln1_bias = blocks_0_ln1_native_layer_norm_backward[2]
    grad_blocks_0_ln1_bias__r25_pending = lax.psum(grad_blocks_0_ln1_bias, 'dp')  # r25: (P, R) -> (R, R)
    # blocks.1.ln2
    blocks_1_ln2_add_3 = aten_add(blocks_1_ln2_add_2, blocks_0_ln1_getitem_3)
    # <model>
    sum_13 = aten_sum(blocks_1_ln2_add_3, [0], True)
    view_82 = aten_view(sum_13, [64, 2048])
    view_82__r20 = lax.psum_scatter(view_82, 'dp', scatter_dimension=0, tiled=True)  # r20: (P, R) -> (S(0), R)
    arange__r21 = block(arange, 'dp', 2, 0)  # r21: (R, R) -> (S(0), R)
    # wpe
    grad_wpe_weight = aten_embedding_dense_backward(view_82__r20, arange__r21, 64, -1, False)
    grad_wpe_weight__r23_pending = lax.psum(grad_wpe_weight, 'dp')  # r23: (P, R) -> (R, R)
    # wte
    grad_wte_weight = aten_embedding_dense_backward(blocks_1_ln2_add_3, idx, 256, -1, False)
    grad_wte_weight__r22_pending = lax.psum(grad_wte_weight, 'dp')  # r22: (P, R) -> (R, R)
    grad_wte_weight__r22 = grad_wte_weight__r22_pending
    grad_wpe_weight__r23 = grad_wpe_weight__r23_pending
    grad_blocks_0_ln1_weight__r24 = grad_blocks_0_ln1_weight__r24_pending
    grad_blocks_0_ln1_bias__r25 = grad_blocks_0_ln1_bias__r25_pending
    grad_blocks_0_attn_q_weight__r55 = grad_blocks_0_attn_q_weight__r55_pending
    grad_blocks_0_attn_q_bias__r26 = grad_blocks_0_attn_q_bias__r26_pending
    grad_blocks_0_attn_k_weight__r54 = grad_blocks_0_attn_k_weight__r54_pending
    grad_blocks_0_attn_k_bias__r27 = grad_blocks_0_attn_k_bias__r27_pending
    grad_blocks_0_attn_v_weight__r53 = grad_blocks_0_attn_v_weight__r53_pending
    grad_blocks_0_attn_v_bias__r28 = grad_blocks_0_attn_v_bias__r28_pending
    grad_blocks_0_attn_proj_weight__r52 = grad_blocks_0_attn_proj_weight__r52_pending
    grad_blocks_0_attn_proj_bias__r29 = grad_blocks_0_attn_proj_bias__r29_pending
    grad_blocks_0_ln2_weight__r30 = grad_blocks_0_ln2_weight__r30_pending
    grad_blocks_0_ln2_bias__r31 = grad_blocks_0_ln2_bias__r31_pending
    grad_blocks_0_fc_weight__r51 = grad_blocks_0_fc_weight__r51_pending
    grad_blocks_0_fc_bias__r32 = grad_blocks_0_fc_bias__r32_pending
    grad_blocks_0_out_bias__r33 = grad_blocks_0_out_bias__r33_pending
    grad_blocks_1_ln1_weight__r34 = grad_blocks_1_ln1_weight__r34_pending
    grad_blocks_1_ln1_bias__r35 = grad_blocks_1_ln1_bias__r35_pending
    grad_blocks_1_attn_q_weight__r50 = grad_blocks_1_attn_q_weight__r50_pending
    grad_blocks_1_attn_q_bias__r36 = grad_blocks_1_attn_q_bias__r36_pending
    grad_blocks_1_attn_k_weight__r49 = grad_blocks_1_attn_k_weight__r49_pending
    grad_blocks_1_attn_k_bias__r37 = grad_blocks_1_attn_k_bias__r37_pending
    grad_blocks_1_attn_v_weight__r48 = grad_blocks_1_attn_v_weight__r48_pending
    grad_blocks_1_attn_v_bias__r38 = grad_blocks_1_attn_v_bias__r38_pending
    grad_blocks_1_attn_proj_weight__r47 = grad_blocks_1_attn_proj_weight__r47_pending
    grad_blocks_1_attn_proj_bias__r39 = grad_blocks_1_attn_proj_bias__r39_pending
    grad_blocks_1_ln2_weight__r40 = grad_blocks_1_ln2_weight__r40_pending
    grad_blocks_1_ln2_bias__r41 = grad_blocks_1_ln2_bias__r41_pending
    grad_blocks_1_fc_bias__r42 = grad_blocks_1_fc_bias__r42_pending
    grad_blocks_1_out_bias__r43 = grad_blocks_1_out_bias__r43_pending
    grad_ln_f_weight__r44 = grad_ln_f_weight__r44_pending
    grad_ln_f_bias__r45 = grad_ln_f_bias__r45_pending
    grad_head_weight__r46 = grad_head_weight__r46_pending
    return (grad_wte_weight__r22, grad_wpe_weight__r23, grad_blocks_0_ln1_weight__r24, grad_blocks_0_ln1_bias__r25, grad_blocks_0_attn_q_weight__r55, grad_blocks_0_attn_q_bias__r26, grad_blocks_0_attn_k_weight__r54, grad_blocks_0_attn_k_bias__r27, grad_blocks_0_attn_v_weight__r53, grad_blocks_0_attn_v_bias__r28, grad_blocks_0_attn_proj_weight__r52, grad_blocks_0_attn_proj_bias__r29, grad_blocks_0_ln2_weight__r30, grad_blocks_0_ln2_bias__r31, grad_blocks_0_fc_weight__r51, grad_blocks_0_fc_bias__r32, grad_blocks_0_out_weight, grad_blocks_0_out_bias__r33, grad_blocks_1_ln1_weight__r34, grad_blocks_1_ln1_bias__r35, grad_blocks_1_attn_q_weight__r50, grad_blocks_1_attn_q_bias__r36, grad_blocks_1_attn_k_weight__r49, grad_blocks_1_attn_k_bias__r37, grad_blocks_1_attn_v_weight__r48, grad_blocks_1_attn_v_bias__r38, grad_blocks_1_attn_proj_weight__r47, grad_blocks_1_attn_proj_bias__r39, grad_blocks_1_ln2_weight__r40, grad_blocks_1_ln2_bias__r41, grad_blocks_1_fc_weight, grad_blocks_1_fc_bias__r42, grad_blocks_1_out_weight, grad_blocks_1_out_bias__r43, grad_ln_f_weight__r44, grad_ln_f_bias__r45, grad_head_weight__r46,)


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
