"""A custom op (torch.library) taught to autopar with register_rule.

    python examples/custom_op.py

``scaled_silu(x, scale) = scale * x * sigmoid(x)`` is a kernel autopar has never seen, so
without help it falls back to replication (and the plan says so). Its forward and its
backward (another custom op) are elementwise, so ``pointwise()`` rules describe them: any
dim may be split, and the solver then keeps the MLP sharded through them. ``validate_rule``
runs every strategy the rules offer on simulated ranks against the ops on whole tensors. For the JAX
backend, each op also gets a JAX translation (register_jax_translation), which the emitted
module carries.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

import autopar
from autopar.ops.kinds import pointwise


@torch.library.custom_op("autopar_examples::scaled_silu", mutates_args=())
def scaled_silu(x: torch.Tensor, scale: float) -> torch.Tensor:
    return scale * x * torch.sigmoid(x)


@scaled_silu.register_fake
def _(x, scale):
    return torch.empty_like(x)


@torch.library.custom_op("autopar_examples::scaled_silu_backward", mutates_args=())
def scaled_silu_backward(grad: torch.Tensor, x: torch.Tensor, scale: float) -> torch.Tensor:
    s = torch.sigmoid(x)
    return grad * scale * s * (1 + x * (1 - s))


@scaled_silu_backward.register_fake
def _(grad, x, scale):
    return torch.empty_like(x)


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return scaled_silu_backward(grad, x, ctx.scale), None


def _save(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


scaled_silu.register_autograd(_backward, setup_context=_save)


def register_rules() -> None:
    """Both ops are elementwise; the backward is linear in its gradient (a partial sum may flow
    through it)."""
    autopar.register_rule(torch.ops.autopar_examples.scaled_silu.default, pointwise())
    autopar.register_rule(torch.ops.autopar_examples.scaled_silu_backward.default, pointwise(linear="first"))


def jax_scaled_silu(x, scale):
    from jax.nn import sigmoid  # here, not at the top: the example runs without JAX installed

    return scale * x * sigmoid(x)


def jax_scaled_silu_backward(grad, x, scale):
    from jax.nn import sigmoid

    s = sigmoid(x)
    return grad * scale * s * (1 + x * (1 - s))


def register_jax_translations() -> None:
    """What the JAX program computes for each op (plain functions of JAX arrays)."""
    autopar.register_jax_translation(torch.ops.autopar_examples.scaled_silu.default, jax_scaled_silu)
    autopar.register_jax_translation(torch.ops.autopar_examples.scaled_silu_backward.default,
                                     jax_scaled_silu_backward)


class SiluMLP(nn.Module):
    def __init__(self, width: int = 256, hidden: int = 1024):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x, y):
        return F.mse_loss(self.down(scaled_silu(self.up(x), 1.5)), y)


def make(batch: int = 64, width: int = 1024, hidden: int = 4096):
    torch.manual_seed(0)
    return SiluMLP(width, hidden), (torch.randn(batch, width), torch.randn(batch, width))


def main() -> None:
    model, inputs = make()
    before = autopar.plan(model, inputs, mesh="tp=4", cache=False)
    print(f"without a rule: fallback ops {list(before.fallback_ops)}, up.weight {before.param_spec('up.weight')}")
    register_rules()
    x = torch.randn(8, 6, dtype=torch.float64)
    print(autopar.validate_rule(torch.ops.autopar_examples.scaled_silu.default, [((x, 1.5), {})]))
    print(autopar.validate_rule(torch.ops.autopar_examples.scaled_silu_backward.default,
                                [((torch.randn_like(x), x, 1.5), {})]))
    after = autopar.plan(model, inputs, mesh="tp=4", cache=False)
    print(f"with the rules: fallback ops {list(after.fallback_ops)}, up.weight {after.param_spec('up.weight')}")
    print(autopar.check(model, inputs, plan=after))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
