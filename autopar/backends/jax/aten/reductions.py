"""Reductions and scans in JAX. Sums of low-precision floats accumulate in float32, as torch's do;
sums of booleans and integers count in JAX's integers (int32: the program's int64)."""
from __future__ import annotations

import jax.numpy as jnp


def _axes(x, dim):
    """``dim`` as JAX axes: None (or []) is every axis; a 0-dim tensor has none to name."""
    if x.ndim == 0 or dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


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


def aten_sum(x, dim=None, keepdim=False, dtype=None):
    x, out = _accumulating(x, dtype)
    return jnp.sum(x, axis=_axes(x, dim), keepdims=keepdim).astype(out)


def aten_mean(x, dim=None, keepdim=False, dtype=None):
    x, out = _accumulating(x, dtype)
    return jnp.mean(x, axis=_axes(x, dim), keepdims=keepdim).astype(out)


def aten_prod(x, dim=None, keepdim=False, dtype=None):
    x, out = _accumulating(x, dtype)
    return jnp.prod(x, axis=_axes(x, dim), keepdims=keepdim).astype(out)


def aten_amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


def aten_amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


def aten_any(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(x, dim), keepdims=keepdim)


def aten_argmax(x, dim=None, keepdim=False):
    if dim is None and keepdim:
        return jnp.argmax(x).reshape((1,) * x.ndim)
    return jnp.argmax(x, axis=_axes(x, dim), keepdims=keepdim)


def aten_argmin(x, dim=None, keepdim=False):
    if dim is None and keepdim:
        return jnp.argmin(x).reshape((1,) * x.ndim)
    return jnp.argmin(x, axis=_axes(x, dim), keepdims=keepdim)


def aten_max_dim(x, dim, keepdim=False):
    return aten_amax(x, [dim], keepdim), aten_argmax(x, dim, keepdim)


def aten_min_dim(x, dim, keepdim=False):
    return aten_amin(x, [dim], keepdim), aten_argmin(x, dim, keepdim)


def aten_var(x, dim=None, correction=None, keepdim=False):
    x32, out = _accumulating(x, None)
    ddof = 1 if correction is None else correction
    return jnp.var(x32, axis=_axes(x, dim), ddof=ddof, keepdims=keepdim).astype(out)


def aten_var_dim(x, dim=None, unbiased=True, keepdim=False):
    return aten_var(x, dim, 1 if unbiased else 0, keepdim)


def aten_cumsum(x, dim, dtype=None):
    x, out = _accumulating(x, dtype)
    return (x if x.ndim == 0 else jnp.cumsum(x, axis=dim)).astype(out)


def aten_histc(x, bins=100, min=0, max=0):
    """Counts of x in ``bins`` equal bins over [min, max] (the data's range where min == max);
    a value equal to max falls in the last bin, values outside are not counted."""
    if min == max:
        low, high = jnp.min(x), jnp.max(x)
        low, high = jnp.where(low == high, low - 1, low), jnp.where(low == high, high + 1, high)
    else:
        low, high = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    which = jnp.floor((x - low) * bins / (high - low)).astype(jnp.int32)
    which = jnp.clip(jnp.where(x == high, bins - 1, which), 0, bins - 1)
    inside = ((x >= low) & (x <= high)).astype(x.dtype)
    return jnp.zeros((bins,), x.dtype).at[which.reshape(-1)].add(inside.reshape(-1))
