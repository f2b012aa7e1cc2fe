"""Gathers, scatters, advanced indexing, sorting and selection in JAX (the ops of embedding
lookups and of mixture-of-experts routing)."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def _positions(index, dim):
    """Index arrays addressing ``x`` at every element of ``index``, with ``index``'s values along ``dim``."""
    grids = list(jnp.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


def aten_gather(x, dim, index, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return x.reshape(index.shape)
    return x[_positions(index, dim)]


def aten_scatter(x, dim, index, src=None, value=None, reduce=None):
    """scatter.src and scatter.value: positions of ``index`` along ``dim`` take src's (or value)."""
    if x.ndim == 0:
        return jnp.asarray(src if value is None else value, x.dtype).reshape(())
    update = jnp.asarray(value, x.dtype) if value is not None else src[tuple(slice(0, n) for n in index.shape)]
    return x.at[_positions(index, dim)].set(update.astype(x.dtype) if hasattr(update, "astype") else update)


def aten_scatter_value(x, dim, index, value):
    return aten_scatter(x, dim, index, value=value)


def aten_scatter_add(x, dim, index, src):
    if x.dtype == jnp.bool_:  # adding booleans is or-ing them
        return aten_scatter_add(x.astype(jnp.int32), dim, index, src.astype(jnp.int32)) != 0
    if x.ndim == 0:
        return x + src.reshape(()).astype(x.dtype)
    return x.at[_positions(index, dim)].add(src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype))


def aten_scatter_reduce(x, dim, index, src, reduce, include_self=True):
    """scatter_reduce.two: sum, prod, mean, amax or amin of src at index, with x's own value or without."""
    if x.dtype == jnp.bool_:
        return aten_scatter_reduce(x.astype(jnp.int32), dim, index, src.astype(jnp.int32), reduce, include_self) != 0
    if x.ndim == 0:
        x, index, src = x.reshape(1), index.reshape(-1), src.reshape(-1)
        return aten_scatter_reduce(x, 0, index, src, reduce, include_self).reshape(())
    where = _positions(index, dim)
    src = src[tuple(slice(0, n) for n in index.shape)].astype(x.dtype)
    neutral = {"sum": 0, "mean": 0, "prod": 1, "amax": _lowest(x.dtype), "amin": _highest(x.dtype)}[reduce]
    base = x if include_self else x.at[where].set(neutral)
    if reduce in ("sum", "mean"):
        out = base.at[where].add(src)
    elif reduce == "prod":
        out = base.at[where].multiply(src)
    else:
        out = base.at[where].max(src) if reduce == "amax" else base.at[where].min(src)
    if reduce != "mean":
        return out
    counts = jnp.full(x.shape, 1 if include_self else 0, jnp.int32).at[where].add(1)
    counts = jnp.maximum(counts, 1).astype(x.dtype)
    return jnp.floor_divide(out, counts) if not jnp.issubdtype(x.dtype, jnp.inexact) else out / counts


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min


def _highest(dtype):
    return jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).max


def _advanced(indices):
    return tuple(slice(None) if i is None else i for i in indices)


def aten_index(x, indices):
    return x[_advanced(indices)]


def aten_index_put(x, indices, values, accumulate=False):
    if accumulate and x.dtype == jnp.bool_:
        return aten_index_put(x.astype(jnp.int32), indices, values.astype(jnp.int32), True) != 0
    if len(indices) == 1 and indices[0] is not None and indices[0].dtype == jnp.bool_:
        return _put_where(x, indices[0], values, accumulate)
    where = x.at[_advanced(indices)]
    return where.add(values.astype(x.dtype)) if accumulate else where.set(values.astype(x.dtype))


def _put_where(x, mask, values, accumulate):
    """x[mask] = values (or +=) for a boolean mask over x's leading dims, in static shapes: one
    row of values per True element in row-major order, or one row broadcast to them all."""
    rest = x.shape[mask.ndim:]
    full = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * len(rest)), x.shape)
    if values.ndim == len(rest) + 1 and values.shape[0] != 1:
        taken = jnp.cumsum(full.reshape(-1)) - 1  # the element of values each True position takes
        spread = values.reshape(-1)[jnp.clip(taken, 0, max(values.size - 1, 0))].reshape(x.shape)
    else:
        spread = jnp.broadcast_to(values.reshape(values.shape[-len(rest):] if rest else ()), rest)
        spread = jnp.broadcast_to(spread, x.shape)
    spread = spread.astype(x.dtype)
    return x + jnp.where(full, spread, jnp.zeros((), x.dtype)) if accumulate else jnp.where(full, spread, x)


def aten_index_select(x, dim, index):
    return jnp.take(x, index.reshape(-1), axis=dim) if x.ndim else x.reshape(1)[index.reshape(-1)].reshape(())


def aten_masked_scatter(x, mask, source):
    """x where mask is False; where True, source's elements taken in order (row-major)."""
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    taken = jnp.cumsum(mask.reshape(-1)) - 1
    values = source.reshape(-1)[jnp.clip(taken, 0, max(source.size - 1, 0))].reshape(x.shape)
    return jnp.where(mask, values.astype(x.dtype), x)


def aten_sort(x, dim=-1, descending=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    order = jnp.argsort(x, axis=dim, stable=True, descending=descending)
    return jnp.take_along_axis(x, order, axis=dim), order


def aten_topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    moved = jnp.moveaxis(x, dim, -1)
    values, order = lax.top_k(moved if largest else -moved, k)
    values = values if largest else -values
    return jnp.moveaxis(values, -1, dim), jnp.moveaxis(order, -1, dim)


def aten_embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return weight[indices]


def aten_embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    width = grad.shape[-1]
    out = jnp.zeros((num_weights, width), grad.dtype).at[indices.reshape(-1)].add(grad.reshape(-1, width))
    return out.at[padding_idx].set(0) if padding_idx >= 0 else out
