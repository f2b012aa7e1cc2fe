# autopar: training step as a sharded JAX program (generated; do not edit)
# plan ec5d9820ef89 | graph dc28b4143eb773f4 | mesh (dp=2, tp=2) | hardware h100-sxm
# predicted step 0.2268 ms = compute 0.1941 ms + communication 0.0326 ms
# parameter layouts (S(d): split along dim d; R: replicated):
#   fc1.weight  [4096, 1024]  R on dp, S(0) on tp
#   fc1.bias    [4096]        R on dp, S(0) on tp
#   fc2.weight  [1024, 4096]  R on dp, S(1) on tp
#   fc2.bias    [1024]        R on dp, R on tp
# passes:
#   shapes: 29 nodes
#   strategies: 29 nodes, 16 free, 168 strategies, 0 fallbacks
#   cluster_layers: no repeated layers
#   solve_sharding: 16 variables groups, 25 edges, 3268 booleans, optimal, objective 0.2391 ms, gap 0.00%
#   collectives: 8 redistributions, 8 collectives
#   recompute: peak 130.1 MB per device at mm_1
#   predict: step 0.2268 ms (compute 0.1941, communication 0.0326 + 0.0399 hidden), 100% of FLOPs sharded
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

PLAN_HASH = 'ec5d9820ef89'
AXES = ('dp', 'tp')
SHAPE = (2, 2)
PLACEHOLDERS = ['fc1_weight', 'fc1_bias', 'fc2_weight', 'fc2_bias', 'x', 'y']
# placeholder -> parameter name
PARAMETERS = {'fc1_weight': 'fc1.weight', 'fc1_bias': 'fc1.bias', 'fc2_weight': 'fc2.weight', 'fc2_bias': 'fc2.bias'}
# placeholder -> buffer name
BUFFERS = {}
# placeholders of the batch, in forward's argument order
INPUTS = ['x', 'y']
SPECS = {
    'fc1_weight': P('tp', None), 'fc1_bias': P('tp'), 'fc2_weight': P(None, 'tp'), 'fc2_bias': P(None),
    'x': P('dp', None), 'y': P('dp', 'tp'),
}
# dropout mask -> (global shape, probability of a zero), in the order forward draws them
MASKS = {}
MASK_SPECS = {}
# (kind, parameter name) of each value local_step returns
OUTPUTS = [('loss', None), ('grad', 'fc1.weight'), ('grad', 'fc1.bias'), ('grad', 'fc2.weight'), ('grad', 'fc2.bias')]
OUTPUT_SPECS = (P(), P('tp', None), P('tp'), P(None, 'tp'), P(None),)


# ---- ATen ops in JAX (autopar.backends.jax.aten) ----
def aten_t(x):
    return x.T if x.ndim == 2 else x

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

def aten_addmm(bias, a, b, beta=1, alpha=1):
    if not jnp.issubdtype(a.dtype, jnp.inexact):  # integer tensors take the integral part of the scalars
        beta, alpha = int(beta), int(alpha)
    # the product, the sum and the bias in float32, rounded once (as aten_mm)
    return _in_float32(lambda x, y, c: beta * c + alpha * jnp.matmul(x, y), a, b, bias)

def aten_gelu(x, approximate="none"):
    return _in_float32(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)

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

def aten_sub(a, b, alpha=1):
    a, b = _promoted(a, b)
    return a - b if alpha == 1 else a - alpha * b

def aten_pow(x, exponent):
    x, exponent = _promoted(x, exponent)
    return jnp.power(x, exponent)

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

def aten_mul(a, b):
    a, b = _promoted(a, b)
    return a * b

def aten_mm(a, b):
    # accumulated in float32 and rounded once, as torch does: the operands are cast first, as XLA's
    # CPU dot does not run a bf16 x bf16 = f32 product for every layout, and a product of two bf16
    # or fp16 numbers is exact in float32, so the sums are the same
    return _in_float32(jnp.matmul, a, b)

def aten_view(x, size):
    return jnp.reshape(x, size)

def aten_gelu_backward(grad, x, approximate="none"):
    return _in_float32(lambda g, v: jax.vjp(lambda u: jax.nn.gelu(u, approximate=approximate == "tanh"), v)[1](g)[0],
                       grad, x)


def forward_local(fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y):
    """One rank's forward program on its local blocks: (loss, the values backward reads)."""

    # ---- forward ----
    # fc1
    fc1_t = aten_t(fc1_weight)
    fc1_addmm = aten_addmm(fc1_bias, x, fc1_t)
    # <model>
    gelu = aten_gelu(fc1_addmm)
    # fc2
    fc2_t = aten_t(fc2_weight)
    fc2_bias__r0 = jnp.where(lax.axis_index('tp') == 0, fc2_bias, jnp.zeros_like(fc2_bias))  # r0: (R, R) -> (R, P)
    fc2_addmm = aten_addmm(fc2_bias__r0, gelu, fc2_t)
    fc2_addmm__r1 = lax.psum_scatter(fc2_addmm, 'tp', scatter_dimension=1, tiled=True)  # r1: (S(0), P) -> (S(0), S(1))
    # <model>
    sub = aten_sub(fc2_addmm__r1, y)
    pow_1 = aten_pow(sub, 2)
    sum_dim_int_list = aten_sum(pow_1, [0, 1], False)
    sum_dim_int_list__r2 = lax.psum(sum_dim_int_list, 'dp')  # r2: (P, P) -> (R, R)
    sum_dim_int_list__r2 = lax.psum(sum_dim_int_list__r2, 'tp')  # r2: (P, P) -> (R, R)
    div_scalar = aten_div(sum_dim_int_list__r2, 4194304)
    return div_scalar, [fc1_addmm, gelu, fc2_addmm__r1, div_scalar]


def backward_local(fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y, saved):
    """One rank's backward program: the gradients, in OUTPUTS' order after the loss."""
    [fc1_addmm, gelu, fc2_addmm__r1, div_scalar] = saved

    # ---- backward ----
    # <model>
    ones_like_default = aten_ones_like(div_scalar, pin_memory=False)
    sub_1 = aten_sub(fc2_addmm__r1, y)
    mul = aten_mul(sub_1, 4.76837158203125e-07)  # 4.76837158203125e-07 = 2/4194304, 4194304 = the elements of [4096, 1024]
    mul__r3 = lax.all_gather(mul, 'tp', axis=1, tiled=True)  # r3: (S(0), S(1)) -> (S(0), R)
    mul_1 = aten_mul(mul__r3, ones_like_default)
    # fc2
    fc2_mm = aten_mm(mul_1, fc2_weight)
    fc2_t_1 = aten_t(mul_1)
    grad_fc2_weight = aten_mm(fc2_t_1, gelu)
    grad_fc2_weight__r6_pending = lax.psum(grad_fc2_weight, 'dp')  # r6: (P, S(1)) -> (R, S(1))
    fc2_sum = aten_sum(mul_1, [0], True)
    grad_fc2_bias = aten_view(fc2_sum, [1024])
    grad_fc2_bias__r5_pending = lax.psum(grad_fc2_bias, 'dp')  # r5: (P, R) -> (R, R)
    # <model>
    gelu_backward = aten_gelu_backward(fc2_mm, fc1_addmm)
    # fc1
    fc1_t_1 = aten_t(gelu_backward)
    grad_fc1_weight = aten_mm(fc1_t_1, x)
    grad_fc1_weight__r7_pending = lax.psum(grad_fc1_weight, 'dp')  # r7: (P, S(0)) -> (R, S(0))
    fc1_sum = aten_sum(gelu_backward, [0], True)
    grad_fc1_bias = aten_view(fc1_sum, [2048])
    grad_fc1_bias__r4_pending = lax.psum(grad_fc1_bias, 'dp')  # r4: (P, S(0)) -> (R, S(0))
    grad_fc1_weight__r7 = grad_fc1_weight__r7_pending
    grad_fc1_bias__r4 = grad_fc1_bias__r4_pending
    grad_fc2_weight__r6 = grad_fc2_weight__r6_pending
    grad_fc2_bias__r5 = grad_fc2_bias__r5_pending
    return (grad_fc1_weight__r7, grad_fc1_bias__r4, grad_fc2_weight__r6, grad_fc2_bias__r5,)


def local_step(fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y):
    """One rank's training step (run under shard_map): (loss, *gradients)."""
    loss, saved = forward_local(fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y)
    return (loss,) + backward_local(fc1_weight, fc1_bias, fc2_weight, fc2_bias, x, y, saved)


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
