"""PyTorch's OpInfo sample inputs as recorded ATen calls, to test each JAX translation of
autopar.backends.jax.aten against torch.

Each OpInfo sample (``torch.testing._internal.common_methods_invocations.op_db``) runs its torch
function under a dispatch mode that records every ATen call it makes (the op itself, and the ops
its backward makes when the sample is differentiated), with its arguments and torch's result.
A translation is then called with those same arguments, as the emitted program passes them,
and compared with torch's result.
"""
from __future__ import annotations

import functools
import itertools
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

SAMPLES_PER_OPINFO = 8
CALLS_PER_OP = 12
# float64 needs JAX's x64 mode, which the program leaves off
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)

# the OpInfos whose samples reach an ATen op, where its name does not say (a backward op: its forward's)
OPINFOS = {
    "_adaptive_avg_pool2d": ["nn.functional.adaptive_avg_pool2d"],
    "_adaptive_avg_pool2d_backward": ["nn.functional.adaptive_avg_pool2d"],
    "_adaptive_avg_pool3d": ["nn.functional.adaptive_avg_pool3d"],
    "_cdist_forward": ["cdist"],
    "_pdist_forward": ["nn.functional.pdist"],
    "_embedding_bag": ["nn.functional.embedding_bag"],
    "_log_softmax": ["log_softmax", "nn.functional.log_softmax", "nn.functional.cross_entropy"],
    "_log_softmax_backward_data": ["log_softmax", "nn.functional.cross_entropy"],
    "_softmax": ["softmax", "nn.functional.softmax"],
    "_softmax_backward_data": ["softmax", "nn.functional.softmax"],
    "_native_batch_norm_legit": ["_native_batch_norm_legit"],
    "_native_batch_norm_legit_no_training": ["_native_batch_norm_legit", "nn.functional.batch_norm"],
    "_scaled_dot_product_flash_attention_for_cpu": ["nn.functional.scaled_dot_product_attention"],
    "_scaled_dot_product_flash_attention_for_cpu_backward": ["nn.functional.scaled_dot_product_attention"],
    "_to_copy": ["to", "double", "float", "int", "bool"],
    "_unsafe_view": ["reshape", "view", "flatten"],
    "addmm": ["addmm", "nn.functional.linear"],
    "alias": ["view_as"],
    "amax": ["amax", "max.reduction_no_dim"],
    "as_strided": [],  # its OpInfo's windows overlap; views of transposed and sliced tensors are GENERATED
    "amin": ["amin", "min.reduction_no_dim"],
    "any": ["any"],
    "arange": ["arange"],
    "avg_pool2d": ["nn.functional.avg_pool2d"],
    "avg_pool2d_backward": ["nn.functional.avg_pool2d"],
    "avg_pool3d": ["nn.functional.avg_pool3d"],
    "bitwise_and": ["bitwise_and", "logical_and"],
    "clamp": ["clamp", "clip"],
    "col2im": ["nn.functional.unfold"],
    "convolution": ["nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d"],
    "convolution_backward": ["nn.functional.conv1d", "nn.functional.conv2d"],
    "copy": ["copy"],
    "div": ["div.no_rounding_mode", "div.trunc_rounding", "div.floor_rounding", "true_divide", "floor_divide"],
    "elu": ["nn.functional.elu"],
    "embedding": ["nn.functional.embedding"],
    "embedding_dense_backward": ["nn.functional.embedding"],
    "empty": ["empty"],
    "empty_like": ["empty_like"],
    "empty_strided": ["empty_strided"],
    "expand": ["expand", "expand_as", "broadcast_to"],
    "full": ["full"],
    "gelu": ["nn.functional.gelu"],
    "gelu_backward": ["nn.functional.gelu"],
    "grid_sampler_2d": ["nn.functional.grid_sample"],
    "hardtanh": ["nn.functional.hardtanh"],
    "index": ["__getitem__", "index_put"],
    "leaky_relu": ["nn.functional.leaky_relu"],
    "lift_fresh_copy": ["clone"],
    "masked_fill": ["masked_fill"],
    "max": ["max.reduction_with_dim"],
    "max_pool2d_with_indices": ["nn.functional.max_pool2d"],
    "max_pool2d_with_indices_backward": ["nn.functional.max_pool2d"],
    "max_pool3d_with_indices": ["nn.functional.max_pool3d"],
    "mean": ["mean"],
    "min": ["min.reduction_with_dim"],
    "native_dropout_backward": ["native_dropout_backward"],
    "native_batch_norm_backward": ["nn.functional.batch_norm"],
    "_fft_r2c": ["fft.rfft", "fft.rfftn", "fft.rfft2"],
    "_fft_c2r": ["fft.irfft", "fft.irfftn", "fft.irfft2"],
    "_fft_c2c": ["fft.fft", "fft.ifft", "fft.fftn"],
    "native_group_norm": ["native_group_norm", "nn.functional.group_norm"],
    "native_group_norm_backward": ["nn.functional.group_norm"],
    "native_layer_norm": ["native_layer_norm", "nn.functional.layer_norm"],
    "native_layer_norm_backward": ["nn.functional.layer_norm"],
    "nll_loss_backward": ["nn.functional.nll_loss", "nn.functional.cross_entropy"],
    "nll_loss_forward": ["nn.functional.nll_loss", "nn.functional.cross_entropy"],
    "ones": ["ones"],
    "ones_like": ["ones_like"],
    "pow": ["pow"],
    "prod": ["prod"],
    "reflection_pad1d": ["nn.functional.pad.reflect"],
    "reflection_pad2d": ["nn.functional.pad.reflect"],
    "reflection_pad3d": ["nn.functional.pad.reflect"],
    "relu": ["nn.functional.relu"],
    "replication_pad2d": ["nn.functional.pad.replicate"],
    "replication_pad3d": ["nn.functional.pad.replicate"],
    "scalar_tensor": ["torch.ops.aten.scalar_tensor"],
    "scatter": ["scatter"],
    "scatter_reduce": ["scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.amax", "scatter_reduce.amin",
                       "scatter_reduce.mean"],
    "select": ["select"],
    "select_backward": ["select"],
    "sigmoid": ["sigmoid", "nn.functional.logsigmoid"],
    "sigmoid_backward": ["sigmoid"],
    "silu": ["nn.functional.silu"],
    "silu_backward": ["nn.functional.silu"],
    "slice": ["narrow", "__getitem__"],
    "slice_backward": ["narrow", "__getitem__"],
    "split": ["split"],
    "split_with_sizes": ["split_with_sizes", "split"],
    "squeeze": ["squeeze", "squeeze.multiple"],
    "sum": ["sum"],
    "t": ["t"],
    "tanh_backward": ["tanh"],
    "threshold_backward": ["nn.functional.relu"],
    "upsample_bilinear2d": ["nn.functional.interpolate.bilinear"],
    "upsample_nearest2d": ["nn.functional.interpolate.nearest"],
    "var": ["var", "var_mean"],
    "view": ["view", "reshape"],
    "where": ["where"],
    "zeros": ["zeros"],
    "zeros_like": ["zeros_like"],
}


def opinfo_names(target: str) -> list[str]:
    """OpInfo names whose samples call ``target`` (``aten.name.overload``)."""
    name = target.split(".")[1]
    plain = name.lstrip("_")
    return OPINFOS.get(name, [plain, f"nn.functional.{plain}", f"special.{plain}"])


@dataclass
class Call:
    target: str
    args: tuple
    kwargs: dict
    out: object


class _Recorder(TorchDispatchMode):
    def __init__(self, targets: set[str]):
        super().__init__()
        self.targets = targets  # what to record (it may shrink while recording)
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if str(func) not in self.targets:
            return func(*args, **kwargs)
        kept_args, kept_kwargs = _detached(args), _detached(kwargs)  # before the op can write them
        out = func(*args, **kwargs)
        self.calls.append(Call(str(func), kept_args, kept_kwargs, _detached(out)))
        return out


def _detached(value):
    return tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)


@functools.cache
def _opinfos() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    found: dict = {}
    for info in op_db:
        full = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        found.setdefault(full, info)
        found.setdefault(info.name, info)
    return found


def recorded_calls(target: str, dtype: torch.dtype) -> list[Call]:
    """ATen calls of ``target`` that OpInfo samples of ``dtype`` make, forward and backward; for an
    overload that eager torch never dispatches to (the Scalar overloads, views that only export
    emits), the overload itself called on the inputs of its sibling's samples."""
    calls: list[Call] = []
    for name in opinfo_names(target):
        calls += [c for c in _calls_of_opinfo(name, dtype) if c.target == target]
        if len(calls) >= CALLS_PER_OP:
            break
    if not calls and target in DERIVED:
        calls = _derived_calls(target, dtype)
    if not calls and target in GENERATED and dtype in (torch.float32, torch.bfloat16):
        calls = GENERATED[target](dtype)
    return calls[:CALLS_PER_OP]


def _number(x: torch.Tensor):
    """A Python number of x's category: what an export graph passes to a Scalar overload."""
    return True if x.dtype == torch.bool else 3 if not x.dtype.is_floating_point else 2.5


def _flipped(x: torch.Tensor) -> torch.Tensor:
    return x.logical_not() if x.dtype == torch.bool else x + 1


def _scalar_overload(c: Call):
    return (c.args[0], _number(c.args[0])), {}


# target -> (the op whose recorded calls give the inputs, (call) -> the target's args and kwargs)
DERIVED = {
    **{f"aten.{op}.Scalar": (f"aten.{op}.Tensor", _scalar_overload)
       for op in ("add", "sub", "rsub", "mul", "div", "remainder", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor",
                  "eq", "ne", "lt", "le", "gt", "ge")},
    "aten.div.Scalar_mode": ("aten.div.Tensor_mode", lambda c: ((c.args[0], _number(c.args[0])), c.kwargs)),
    "aten.pow.Tensor_Scalar": ("aten.pow.Tensor_Tensor", lambda c: ((c.args[0], 2), {})),
    "aten.pow.Scalar": ("aten.pow.Tensor_Tensor", lambda c: ((2, c.args[1]), {})),
    "aten.clamp.default": ("aten.clamp.Tensor", lambda c: ((c.args[0], -1, 1), {})),
    "aten.clip.default": ("aten.clamp.Tensor", lambda c: ((c.args[0], -1, 1), {})),
    "aten.alias.default": ("aten.clone.default", lambda c: ((c.args[0],), {})),
    "aten.detach.default": ("aten.clone.default", lambda c: ((c.args[0],), {})),
    "aten.lift_fresh_copy.default": ("aten.clone.default", lambda c: ((c.args[0],), {})),
    "aten.copy.default": ("aten.clone.default", lambda c: ((c.args[0], _flipped(c.args[0])), {})),
    "aten.scalar_tensor.default": ("aten.clone.default",
                                   lambda c: ((c.args[0].reshape(-1)[0].item(),), {"dtype": c.args[0].dtype})),
    "aten._unsafe_view.default": ("aten.view.default", lambda c: (c.args, c.kwargs)),
    "aten.reshape.default": ("aten.view.default", lambda c: (c.args, c.kwargs)),
    "aten.arange.default": ("aten.arange.start_step", lambda c: ((c.args[1],), {"dtype": c.kwargs.get("dtype")})),
    "aten.arange.start": ("aten.arange.start_step", lambda c: (c.args[:2], {"dtype": c.kwargs.get("dtype")})),
    "aten.var.dim": ("aten.var.correction", lambda c: ((c.args[0], c.args[1] if len(c.args) > 1 else None, True,
                                                          c.kwargs.get("keepdim", False)), {})),
    "aten.native_dropout.default": ("aten.clone.default", lambda c: ((c.args[0], 0.5, True), {})),
    "aten._safe_softmax.default": ("aten._softmax.default", lambda c: (c.args[:2], {})),
}


def _derived_calls(target: str, dtype: torch.dtype, sources: list[Call] | None = None) -> list[Call]:
    """``target``'s calls made from its DERIVED source's (``sources``, or those recorded for the
    JAX table)."""
    source, make = DERIVED[target]
    overload = _overload(target)
    calls = []
    for call in recorded_calls(source, dtype) if sources is None else sources:
        try:
            args, kwargs = make(call)
            out = overload(*args, **kwargs)
        except Exception:  # inputs the overload rejects (a float to a bitwise op) are no sample of it
            continue
        calls.append(Call(target, _detached(args), _detached(kwargs), _detached(out)))
    return calls


def _overload(target: str):
    _, name, overload = target.split(".")
    return getattr(getattr(torch.ops.aten, name), overload)


@functools.cache
def _calls_of_opinfo(name: str, dtype: torch.dtype) -> tuple[Call, ...]:
    """Every call of a table op that the OpInfo's samples make (each OpInfo runs once per dtype)."""
    from autopar.backends.jax.aten import TABLE

    info = _opinfos().get(name)
    if info is None or dtype not in info.supported_dtypes("cpu"):
        return ()
    grad = dtype.is_floating_point and info.supports_autograd
    return tuple(_run_samples(info, dtype, grad, set(TABLE)))


def _run_samples(info, dtype, grad: bool, targets: set[str], count: int = SAMPLES_PER_OPINFO) -> list[Call]:
    torch.manual_seed(0)
    recorder = _Recorder(targets)
    try:
        # the OpInfo's own generator: OpInfo.sample_inputs wraps it in an iterator that inspects the
        # call stack and reseeds for every sample, which is most of the time in a large process
        samples = list(itertools.islice(info.sample_inputs_func(info, "cpu", dtype, grad), count))
    except Exception:  # a sample generator that needs what this build lacks gives no samples
        return []
    for sample in samples:
        try:
            with recorder, warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's deprecation notes on its own samples
                out = info.op(sample.input, *sample.args, **sample.kwargs)
                if grad:
                    _differentiate(out, sample)
        except Exception:  # a sample the op itself rejects (it tests the error) records what ran before
            continue
    return recorder.calls


def _differentiate(out, sample) -> None:
    outs = [t for t in (out if isinstance(out, (tuple, list)) else [out])
            if isinstance(t, torch.Tensor) and t.requires_grad and t.dtype.is_floating_point]
    leaves = [t for t in [sample.input, *sample.args, *sample.kwargs.values()]
              if isinstance(t, torch.Tensor) and t.requires_grad]
    if outs and leaves:
        torch.autograd.grad(outs, leaves, [torch.randn_like(t) for t in outs], allow_unused=True)


_JAX_DTYPES = {torch.float32: "float32", torch.float64: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.int64: "int32", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
               torch.uint8: "uint8", torch.bool: "bool", torch.complex64: "complex64", torch.complex128: "complex64"}


def to_jax(value):
    """An argument as the emitted program passes it: arrays for tensors (int64 as JAX's int32),
    JAX dtypes for torch dtypes, None for devices, layouts and memory formats."""
    import jax.numpy as jnp

    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            return jnp.asarray(value.float().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(value.numpy().astype(_JAX_DTYPES[value.dtype]))
    if isinstance(value, torch.dtype):
        return getattr(jnp, _JAX_DTYPES[value])
    if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(to_jax(v) for v in value)
    return value


def close(mine, theirs: torch.Tensor) -> str | None:
    """None where the JAX result equals torch's within its dtype's tolerance, else what differs."""
    mine = np.asarray(mine.astype("float32") if str(getattr(mine, "dtype", "")) == "bfloat16" else mine)
    expected = theirs.detach()
    if expected.is_complex():  # real and imaginary parts side by side
        expected = torch.view_as_real(expected)
        mine = np.stack([mine.real, mine.imag], axis=-1)
    expected = (expected.float() if expected.dtype in (torch.bfloat16, torch.float16) else expected).numpy()
    if mine.shape != expected.shape:
        return f"shape {mine.shape} != torch's {expected.shape}"
    if expected.dtype == np.bool_ or not np.issubdtype(expected.dtype, np.floating):
        if not np.array_equal(mine.astype(expected.dtype), expected):
            return f"values differ: {mine.ravel()[:6]} vs torch's {expected.ravel()[:6]}"
        return None
    tolerance = 2e-2 if theirs.dtype in (torch.bfloat16, torch.float16) else 1e-4
    # a half-precision sum is exact only to its rounding at the scale of the result (torch and XLA
    # round partial sums in different orders), so its absolute tolerance grows with that scale
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max())) if finite.size and tolerance > 1e-3 else 1.0
    if not np.allclose(mine.astype(np.float64), expected.astype(np.float64), rtol=tolerance, atol=tolerance * scale,
                       equal_nan=True):
        worst = np.nanmax(np.abs(mine.astype(np.float64) - expected))
        return f"max difference {worst:.3g} (tolerance {tolerance})"
    return None


def _attention_calls(dtype: torch.dtype, backward: bool) -> list[Call]:
    """CPU flash attention (no OpInfo reaches the kernel itself: eager SDPA picks its math path
    when the sample asks for gradients), causal or not, with an additive mask (the kernel takes
    only a mask of the query's dtype), self-attention among them (the sequence split's)."""
    torch.manual_seed(0)
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    calls = []
    for s_q, s_k, causal, mask in [(5, 7, False, None), (6, 6, True, None), (8, 8, False, None),
                                   (8, 8, False, "float"), (5, 7, False, "float"), (4, 9, True, "float"),
                                   (8, 8, True, None)]:
        q, k, v = (torch.randn(2, 3, n, 8).to(dtype) for n in (s_q, s_k, s_k))
        extra = {}
        if mask == "float":
            extra["attn_mask"] = torch.randn(s_q, s_k).to(dtype)
        out, lse = forward(q, k, v, 0.0, causal, **extra)
        if not backward:
            calls.append(Call(str(forward), (q, k, v, 0.0, causal), extra, (out, lse)))
            continue
        grad = torch.randn_like(out)
        args = (grad, q, k, v, out, lse, 0.0, causal)
        target = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
        calls.append(Call(str(target), args, extra, target(*args, **extra)))
    return calls


def _grouped_mm_calls(dtype: torch.dtype, backward: bool) -> list[Call]:
    """transformers' grouped matmul (no OpInfo: a library's custom op), with an empty group and
    rows past the last offset, as Mixture-of-Experts routing makes them."""
    import transformers.integrations.moe  # noqa: F401  (registers the ops)

    torch.manual_seed(0)
    forward = torch.ops.transformers.grouped_mm_fallback.default
    backward_op = torch.ops.transformers.grouped_mm_fallback_backward.default
    calls = []
    for rows, offsets in [(10, [3, 3, 8, 10]), (12, [0, 5, 6, 9]), (6, [6, 6, 6, 6])]:
        x, w = torch.randn(rows, 8).to(dtype), torch.randn(4, 8, 5).to(dtype)
        offs = torch.tensor(offsets)
        if backward:
            grad = torch.randn(rows, 5).to(dtype)
            calls.append(Call(str(backward_op), (x, w, offs, grad), {}, backward_op(x, w, offs, grad)))
        else:
            calls.append(Call(str(forward), (x, w, offs), {}, forward(x, w, offs)))
    return calls


def _moe_experts_calls(dtype: torch.dtype, backward: bool) -> list[Call]:
    """autopar's mixture-of-experts op on random routing, on routing that crowds one expert, and
    on routing that leaves an expert without tokens."""
    import autopar.ops.moe  # noqa: F401  (defines the ops)

    g = torch.Generator().manual_seed(0)
    op = torch.ops.autopar.moe_experts_backward.default if backward else torch.ops.autopar.moe_experts.default
    calls = []
    for crowded, unused in [(None, None), (1, None), (None, 3)]:
        scores = torch.rand(8, 4, generator=g)
        if crowded is not None:
            scores[:, crowded] += 1.0
        if unused is not None:
            scores[:, unused] -= 1.0
        weights, index = scores.softmax(-1).topk(2, dim=-1)
        x, gate_up, down = (torch.randn(*shape, generator=g).to(dtype) for shape in [(8, 6), (4, 10, 6), (4, 6, 5)])
        args = (x, index, weights.to(dtype), gate_up, down)
        if backward:
            args = (torch.randn(8, 6, generator=g).to(dtype),) + args
        calls.append(Call(str(op), args, {}, op(*args)))
    return calls


def _direct_calls(target: str, cases: list[tuple[tuple, tuple]]):
    """Calls of an op that eager torch never dispatches to (it calls a sibling: avg_pool1d goes
    through avg_pool2d) or whose OpInfo samples lie past SAMPLES_PER_OPINFO, on hand-picked
    inputs: each case is (the tensor arguments' shapes, the other arguments)."""
    def calls(dtype: torch.dtype) -> list[Call]:
        torch.manual_seed(0)
        op = _overload(target)
        made = []
        for shapes, rest in cases:
            tensors = tuple(torch.rand(shape).to(dtype) * 4 - 2 if i < 3 else torch.rand(shape).to(dtype) + 0.5
                            for i, shape in enumerate(shapes))  # a 4th and 5th tensor: batch norm's positive var
            made.append(Call(target, tensors + rest, {}, op(*tensors, *rest)))
        return made

    return calls


_UNREACHED = {
    "aten.avg_pool1d.default": [(((2, 3, 9),), ([3], [2], [1], False, True)),
                                (((1, 2, 10),), ([4], [3], [2], True, False))],
    "aten.adaptive_avg_pool1d.default": [(((2, 3, 9),), ([4],)), (((1, 2, 5),), ([7],))],
    "aten.upsample_nearest2d.vec": [(((1, 2, 5, 4),), ([7, 9], None)), (((2, 1, 4, 6),), (None, [1.5, 2.0]))],
    "aten.upsample_bilinear2d.vec": [(((1, 2, 5, 4),), ([7, 9], True, None)),
                                     (((2, 1, 4, 6),), (None, False, [1.5, 2.0])),
                                     (((1, 1, 6, 6),), ([3, 4], False, None))],
    "aten.reflection_pad2d.default": [(((1, 2, 5, 6),), ([1, 2, 2, 1],)), (((2, 4, 5),), ([2, 1, 0, 3],))],
    "aten._native_batch_norm_legit_functional.default": [(((4, 3, 5), (3,), (3,), (3,), (3,)), (True, 0.1, 1e-5)),
                                                         (((2, 3, 4, 4), (3,), (3,), (3,), (3,)), (False, 0.1, 1e-3))],
    "aten.reflection_pad3d.default": [(((1, 2, 4, 5, 6),), ([1, 2, 2, 1, 3, 0],)),
                                      (((2, 4, 5, 6),), ([-1, 2, 0, 1, 1, 1],))],
    "aten.replication_pad3d.default": [(((1, 2, 4, 5, 6),), ([1, 2, 2, 1, 3, 0],)),
                                       (((2, 4, 5, 6),), ([3, -1, 0, 1, 1, 2],))],
    "aten._native_batch_norm_legit.no_stats": [(((4, 3, 5), (3,), (3,)), (True, 0.1, 1e-5)),
                                               (((2, 3, 4, 4), (3,), (3,)), (True, 0.1, 1e-3))],
    "aten._native_batch_norm_legit_no_training.default": [
        (((4, 3, 5), (3,), (3,), (3,), (3,)), (0.1, 1e-5)), (((2, 3, 4, 4), (3,), (3,), (3,), (3,)), (0.1, 1e-3))],
}


def _as_strided_calls(dtype: torch.dtype) -> list[Call]:
    """as_strided as views of transposed, sliced, strided, selected and expanded tensors make it."""
    torch.manual_seed(0)
    x, cube = torch.randn(4, 6).to(dtype), torch.randn(2, 3, 4).to(dtype)
    cases = [(x, x.t()), (x, x[1:3, 1:4]), (x, x[::2, 1::2]), (x, x[2]), (x, x[:, 3]), (x, x.expand(3, 4, 6)),
             (x, x[1:, :4].t()), (cube, cube.permute(2, 0, 1)), (cube, cube[:, 1:, ::2].transpose(0, 2)),
             (cube, cube[1].unsqueeze(0).expand(5, 3, 4))]
    calls = []
    for base, view in cases:
        args = (base, list(view.shape), list(view.stride()), view.storage_offset())
        calls.append(Call("aten.as_strided.default", args, {}, torch.ops.aten.as_strided.default(*args).clone()))
    return calls


# target -> (dtype) -> calls, for ops no OpInfo sample reaches in eager mode
GENERATED = {
    **{target: _direct_calls(target, cases) for target, cases in _UNREACHED.items()},
    "transformers.grouped_mm_fallback.default": lambda dtype: _grouped_mm_calls(dtype, False),
    "transformers.grouped_mm_fallback_backward.default": lambda dtype: _grouped_mm_calls(dtype, True),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": lambda dtype: _attention_calls(dtype, False),
    "aten.as_strided.default": _as_strided_calls,
    "autopar.moe_experts.default": lambda dtype: _moe_experts_calls(dtype, False),
    "autopar.moe_experts_backward.default": lambda dtype: _moe_experts_calls(dtype, True),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": lambda dtype: _attention_calls(dtype, True),
}


def calls_of_every_opinfo(dtype: torch.dtype, targets: set[str], per_op: int) -> dict[str, list[Call]]:
    """Every OpInfo's samples of ``dtype``, each run once (forward, and backward where the
    OpInfo differentiates), and the calls of ``targets`` they make: at most ``per_op`` each."""
    from torch.testing._internal.common_methods_invocations import op_db

    found: dict[str, list[Call]] = {}
    wanted = set(targets)
    for info in op_db:
        if not wanted:
            break
        if dtype not in info.supported_dtypes("cpu"):
            continue
        grad = (dtype.is_floating_point or dtype.is_complex) and info.supports_autograd
        for call in _run_samples(info, dtype, grad, wanted, count=4):
            calls = found.setdefault(call.target, [])
            if len(calls) < per_op:
                calls.append(call)
            if len(calls) >= per_op:
                wanted.discard(call.target)
    return found


def schema_calls(op, dtypes=(torch.float64, torch.int64, torch.bool)) -> list[Call]:
    """A call of an elementwise op made from its schema alone, for ops no OpInfo reaches: the
    first tensor argument of shape (4, 6), the others broadcast against it, each number 3
    (2.5 where the op takes a float); the first dtype the op accepts."""
    torch.manual_seed(0)
    for dtype in dtypes:
        for other in [(6,), (4, 1), (4, 6)]:
            args = _schema_args(op._schema, dtype, other)
            if args is None:
                return []
            try:
                out = op(*args)
            except Exception:  # the op rejects this dtype or these shapes: try the next
                continue
            return [Call(str(op), _detached(tuple(args)), {}, _detached(out))]
    return []


def _schema_args(schema, dtype: torch.dtype, other: tuple) -> list | None:
    args, tensors = [], 0
    for argument in schema.arguments:
        kind = str(argument.type)
        if argument.kwarg_only or (argument.has_default_value() and "Tensor" not in kind):
            break
        if kind in ("Tensor", "Optional[Tensor]"):
            args.append(_random((4, 6) if tensors == 0 else other, dtype))
            tensors += 1
        elif kind in ("number", "float", "Optional[number]"):
            args.append(True if dtype == torch.bool else 2.5 if dtype.is_floating_point and kind != "int" else 3)
        elif kind == "int":
            args.append(3)
        else:
            return None
    return args


def _random(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(1, 6, shape, dtype=dtype)
    return torch.randn(shape, dtype=dtype)
