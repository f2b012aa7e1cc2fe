"""Elementwise ATen ops in JAX: math, comparisons, logic, activations.

Operands are promoted as torch promotes them (torch.result_type): a tensor with dimensions
decides the dtype unless a 0-dim tensor or a Python number is of a higher category (bool <
integer < floating), where JAX would promote a bfloat16 tensor times a float32 0-dim tensor
to float32. Float functions of integer tensors compute in float32, as torch's default dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


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


def _floating(x):
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)


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


def _is_integral(x) -> bool:
    return not jnp.issubdtype(x.dtype, jnp.inexact)


def aten_add(a, b, alpha=1):
    a, b = _promoted(a, b)
    return a + b if alpha == 1 else a + alpha * b


def aten_sub(a, b, alpha=1):
    a, b = _promoted(a, b)
    return a - b if alpha == 1 else a - alpha * b


def aten_rsub(a, b, alpha=1):
    return aten_sub(b, a, alpha)


def aten_mul(a, b):
    a, b = _promoted(a, b)
    return a * b


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


def aten_floor_divide(a, b):
    return aten_div(a, b, "floor")


def aten_remainder(a, b):
    a, b = _promoted(a, b)
    return jnp.remainder(a, b)


def aten_fmod(a, b):
    a, b = _promoted(a, b)
    return jnp.fmod(a, b)


def aten_pow(x, exponent):
    x, exponent = _promoted(x, exponent)
    return jnp.power(x, exponent)


def aten_atan2(a, b):
    a, b = _promoted(_floating(a), b)
    return jnp.arctan2(a, b)


def aten_maximum(a, b):
    a, b = _promoted(a, b)
    return jnp.maximum(a, b)


def aten_minimum(a, b):
    a, b = _promoted(a, b)
    return jnp.minimum(a, b)


def aten_bitwise_and(a, b):
    a, b = _promoted(a, b)
    return a & b


def aten_bitwise_or(a, b):
    a, b = _promoted(a, b)
    return a | b


def aten_bitwise_xor(a, b):
    a, b = _promoted(a, b)
    return a ^ b


def aten_bitwise_not(x):
    return ~x


def aten_logical_and(a, b):
    return jnp.logical_and(a, b)


def aten_logical_or(a, b):
    return jnp.logical_or(a, b)


def aten_logical_xor(a, b):
    return jnp.logical_xor(a, b)


def aten_logical_not(x):
    return jnp.logical_not(x)


def aten_eq(a, b):
    a, b = _promoted(a, b)
    return a == b


def aten_ne(a, b):
    a, b = _promoted(a, b)
    return a != b


def aten_lt(a, b):
    a, b = _promoted(a, b)
    return a < b


def aten_le(a, b):
    a, b = _promoted(a, b)
    return a <= b


def aten_gt(a, b):
    a, b = _promoted(a, b)
    return a > b


def aten_ge(a, b):
    a, b = _promoted(a, b)
    return a >= b


def aten_where(condition, a, b):
    a, b = _promoted(a, b)
    return jnp.where(condition, a, b)


def aten_masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


def aten_clamp(x, min=None, max=None):
    x, low, high = _promoted(x, min, max)
    x = x if low is None else jnp.maximum(x, low)
    return x if high is None else jnp.minimum(x, high)


def aten_neg(x):
    return -x


def aten_abs(x):
    return jnp.abs(x)


def aten_sign(x):
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


def aten_reciprocal(x):
    return 1 / _floating(x)


def aten_exp(x):
    return jnp.exp(_floating(x))


def aten_expm1(x):
    return jnp.expm1(_floating(x))


def aten_log(x):
    return jnp.log(_floating(x))


def aten_log1p(x):
    return jnp.log1p(_floating(x))


def aten_log2(x):
    return jnp.log2(_floating(x))


def aten_log10(x):
    return jnp.log10(_floating(x))


def aten_sqrt(x):
    return jnp.sqrt(_floating(x))


def aten_rsqrt(x):
    return lax.rsqrt(_floating(x))


def aten_sin(x):
    return jnp.sin(_floating(x))


def aten_cos(x):
    return jnp.cos(_floating(x))


def aten_tan(x):
    return jnp.tan(_floating(x))


def aten_asin(x):
    return jnp.arcsin(_floating(x))


def aten_acos(x):
    return jnp.arccos(_floating(x))


def aten_atan(x):
    return jnp.arctan(_floating(x))


def aten_sinh(x):
    return jnp.sinh(_floating(x))


def aten_cosh(x):
    return jnp.cosh(_floating(x))


def aten_tanh(x):
    return jnp.tanh(_floating(x))


def aten_asinh(x):
    return jnp.arcsinh(_floating(x))


def aten_acosh(x):
    return jnp.arccosh(_floating(x))


def aten_atanh(x):
    return jnp.arctanh(_floating(x))


def aten_erf(x):
    return lax.erf(_floating(x))


def aten_sigmoid(x):
    return jax.nn.sigmoid(_floating(x))


def aten_floor(x):
    return x if _is_integral(x) else jnp.floor(x)


def aten_ceil(x):
    return x if _is_integral(x) else jnp.ceil(x)


def aten_trunc(x):
    return x if _is_integral(x) else jnp.trunc(x)


def aten_round(x):
    return x if _is_integral(x) else jnp.round(x)  # half to even, as torch


def aten_isnan(x):
    return jnp.isnan(x)


def aten_isinf(x):
    return jnp.isinf(x)


def aten_relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


def aten_threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


def aten_leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


def aten_hardtanh(x, min_val=-1, max_val=1):
    return jnp.clip(x, min_val, max_val)


def aten_elu(x, alpha=1, scale=1, input_scale=1):
    negative = alpha * jnp.expm1(jnp.minimum(x, 0) * input_scale)
    return scale * jnp.where(x > 0, x, negative)


def aten_gelu(x, approximate="none"):
    return _in_float32(lambda v: jax.nn.gelu(v, approximate=approximate == "tanh"), x)


def aten_gelu_backward(grad, x, approximate="none"):
    return _in_float32(lambda g, v: jax.vjp(lambda u: jax.nn.gelu(u, approximate=approximate == "tanh"), v)[1](g)[0],
                       grad, x)


def aten_tanh_backward(grad, output):
    return grad * (1 - output * output)


def aten_sigmoid_backward(grad, output):
    return grad * output * (1 - output)


def aten_silu(x):
    return _in_float32(jax.nn.silu, x)


def aten_silu_backward(grad, x):
    return _in_float32(lambda g, v: g * jax.nn.sigmoid(v) * (1 + v * (1 - jax.nn.sigmoid(v))), grad, x)
