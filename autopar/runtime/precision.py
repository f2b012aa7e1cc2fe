"""Mixed precision at run time (autopar.ir.precision says what a plan's policy is).

A mixed-precision program holds autocast's casts as ops, so autocast must stay out of it
(it would cast again, by its own policy); a call under an autocast the plan was not made
for is refused rather than run in other dtypes than the caller asked for.

float16 needs loss scaling, and torch's GradScaler skips a step whose gradients hold an inf
or a NaN. Each rank sees only its own blocks of a sharded gradient, so one rank may find an
overflow that another does not, and the two would take different steps: agree_on_overflow
makes every rank see one when any rank has one.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from autopar.errors import AutoparError


@contextlib.contextmanager
def autocast_off(device: torch.device):
    """No autocast on the CPU nor on ``device`` (a program's casts are its own)."""
    with contextlib.ExitStack() as stack:
        for device_type in dict.fromkeys(("cpu", device.type)):
            stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def check_autocast(planned: str | None, device: torch.device) -> None:
    """Refuse a call under a torch.autocast that the plan's precision (``planned``: the dtype the
    step was captured under, None for the model's own dtypes) does not match."""
    for device_type in dict.fromkeys(("cpu", device.type)):
        if not torch.is_autocast_enabled(device_type):
            continue
        dtype = str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")
        if dtype == planned:
            continue
        wanted = {"bfloat16": "bf16-mixed", "float16": "fp16-mixed"}.get(dtype, repr(dtype))
        planned_as = "in the model's own dtypes" if planned is None else f"under autocast to {planned}"
        raise AutoparError(f"the model is called under torch.autocast({device_type!r}, dtype=torch.{dtype}), but its "
                           f"programs were planned {planned_as} and hold their casts themselves: pass "
                           f"precision={wanted!r} to autopar.autoparallelize and call the model without autocast")


def agree_on_overflow(grads: list[torch.Tensor], device: torch.device) -> None:
    """Where any rank's gradient blocks hold an inf or a NaN, fill every rank's with NaN, so
    that every rank's GradScaler skips the step and lowers its scale alike."""
    finite = torch.ones((), device=device)
    for grad in grads:
        finite = finite * torch.isfinite(grad).all()
    dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    if not bool(finite.item()):
        for grad in grads:
            grad.fill_(float("nan"))
