"""Mixed precision: the policy a plan is made under.

Modelled on FSDP2's ``MixedPrecisionPolicy``: the parameters stay in float32 (the master
weights the optimizer updates, so its state is float32 too); the forward runs under
``torch.autocast`` with ``compute`` as its low-precision dtype, which casts each parameter
down where an op uses it; each gradient comes back to float32 through that cast's backward
and is summed across ranks in ``reduce``. float16's narrow range needs loss scaling
(``torch.amp.GradScaler``); bfloat16 has float32's range and needs none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from autopar.errors import AutoparError

_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
           "fp32": "float32", "float32": "float32"}
LOW_PRECISION = ("bfloat16", "float16")
PRESETS = {"bf16-mixed": ("bfloat16", "float32"), "fp16-mixed": ("float16", "float32")}


@dataclass(frozen=True)
class MixedPrecision:
    """``compute``: the dtype autocast runs matmuls and convolutions in ("bf16" or "fp16");
    ``reduce``: the dtype gradients are summed across ranks in ("fp32", or the compute dtype,
    which halves the bytes a gradient reduction moves at the cost of its precision)."""
    compute: str = "bfloat16"
    reduce: str = "float32"

    def __post_init__(self):
        compute, reduce = _dtype_name(self.compute, "compute"), _dtype_name(self.reduce, "reduce")
        if compute not in LOW_PRECISION:
            raise AutoparError(f"MixedPrecision(compute={self.compute!r}): compute in 'bf16' or 'fp16'")
        if reduce not in (compute, "float32"):
            raise AutoparError(f"MixedPrecision(reduce={self.reduce!r}): gradients are reduced in 'fp32' or in the "
                               f"compute dtype ({compute})")
        object.__setattr__(self, "compute", compute)
        object.__setattr__(self, "reduce", reduce)

    @property
    def compute_dtype(self) -> torch.dtype:
        return getattr(torch, self.compute)

    @property
    def reduces_in_float32(self) -> bool:
        return self.reduce == "float32"

    def __str__(self) -> str:
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
        text = f"{short[self.compute]}-mixed"
        return text if self.reduces_in_float32 else f"{text} (gradients reduced in {short[self.reduce]})"


def parse_precision(precision) -> MixedPrecision | None:
    """None (the model's own dtypes), "bf16-mixed", "fp16-mixed" or a MixedPrecision."""
    if precision is None or isinstance(precision, MixedPrecision):
        return precision
    if isinstance(precision, str) and precision in PRESETS:
        compute, reduce = PRESETS[precision]
        return MixedPrecision(compute, reduce)
    raise AutoparError(f"unknown precision {precision!r}: use None (the model's own dtypes), "
                       f"{', '.join(map(repr, PRESETS))}, or autopar.MixedPrecision(compute=..., reduce=...)")


def _dtype_name(value, field: str) -> str:
    name = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value
    if name not in _DTYPES:
        raise AutoparError(f"MixedPrecision({field}={value!r}): use 'bf16', 'fp16' or 'fp32'")
    return _DTYPES[name]
