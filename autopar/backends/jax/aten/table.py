"""Which JAX function translates each ATen op.

The table covers PyTorch's Core ATen opset (the ops tagged ``torch.Tag.core``, into which
torch's decompositions reduce every other op) and the higher-level ops autopar keeps whole
because their translation is more accurate or faster than their decomposition (attention,
layer norm, softmax and their backwards, which take the statistics the forward saved). An op
in neither is decomposed into Core ATen at emission (autopar.backends.jax.decompose). Every
entry is tested against torch on PyTorch's OpInfo samples (tests/test_jax_ops.py).
"""
from __future__ import annotations

import types

from autopar.backends.jax.aten import creation, indexing, nn, pointwise, reductions, shapes, spatial

_p, _r, _s, _c, _i, _n, _sp = pointwise, reductions, shapes, creation, indexing, nn, spatial

TABLE = {
    # elementwise
    **{f"aten.{op}.{overload}": getattr(_p, f"aten_{op}")
       for op in ("add", "sub", "rsub", "mul", "div", "remainder", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor",
                  "eq", "ne", "lt", "le", "gt", "ge")
       for overload in ("Tensor", "Scalar")},
    "aten.div.Tensor_mode": _p.aten_div,
    "aten.div.Scalar_mode": _p.aten_div,
    "aten.floor_divide.default": _p.aten_floor_divide,
    "aten.pow.Tensor_Scalar": _p.aten_pow,
    "aten.pow.Tensor_Tensor": _p.aten_pow,
    "aten.pow.Scalar": _p.aten_pow,
    "aten.atan2.default": _p.aten_atan2,
    "aten.maximum.default": _p.aten_maximum,
    "aten.minimum.default": _p.aten_minimum,
    "aten.where.self": _p.aten_where,
    "aten.masked_fill.Scalar": _p.aten_masked_fill,
    "aten.masked_fill.Tensor": _p.aten_masked_fill,
    "aten.clamp.default": _p.aten_clamp,
    "aten.clamp.Tensor": _p.aten_clamp,
    **{f"aten.{op}.default": getattr(_p, f"aten_{op}")
       for op in ("bitwise_not", "logical_and", "logical_or", "logical_xor", "logical_not", "neg", "abs", "sign",
                  "reciprocal", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "sin", "cos",
                  "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf",
                  "sigmoid", "floor", "ceil", "trunc", "round", "isnan", "isinf", "relu", "threshold_backward",
                  "leaky_relu", "hardtanh", "elu", "gelu", "gelu_backward", "tanh_backward", "sigmoid_backward",
                  "silu", "silu_backward")},
    # reductions and scans
    "aten.sum.dim_IntList": _r.aten_sum,
    "aten.sum.default": _r.aten_sum,
    "aten.mean.dim": _r.aten_mean,
    "aten.mean.default": _r.aten_mean,
    "aten.prod.default": _r.aten_prod,
    "aten.prod.dim_int": _r.aten_prod,
    "aten.amax.default": _r.aten_amax,
    "aten.amin.default": _r.aten_amin,
    "aten.any.default": _r.aten_any,
    "aten.any.dim": _r.aten_any,
    "aten.any.dims": _r.aten_any,
    "aten.argmax.default": _r.aten_argmax,
    "aten.argmin.default": _r.aten_argmin,
    "aten.max.dim": _r.aten_max_dim,
    "aten.min.dim": _r.aten_min_dim,
    "aten.var.correction": _r.aten_var,
    "aten.var.dim": _r.aten_var_dim,
    "aten.cumsum.default": _r.aten_cumsum,
    "aten.histc.default": _r.aten_histc,
    # views, layout, slicing
    "aten.view.default": _s.aten_view,
    "aten._unsafe_view.default": _s.aten_view,
    "aten.reshape.default": _s.aten_view,
    "aten.t.default": _s.aten_t,
    "aten.transpose.int": _s.aten_transpose,
    "aten.permute.default": _s.aten_permute,
    "aten.expand.default": _s.aten_expand,
    "aten.as_strided.default": _s.aten_as_strided,
    "aten.unsqueeze.default": _s.aten_unsqueeze,
    "aten.squeeze.dim": _s.aten_squeeze,
    "aten.squeeze.dims": _s.aten_squeeze,
    "aten.squeeze.default": _s.aten_squeeze,
    "aten.clone.default": _s.aten_identity,
    "aten.detach.default": _s.aten_identity,
    "aten.alias.default": _s.aten_identity,
    "aten.lift_fresh_copy.default": _s.aten_identity,
    "aten._to_copy.default": _s.aten_to_copy,
    "aten.copy.default": _s.aten_copy,
    "aten.cat.default": _s.aten_cat,
    "aten.constant_pad_nd.default": _s.aten_constant_pad_nd,
    "aten.slice.Tensor": _s.aten_slice,
    "aten.slice_backward.default": _s.aten_slice_backward,
    "aten.slice_scatter.default": _s.aten_slice_scatter,
    "aten.select.int": _s.aten_select,
    "aten.select_backward.default": _s.aten_select_backward,
    "aten.select_scatter.default": _s.aten_select_scatter,
    "aten.split.Tensor": _s.aten_split,
    "aten.split_with_sizes.default": _s.aten_split_with_sizes,
    "aten.diagonal.default": _s.aten_diagonal,
    "aten.flip.default": _s.aten_flip,
    "aten.repeat.default": _s.aten_repeat,
    "aten.tril.default": _s.aten_tril,
    "aten.triu.default": _s.aten_triu,
    # creation
    "aten.arange.default": _c.aten_arange,
    "aten.arange.start": _c.aten_arange,
    "aten.arange.start_step": _c.aten_arange,
    "aten.full.default": _c.aten_full,
    "aten.full_like.default": _c.aten_full_like,
    "aten.ones.default": _c.aten_ones,
    "aten.zeros.default": _c.aten_zeros,
    "aten.empty.memory_format": _c.aten_empty,
    "aten.empty_strided.default": _c.aten_empty_strided,
    "aten.new_empty.default": _c.aten_new_empty,
    "aten.new_empty_strided.default": _c.aten_new_empty_strided,
    "aten.new_zeros.default": _c.aten_new_zeros,
    "aten.new_ones.default": _c.aten_new_ones,
    "aten.new_full.default": _c.aten_new_full,
    "aten.empty_permuted.default": _c.aten_empty_permuted,
    "aten.ones_like.default": _c.aten_ones_like,
    "aten.zeros_like.default": _c.aten_zeros_like,
    "aten.empty_like.default": _c.aten_empty_like,
    "aten.scalar_tensor.default": _c.aten_scalar_tensor,
    "aten.fill.Scalar": _c.aten_fill,
    # indexing, sorting, routing
    "aten.gather.default": _i.aten_gather,
    "aten.scatter.src": _i.aten_scatter,
    "aten.scatter.value": _i.aten_scatter_value,
    "aten.scatter_add.default": _i.aten_scatter_add,
    "aten.scatter_reduce.two": _i.aten_scatter_reduce,
    "aten.index.Tensor": _i.aten_index,
    "aten.index_put.default": _i.aten_index_put,
    "aten.index_select.default": _i.aten_index_select,
    "aten.masked_scatter.default": _i.aten_masked_scatter,
    "aten.sort.default": _i.aten_sort,
    "aten.topk.default": _i.aten_topk,
    "aten.embedding.default": _i.aten_embedding,
    "aten.embedding_dense_backward.default": _i.aten_embedding_dense_backward,
    # neural-network ops
    "aten.mm.default": _n.aten_mm,
    "aten.bmm.default": _n.aten_mm,
    "aten.addmm.default": _n.aten_addmm,
    "aten.baddbmm.default": _n.aten_baddbmm,
    "aten.native_dropout.default": _n.aten_native_dropout,
    "aten.native_dropout_backward.default": _n.aten_native_dropout_backward,
    "aten._safe_softmax.default": _n.aten_safe_softmax,
    "aten.native_layer_norm.default": _n.aten_native_layer_norm,
    "aten.native_layer_norm_backward.default": _n.aten_native_layer_norm_backward,
    "aten._log_softmax.default": _n.aten_log_softmax,
    "aten._log_softmax_backward_data.default": _n.aten_log_softmax_backward_data,
    "aten._softmax.default": _n.aten_softmax,
    "aten._softmax_backward_data.default": _n.aten_softmax_backward_data,
    "aten.nll_loss_forward.default": _n.aten_nll_loss_forward,
    "aten.nll_loss_backward.default": _n.aten_nll_loss_backward,
    "aten._scaled_dot_product_flash_attention_for_cpu.default": _n.aten_sdpa_flash_cpu,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": _n.aten_sdpa_flash_cpu_backward,
    "aten.convolution.default": _n.aten_convolution,
    "aten.convolution_backward.default": _n.aten_convolution_backward,
    # custom ops of libraries autopar plans (autopar.ops.indexing.NAMED_RULES)
    "transformers.grouped_mm_fallback.default": _n.transformers_grouped_mm,
    "transformers.grouped_mm_fallback_backward.default": _n.transformers_grouped_mm_backward,
    "autopar.moe_experts.default": _n.autopar_moe_experts,
    "autopar.moe_experts_backward.default": _n.autopar_moe_experts_backward,
    # spatial
    "aten._adaptive_avg_pool2d.default": _sp.aten_adaptive_avg_pool2d,
    "aten._adaptive_avg_pool2d_backward.default": _sp.aten_adaptive_avg_pool2d_backward,
    "aten._adaptive_avg_pool3d.default": _sp.aten_adaptive_avg_pool3d,
    "aten.adaptive_avg_pool1d.default": _sp.aten_adaptive_avg_pool1d,
    "aten.avg_pool1d.default": _sp.aten_avg_pool1d,
    "aten.avg_pool2d.default": _sp.aten_avg_pool2d,
    "aten.avg_pool2d_backward.default": _sp.aten_avg_pool2d_backward,
    "aten.avg_pool3d.default": _sp.aten_avg_pool3d,
    "aten.max_pool2d_with_indices.default": _sp.aten_max_pool2d_with_indices,
    "aten.max_pool2d_with_indices_backward.default": _sp.aten_max_pool2d_with_indices_backward,
    "aten.max_pool3d_with_indices.default": _sp.aten_max_pool3d_with_indices,
    "aten.reflection_pad1d.default": _sp.aten_reflection_pad,
    "aten.reflection_pad2d.default": _sp.aten_reflection_pad,
    "aten.replication_pad2d.default": _sp.aten_replication_pad,
    "aten.reflection_pad3d.default": _sp.aten_reflection_pad,
    "aten.replication_pad3d.default": _sp.aten_replication_pad,
    "aten.upsample_nearest2d.vec": _sp.aten_upsample_nearest2d,
    "aten.upsample_bilinear2d.vec": _sp.aten_upsample_bilinear2d,
    "aten.native_group_norm.default": _sp.aten_native_group_norm,
    "aten.native_group_norm_backward.default": _sp.aten_native_group_norm_backward,
    "aten._native_batch_norm_legit.default": _sp.aten_native_batch_norm_legit,
    "aten._native_batch_norm_legit.no_stats": _sp.aten_native_batch_norm_legit_no_stats,
    "aten._native_batch_norm_legit_no_training.default": _sp.aten_native_batch_norm_legit_no_training,
    "aten._native_batch_norm_legit_functional.default": _sp.aten_native_batch_norm_legit_functional,
    "aten.native_batch_norm_backward.default": _sp.aten_native_batch_norm_backward,
    "aten._fft_r2c.default": _sp.aten_fft_r2c,
    "aten._fft_c2r.default": _sp.aten_fft_c2r,
    "aten._fft_c2c.default": _sp.aten_fft_c2c,
    "aten._cdist_forward.default": _sp.aten_cdist_forward,
    "aten._pdist_forward.default": _sp.aten_pdist_forward,
    "aten.col2im.default": _sp.aten_col2im,
    "aten.grid_sampler_2d.default": _sp.aten_grid_sampler_2d,
    "aten._embedding_bag.default": _sp.aten_embedding_bag,
}

_MODULES = (pointwise, reductions, shapes, creation, indexing, nn, spatial)


def helpers_of(function) -> list:
    """The module-level functions of the translation modules that ``function`` calls, directly or
    through each other (lambdas included), callees first: the emitted program carries their source."""
    found: list = []
    _collect(function, found)
    return found


def _collect(function, found: list) -> None:
    for name in _names(function.__code__):
        callee = next((vars(m)[name] for m in _MODULES if isinstance(vars(m).get(name), types.FunctionType)), None)
        if callee is not None and callee is not function and callee not in found:
            _collect(callee, found)
            if callee not in found:
                found.append(callee)


def _names(code) -> dict:
    """The global names ``code`` reads, nested functions' included, in the order it first reads
    them (a dict as an ordered set: the emitted module must come out the same every run)."""
    names = dict.fromkeys(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names.update(_names(constant))
    return names
