"""Views, layout changes, concatenation, padding and slicing in JAX. A view is a copy in JAX's
value semantics; the torch program's statements never write through a view."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def aten_view(x, size):
    return jnp.reshape(x, size)


def aten_t(x):
    return x.T if x.ndim == 2 else x


def aten_transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1) if x.ndim else x


def aten_permute(x, dims):
    return jnp.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


def aten_expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    return jnp.broadcast_to(x, [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)])


def aten_unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


def aten_squeeze(x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    return jnp.squeeze(x, tuple(d % x.ndim for d in dims if x.shape[d] == 1))


def aten_identity(x, memory_format=None):
    return x


def aten_to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else x.astype(dtype)


def aten_copy(x, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(x.dtype), x.shape)


def aten_cat(tensors, dim=0):
    kept = [x for x in tensors if not (x.ndim == 1 and x.shape[0] == 0)]  # ATen skips empty 1-D tensors
    if not kept:
        return tensors[0]
    dtype = jnp.result_type(*kept)
    return jnp.concatenate([x.astype(dtype) for x in kept], axis=dim)


def aten_constant_pad_nd(x, pad, value=0):
    """ATen pads the last dim first; a negative width crops."""
    widths = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), widths)


def _index_along(ndim, dim, index):
    where = [slice(None)] * ndim
    where[dim] = index
    return tuple(where)


def aten_slice(x, dim=0, start=None, end=None, step=1):
    return x[_index_along(x.ndim, dim, slice(start, end, step))]


def aten_slice_backward(grad, input_sizes, dim, start, end, step):
    return jnp.zeros(input_sizes, grad.dtype).at[_index_along(len(input_sizes), dim, slice(start, end, step))].set(grad)


def aten_slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    return x.at[_index_along(x.ndim, dim, slice(start, end, step))].set(src.astype(x.dtype))


def aten_select(x, dim, index):
    return x[_index_along(x.ndim, dim, index)]


def aten_select_backward(grad, input_sizes, dim, index):
    return jnp.zeros(input_sizes, grad.dtype).at[_index_along(len(input_sizes), dim, index)].set(grad)


def aten_select_scatter(x, src, dim, index):
    return x.at[_index_along(x.ndim, dim, index)].set(src.astype(x.dtype))


def aten_split(x, split_size, dim=0):
    if x.shape[dim] == 0:
        return [x]
    return [lax.slice_in_dim(x, i, min(i + split_size, x.shape[dim]), axis=dim)
            for i in range(0, x.shape[dim], split_size)]


def aten_split_with_sizes(x, split_sizes, dim=0):
    starts = [sum(split_sizes[:i]) for i in range(len(split_sizes))]
    return [lax.slice_in_dim(x, s, s + n, axis=dim) for s, n in zip(starts, split_sizes)]


def aten_diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1, dim2)


def aten_flip(x, dims):
    return jnp.flip(x, tuple(dims)) if x.ndim else x


def aten_repeat(x, repeats):
    return jnp.tile(x, repeats)


def aten_tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


def aten_triu(x, diagonal=0):
    return jnp.triu(x, diagonal)
