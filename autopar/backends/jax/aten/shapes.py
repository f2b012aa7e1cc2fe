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


def aten_as_strided(x, size, stride, storage_offset=None):
    """torch's view of ``x``'s elements at ``storage_offset + sum(i_k * stride[k])``, for ``x``
    laid out row-major (as capture's graphs hand it a base tensor), where that view is a strided
    slice of x's dims, transposed, with broadcast dims: what views of transposed, sliced and
    expanded tensors give. Other strides (overlapping windows) are refused by name."""
    picks = _strided_view(tuple(x.shape), tuple(size), tuple(stride), storage_offset or 0)
    if picks is None:
        raise ValueError(f"as_strided with sizes {list(size)}, strides {list(stride)} and offset "
                         f"{storage_offset or 0} of a {list(x.shape)} tensor is not a slice, transpose or "
                         f"expand of it, which is all the JAX program expresses")
    starts, order = picks
    index = tuple(slice(starts[d], starts[d] + (size[j] - 1) * step + 1, step) if j is not None else starts[d]
                  for d, (j, step) in enumerate(order))
    kept = [j for j, _ in order if j is not None]  # the target dim of each dim left after indexing
    y = jnp.transpose(x[index], sorted(range(len(kept)), key=lambda k: kept[k]))
    shape = [size[j] if j in kept else 1 for j in range(len(size))]
    return jnp.broadcast_to(jnp.reshape(y, shape), tuple(size))


def _strided_view(shape: tuple, size: tuple, stride: tuple, offset: int):
    """(start of each dim of ``shape``, (target dim or None, step) of each) where the strided
    view is one, else None. A target dim of size 1, or of stride 0 (broadcast), takes no dim."""
    contiguous = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        contiguous[d] = contiguous[d + 1] * shape[d + 1]
    walked = sorted((j for j in range(len(size)) if size[j] > 1 and stride[j] != 0), key=lambda j: -stride[j])
    order: list = [(None, 1)] * len(shape)
    for j in walked:  # each walked target dim steps along the outermost free dim whose stride divides its own
        d = next((d for d in range(len(shape)) if order[d][0] is None and shape[d] > 1
                  and stride[j] % contiguous[d] == 0 and stride[j] >= contiguous[d]), None)
        if d is None:
            return None
        order[d] = (j, stride[j] // contiguous[d])
    starts, rest = [0] * len(shape), offset
    for d in range(len(shape)):
        starts[d], rest = divmod(rest, contiguous[d]) if shape[d] > 1 else (0, rest)
        j, step = order[d]
        last = starts[d] + ((size[j] - 1) * step if j is not None else 0)
        if last >= shape[d] and shape[d] > 0:
            return None
    return (starts, order) if rest == 0 else None
