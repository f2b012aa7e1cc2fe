"""Tensors made from sizes and values in JAX. Uninitialized memory (empty) is zeros: a torch
program never reads it before writing it."""
from __future__ import annotations

import jax.numpy as jnp


def aten_arange(start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.arange(start, end, step, dtype=dtype) if end is not None else jnp.arange(start, dtype=dtype)


def aten_full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(size, fill_value, dtype=dtype)


def aten_full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(x.shape, fill_value, dtype=x.dtype if dtype is None else dtype)


def aten_ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(size, dtype=dtype)


def aten_zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, dtype=dtype)


def aten_empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(size, dtype=dtype)


def aten_empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, dtype=dtype)


def aten_empty_permuted(size, physical_layout, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, dtype=dtype)  # JAX chooses the memory layout


def aten_ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones_like(x, dtype=dtype)


def aten_zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros_like(x, dtype=dtype)


def aten_empty_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros_like(x, dtype=dtype)


def aten_scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, dtype=jnp.float32 if dtype is None else dtype)


def aten_fill(x, value):
    return jnp.full_like(x, value)


def aten_new_empty(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, dtype=x.dtype if dtype is None else dtype)


def aten_new_empty_strided(x, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, dtype=x.dtype if dtype is None else dtype)  # JAX chooses the memory layout


def aten_new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(size, dtype=x.dtype if dtype is None else dtype)


def aten_new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(size, dtype=x.dtype if dtype is None else dtype)


def aten_new_full(x, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(size, fill_value, dtype=x.dtype if dtype is None else dtype)
