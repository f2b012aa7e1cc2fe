"""Spatial ATen ops in JAX: pooling, padding, resampling, batch and group normalization,
pairwise distances, col2im, grid sampling and embedding bags. Tensors may come with or without
their batch dimension: the spatial dimensions are always the last ones. Low-precision inputs
are computed in float32 and rounded once, as torch's CPU kernels accumulate."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from autopar.backends.jax.aten.pointwise import _wide


def _bottom(dtype):
    """The padding of a max pool: below every value of dtype."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.array(-jnp.inf, dtype)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _per_dim(value, nd):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * nd if len(value) == 1 else value


def _pool_size(n, k, s, p, d, ceil_mode):
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:  # the last window must start inside the input or its left padding
        out -= 1
    return out


def _pool_geometry(x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    kernel = _per_dim(kernel_size, nd)
    stride = _per_dim(stride, nd) if stride else kernel
    padding, dilation = _per_dim(padding, nd), _per_dim(dilation, nd)
    sizes = x.shape[x.ndim - nd:]
    outs = [_pool_size(*args, ceil_mode) for args in zip(sizes, kernel, stride, padding, dilation)]
    # padding on the right that makes exactly `out` windows (negative where the last ones leave input out)
    pads = [(p, (o - 1) * s + d * (k - 1) + 1 - n - p) for n, k, s, p, d, o in zip(sizes, kernel, stride, padding,
                                                                                     dilation, outs)]
    return kernel, stride, dilation, sizes, outs, pads


def _avg_pool(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, _, sizes, outs, pads = _pool_geometry(x, nd, kernel_size, stride, padding, 1, ceil_mode)
    wide = _wide(x)
    lead = x.ndim - nd
    padded = lax.pad(wide, jnp.zeros((), wide.dtype), [(0, 0, 0)] * lead + [(lo, hi, 0) for lo, hi in pads])
    # a concrete zero makes it JAX's differentiable window sum (an array zero is a generic reduction under jit)
    sums = lax.reduce_window(padded, wide.dtype.type(0), lax.add, (1,) * lead + tuple(kernel),
                             (1,) * lead + tuple(stride), "VALID")
    if divisor_override:
        divisor = jnp.full(outs, divisor_override)
    else:
        divisor = jnp.ones((), jnp.int32)
        for axis, (n, k, s, (p, _), o) in enumerate(zip(sizes, kernel, stride, pads, outs)):
            start = jnp.arange(o) * s - p
            if count_include_pad:  # the window clipped to the padded input
                count = jnp.minimum(start + k, n + p) - start
            else:
                count = jnp.minimum(start + k, n) - jnp.maximum(start, 0)
            divisor = divisor * count.reshape((o,) + (1,) * (nd - axis - 1))
    if jnp.issubdtype(x.dtype, jnp.integer):  # integer pooling truncates, as C division
        return lax.div(sums, jnp.broadcast_to(divisor, sums.shape).astype(sums.dtype))
    return (sums / divisor.astype(sums.dtype)).astype(x.dtype)


def aten_avg_pool1d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True):
    return _avg_pool(x, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def aten_avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                    divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def aten_avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                    divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def aten_avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    pool = lambda a: _avg_pool(a, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return jax.vjp(pool, _wide(x))[1](_wide(grad))[0].astype(x.dtype)


def _max_pool(x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    """Each window's maximum and the flat index of its first occurrence in the input plane (of its
    last NaN, where it has one), as torch's kernels scan windows in row-major order."""
    kernel, stride, dilation, sizes, outs, pads = _pool_geometry(x, nd, kernel_size, stride, padding, dilation,
                                                                 ceil_mode)
    lead = x.ndim - nd
    padded = lax.pad(x, _bottom(x.dtype), [(0, 0, 0)] * lead + [(lo, hi, 0) for lo, hi in pads])
    where = lax.pad(jnp.arange(math.prod(sizes), dtype=jnp.int32).reshape(sizes), jnp.array(-1, jnp.int32),
                    [(lo, hi, 0) for lo, hi in pads])
    values, indices = [], []
    for tap in range(math.prod(kernel)):
        offsets = []
        for k in reversed(kernel):
            offsets.insert(0, tap % k)
            tap //= k
        starts = [o * d for o, d in zip(offsets, dilation)]
        limits = [st + (o - 1) * s + 1 for st, o, s in zip(starts, outs, stride)]
        values.append(lax.slice(padded, [0] * lead + starts, list(x.shape[:lead]) + limits, [1] * lead + stride))
        indices.append(lax.slice(where, starts, limits, stride))
    values, indices = jnp.stack(values, axis=lead), jnp.stack(indices)
    best = jnp.max(values, axis=lead, keepdims=True)
    valid = jnp.broadcast_to(indices >= 0, values.shape)
    first = jnp.argmax(valid & (values == best), axis=lead)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        nan = valid & jnp.isnan(values)
        last_nan = values.shape[lead] - 1 - jnp.argmax(jnp.flip(nan, axis=lead), axis=lead)
        first = jnp.where(jnp.any(nan, axis=lead), last_nan, first)
    picked = jnp.take_along_axis(jnp.broadcast_to(indices, values.shape), jnp.expand_dims(first, lead), axis=lead)
    return jnp.squeeze(best, lead), jnp.squeeze(picked, lead)


def aten_max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


def aten_max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


def aten_max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    plane = math.prod(x.shape[-2:])
    planes = math.prod(x.shape[:-2])
    g = _wide(grad).reshape(planes, -1)
    rows = jnp.arange(planes)[:, None]
    out = jnp.zeros((planes, plane), g.dtype).at[rows, indices.reshape(planes, -1)].add(g)
    return out.reshape(x.shape).astype(x.dtype)


def _adaptive_weights(n, out):
    """(out, n): row i averages input positions floor(i*n/out) to ceil((i+1)*n/out)."""
    rows = jnp.arange(out)
    start = rows * n // out
    end = -(-(rows + 1) * n // out)
    at = jnp.arange(n)
    inside = (at >= start[:, None]) & (at < end[:, None])
    return inside.astype(jnp.float32) / (end - start)[:, None].astype(jnp.float32)


def _along(x, axis, matrix):
    """x with its axis `axis` mapped through matrix (new, old)."""
    out = jnp.tensordot(x, matrix, axes=[[axis], [1]], precision=lax.Precision.HIGHEST)
    return jnp.moveaxis(out, -1, axis)


def _adaptive_avg_pool(x, output_size):
    out = _wide(x)
    nd = len(output_size)
    for axis, size in zip(range(x.ndim - nd, x.ndim), output_size):
        out = _along(out, axis, _adaptive_weights(x.shape[axis], size).astype(out.dtype))
    return out.astype(x.dtype)


def aten_adaptive_avg_pool1d(x, output_size):
    return _adaptive_avg_pool(x, _per_dim(output_size, 1))


def aten_adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg_pool(x, _per_dim(output_size, 2))


def aten_adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg_pool(x, _per_dim(output_size, 3))


def aten_adaptive_avg_pool2d_backward(grad, x):
    out = _wide(grad)
    for axis in range(x.ndim - 2, x.ndim):
        out = _along(out, axis, _adaptive_weights(x.shape[axis], grad.shape[axis]).T.astype(out.dtype))
    return out.astype(x.dtype)


def _pad(x, padding, mode):
    """torch's padding list names the last dimension first; a negative width crops."""
    nd = len(padding) // 2
    pairs = [(padding[2 * i], padding[2 * i + 1]) for i in reversed(range(nd))]
    out = jnp.pad(x, [(0, 0)] * (x.ndim - nd) + [(max(lo, 0), max(hi, 0)) for lo, hi in pairs], mode=mode)
    crop = [slice(None)] * (x.ndim - nd) + [slice(max(-lo, 0), n - max(-hi, 0))
                                            for (lo, hi), n in zip(pairs, out.shape[x.ndim - nd:])]
    return out[tuple(crop)]


def aten_reflection_pad(x, padding):
    return _pad(x, padding, "reflect")


def aten_replication_pad(x, padding):
    return _pad(x, padding, "edge")


def _nearest_source(n, out, scale):
    """torch's nearest source index, in float32 as its kernel computes it."""
    if out == n:
        return jnp.arange(out)
    if out == 2 * n:
        return jnp.arange(out) // 2
    ratio = jnp.float32(1.0 / scale) if scale else jnp.float32(n) / jnp.float32(out)
    return jnp.minimum(jnp.floor(jnp.arange(out, dtype=jnp.float32) * ratio).astype(jnp.int32), n - 1)


def _output_sizes(x, output_size, scale_factors):
    if output_size is not None:
        return list(output_size), [None] * len(output_size)
    nd = len(scale_factors)
    return [int(n * s) for n, s in zip(x.shape[x.ndim - nd:], scale_factors)], list(scale_factors)


def aten_upsample_nearest2d(x, output_size, scale_factors=None):
    sizes, scales = _output_sizes(x, output_size, scale_factors)
    for axis, out, scale in zip(range(x.ndim - 2, x.ndim), sizes, scales):
        x = jnp.take(x, _nearest_source(x.shape[axis], out, scale), axis=axis)
    return x


def _linear_taps(n, out, align_corners, scale):
    """Each output position's two source positions and their weights (torch's, in float32)."""
    at = jnp.arange(out, dtype=jnp.float32)
    if align_corners:
        ratio = jnp.float32(n - 1) / jnp.float32(out - 1) if out > 1 else jnp.float32(0)
        source = at * ratio
    else:
        ratio = jnp.float32(1.0 / scale) if scale else jnp.float32(n) / jnp.float32(out)
        source = jnp.maximum((at + 0.5) * ratio - 0.5, 0)
    low = jnp.minimum(jnp.floor(source).astype(jnp.int32), n - 1)
    high = low + (low < n - 1)
    weight = jnp.clip(source - low, 0, 1)
    return low, high, 1 - weight, weight


def aten_upsample_bilinear2d(x, output_size, align_corners, scale_factors=None):
    sizes, scales = _output_sizes(x, output_size, scale_factors)
    out = _wide(x)
    for axis, size, scale in zip(range(x.ndim - 2, x.ndim), sizes, scales):
        low, high, w_low, w_high = _linear_taps(x.shape[axis], size, align_corners, scale)
        shape = (size,) + (1,) * (x.ndim - axis - 1)
        out = (jnp.take(out, low, axis=axis) * w_low.reshape(shape).astype(out.dtype)
               + jnp.take(out, high, axis=axis) * w_high.reshape(shape).astype(out.dtype))
    return out.astype(x.dtype)


def _affine(out, weight, bias, shape):
    out = out * weight.reshape(shape) if weight is not None else out
    return out + bias.reshape(shape) if bias is not None else out


def aten_native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    groups = _wide(x).reshape(N, group, C // group * HxW)
    mean = jnp.mean(groups, axis=-1)
    rstd = lax.rsqrt(jnp.mean(jnp.square(groups - mean[..., None]), axis=-1) + eps)
    out = ((groups - mean[..., None]) * rstd[..., None]).reshape(N, C, HxW)
    out = _affine(out, weight, bias, (1, C, 1))
    return out.reshape(x.shape).astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


def aten_native_group_norm_backward(grad_out, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    shape = (N, group, C // group, HxW)
    xs, gs = _wide(x).reshape(shape), _wide(grad_out).reshape(shape)
    m, r = _wide(mean).reshape(N, group, 1, 1), _wide(rstd).reshape(N, group, 1, 1)
    xhat = (xs - m) * r
    g = gs * _wide(weight).reshape(1, group, C // group, 1) if weight is not None else gs
    n = C // group * HxW
    dx = r * (g - jnp.sum(g, axis=(2, 3), keepdims=True) / n
              - xhat * jnp.sum(g * xhat, axis=(2, 3), keepdims=True) / n)
    dx = dx.reshape(x.shape).astype(x.dtype) if output_mask[0] else None
    dw = jnp.sum(gs * xhat, axis=(0, 3)).reshape(C).astype(x.dtype) if output_mask[1] else None
    db = jnp.sum(gs, axis=(0, 3)).reshape(C).astype(x.dtype) if output_mask[2] else None
    return dx, dw, db


def _batch_norm(x, weight, bias, mean, var, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    out = (_wide(x) - mean.reshape(shape)) * lax.rsqrt(var.reshape(shape) + eps)
    return _affine(out, weight, bias, shape).astype(x.dtype)


def aten_native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    mean = jnp.mean(_wide(x), axis=axes)
    var = jnp.var(_wide(x), axis=axes)
    return _batch_norm(x, weight, bias, mean, var, eps), mean.astype(x.dtype), lax.rsqrt(var + eps).astype(x.dtype)


def aten_native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    out = _batch_norm(x, weight, bias, _wide(running_mean), _wide(running_var), eps)
    return out, jnp.zeros((0,), x.dtype), jnp.zeros((0,), x.dtype)


def aten_native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The statistics it saves, not the running ones torch updates in place (the program cannot write them)."""
    if training:
        return aten_native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps)
    return aten_native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps)


def aten_native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """As _native_batch_norm_legit, and the running statistics' new values (the unbiased
    variance, as torch keeps it), which the functional graph returns."""
    if not training:
        out, saved_mean, saved_rstd = aten_native_batch_norm_legit_no_training(
            x, weight, bias, running_mean, running_var, momentum, eps)
        return out, saved_mean, saved_rstd, running_mean, running_var
    out, mean, rstd = aten_native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps)
    n = x.size // x.shape[1]
    variance = jnp.var(_wide(x), axis=(0,) + tuple(range(2, x.ndim))) * (n / max(n - 1, 1))
    new_mean = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
    new_var = (1 - momentum) * running_var + momentum * variance.astype(running_var.dtype)
    return out, mean, rstd, new_mean, new_var


def aten_native_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train,
                                    eps, output_mask):
    """(grad input, grad weight, grad bias): in training through the batch statistics forward
    saved, in evaluation through the running ones."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    axes = (0,) + tuple(range(2, x.ndim))
    g, a = _wide(grad_out), _wide(x)
    if train:
        mean, invstd = _wide(save_mean).reshape(shape), _wide(save_invstd).reshape(shape)
    else:
        mean, invstd = _wide(running_mean).reshape(shape), lax.rsqrt(_wide(running_var).reshape(shape) + eps)
    xhat = (a - mean) * invstd
    grad_bias, grad_weight = jnp.sum(g, axis=axes), jnp.sum(g * xhat, axis=axes)
    scale = invstd * (weight.reshape(shape) if weight is not None else 1)
    if train:
        n = x.size // x.shape[1]
        grad_in = scale * (g - grad_bias.reshape(shape) / n - xhat * grad_weight.reshape(shape) / n)
    else:
        grad_in = g * scale
    return (grad_in.astype(x.dtype) if output_mask[0] else None,
            grad_weight.astype(x.dtype) if output_mask[1] else None,
            grad_bias.astype(x.dtype) if output_mask[2] else None)


def aten_fft_r2c(x, dim, normalization, onesided):
    """torch's real-to-complex FFT over ``dim`` (normalization 0: none, 1: 1/sqrt(n), 2: 1/n)."""
    norm = ("backward", "ortho", "forward")[normalization]
    full = jnp.fft.fftn(x, axes=dim, norm=norm)
    if not onesided:
        return full
    last = dim[-1] % x.ndim
    return lax.slice_in_dim(full, 0, x.shape[last] // 2 + 1, axis=last)


def aten_fft_c2r(x, dim, normalization, last_dim_size):
    """The inverse of a one-sided transform, to ``last_dim_size`` real values (normalization as
    for the forward, applied on this inverse)."""
    norm = ("forward", "ortho", "backward")[normalization]
    sizes = [x.shape[d % x.ndim] for d in dim[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(x, s=sizes, axes=dim, norm=norm)


def aten_fft_c2c(x, dim, normalization, forward):
    if forward:
        return jnp.fft.fftn(x, axes=dim, norm=("backward", "ortho", "forward")[normalization])
    return jnp.fft.ifftn(x, axes=dim, norm=("forward", "ortho", "backward")[normalization])


def _p_norm(diff, p):
    """The p-norm of the last axis of |differences| (p=0 counts the nonzero ones)."""
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(diff.dtype)
    if p == math.inf:
        return jnp.max(diff, axis=-1, initial=0)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(jnp.square(diff), axis=-1))
    return jnp.sum(diff ** p, axis=-1) ** (1 / p)


def aten_cdist_forward(x1, x2, p, compute_mode):
    a, b = _wide(x1), _wide(x2)
    rows, cols = x1.shape[-2], x2.shape[-2]
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (rows > 25 or cols > 25))):
        # torch's Euclidean shortcut |a|^2 + |b|^2 - 2ab, whose cancellation the results keep
        cross = jnp.einsum("...pm,...rm->...pr", a, b, precision=lax.Precision.HIGHEST)
        squares = (jnp.sum(a * a, axis=-1)[..., :, None] + jnp.sum(b * b, axis=-1)[..., None, :] - 2 * cross)
        return jnp.sqrt(jnp.maximum(squares, 0)).astype(x1.dtype)
    return _p_norm(jnp.abs(a[..., :, None, :] - b[..., None, :, :]), p).astype(x1.dtype)


def aten_pdist_forward(x, p=2.0):
    first, second = jnp.triu_indices(x.shape[0], 1)
    wide = _wide(x)
    return _p_norm(jnp.abs(wide[first] - wide[second]), p).astype(x.dtype)


def aten_col2im(x, output_size, kernel_size, dilation, padding, stride):
    cols = _wide(x if x.ndim == 3 else x[None])
    (height, width), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = output_size, kernel_size, dilation, padding, stride
    bh = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    bw = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    channels = cols.shape[1] // (kh * kw)
    blocks = cols.reshape(cols.shape[0], channels, kh, kw, bh, bw)
    out = jnp.zeros((cols.shape[0], channels, height + 2 * ph, width + 2 * pw), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            out = out.at[:, :, i * dh:i * dh + (bh - 1) * sh + 1:sh, j * dw:j * dw + (bw - 1) * sw + 1:sw].add(
                blocks[:, :, i, j])
    out = out[:, :, ph:ph + height, pw:pw + width].astype(x.dtype)
    return out if x.ndim == 3 else out[0]


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(flips % 2 == 0, extra + low, span - extra + low)


def _grid_bounded(coord, size, padding_mode, align_corners):
    """A source coordinate moved inside the input by the padding mode (zeros: left as is)."""
    if padding_mode == 2:
        coord = (_reflect(coord, 0, 2 * (size - 1)) if align_corners
                 else _reflect(coord, -1, 2 * size - 1))
    return jnp.clip(coord, 0, size - 1) if padding_mode in (1, 2) else coord


def _grid_gather(x, rows, cols):
    """x (N, C, H, W) at integral float positions rows, cols (N, Ho, Wo); zero outside."""
    n, c, h, w = x.shape
    inside = (rows >= 0) & (rows <= h - 1) & (cols >= 0) & (cols <= w - 1)
    flat = (jnp.clip(rows, 0, h - 1).astype(jnp.int32) * w + jnp.clip(cols, 0, w - 1).astype(jnp.int32))
    picked = jnp.take_along_axis(x.reshape(n, c, h * w), jnp.broadcast_to(flat.reshape(n, 1, -1), (n, c, flat[0].size)),
                                 axis=2)
    return jnp.where(inside[:, None], picked.reshape((n, c) + rows.shape[1:]), 0)


def _cubic_weights(t):
    a = -0.75
    near = lambda s: ((a + 2) * s - (a + 3)) * s * s + 1
    far = lambda s: ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return far(t + 1), near(t), near(1 - t), far(2 - t)


def aten_grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    """Source coordinates in the grid's dtype, as torch's kernel rounds them; the sums in float32."""
    inp = _wide(x)
    h, w = x.shape[2:]
    if align_corners:
        cols, rows = (grid[..., 0] + 1) * ((w - 1) / 2), (grid[..., 1] + 1) * ((h - 1) / 2)
    else:
        cols, rows = (grid[..., 0] + 1) * (w / 2) - 0.5, (grid[..., 1] + 1) * (h / 2) - 0.5
    if interpolation_mode == 2:  # bicubic: the padding mode applies to each of the 4x4 taps
        c0, r0 = jnp.floor(cols), jnp.floor(rows)
        wc, wr = _cubic_weights(cols - c0), _cubic_weights(rows - r0)
        out = 0
        for i in range(4):
            r = jnp.trunc(_grid_bounded(r0 - 1 + i, h, padding_mode, align_corners))
            line = 0
            for j in range(4):
                c = jnp.trunc(_grid_bounded(c0 - 1 + j, w, padding_mode, align_corners))
                line = line + _grid_gather(inp, r, c) * wc[j][:, None]
            out = out + line * wr[i][:, None]
        return out.astype(x.dtype)
    cols = _grid_bounded(cols, w, padding_mode, align_corners)
    rows = _grid_bounded(rows, h, padding_mode, align_corners)
    if interpolation_mode == 1:
        return _grid_gather(inp, jnp.round(rows), jnp.round(cols)).astype(x.dtype)
    c0, r0 = jnp.floor(cols), jnp.floor(rows)
    wc, wr = (cols - c0)[:, None], (rows - r0)[:, None]
    out = ((_grid_gather(inp, r0, c0) * (1 - wc) + _grid_gather(inp, r0, c0 + 1) * wc) * (1 - wr)
           + (_grid_gather(inp, r0 + 1, c0) * (1 - wc) + _grid_gather(inp, r0 + 1, c0 + 1) * wc) * wr)
    return out.astype(x.dtype)


def aten_embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                       per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Sum (0), mean (1) or max (2) of each bag of rows; also, as torch's CPU kernel: each index's
    bag (empty for a plain sum, which skips it), bag sizes (zeros for a sum) and the max's rows
    (the bag sizes again for a mean, zeros for a sum)."""
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    positions = jnp.arange(indices.shape[0])
    bag = jnp.minimum(jnp.searchsorted(offsets, positions, side="right") - 1, bags - 1).astype(jnp.int32)
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    rows = _wide(weight)[indices]
    counts = jnp.zeros((bags,), jnp.int32).at[bag].add(keep.astype(jnp.int32))
    offset2bag = bag if mode != 0 or padding_idx >= 0 else jnp.zeros((0,), jnp.int32)
    if mode == 2:
        best = jnp.full((bags, weight.shape[1]), -jnp.inf, rows.dtype).at[bag].max(
            jnp.where(keep[:, None], rows, -jnp.inf))
        hit = keep[:, None] & (rows == best[bag])
        first = jnp.full(best.shape, indices.shape[0], jnp.int32).at[bag].min(
            jnp.where(hit, positions[:, None], indices.shape[0]))
        found = first < indices.shape[0]
        which = jnp.where(found, indices[jnp.minimum(first, indices.shape[0] - 1)], 0)
        return jnp.where(found, best, 0).astype(weight.dtype), offset2bag, counts, which
    if per_sample_weights is not None:
        rows = rows * _wide(per_sample_weights)[:, None]
    sums = jnp.zeros((bags, weight.shape[1]), rows.dtype).at[bag].add(jnp.where(keep[:, None], rows, 0))
    if mode == 1:
        out = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1)[:, None], 0)
        return out.astype(weight.dtype), offset2bag, counts, counts
    zeros = jnp.zeros((bags,), jnp.int32)
    return sums.astype(weight.dtype), offset2bag, zeros, zeros
