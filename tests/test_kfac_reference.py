"""Checks the reference K-FAC (tests/kfac_reference.py) against independent math.

The reference is the oracle for the distributed K-FAC, so its own correctness is pinned here from first principles:
the Kronecker-factored solve, the factor definitions, the micro-batch split, and the limits where K-FAC must reduce to
(a rescaled) SGD.
"""

import copy
import math

import pytest
import torch
from torch import nn

from tests.kfac_reference import kfac_factors_one_step, reference_kfac


class LinearRegression(nn.Module):
    """One bias-free nn.Linear under a mean squared error: the smallest model with one K-FAC layer."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.fc = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x, y):
        return ((self.fc(x) - y) ** 2).mean()


class MLP(nn.Module):
    """Linear-tanh-Linear under a mean squared error over every (sample, position) row."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int):
        super().__init__()
        self.l1 = nn.Linear(d_in, d_hidden)
        self.l2 = nn.Linear(d_hidden, d_out)

    def hidden(self, x):
        return torch.tanh(self.l1(x))

    def forward(self, x, y):
        return ((self.l2(self.hidden(x)) - y) ** 2).mean()


def _mlp_case(dtype=torch.float64, batch=6, seq=4):
    """A seeded MLP and a [batch, seq, features] batch, so flattening leading dims is exercised."""
    torch.manual_seed(0)
    model = MLP(5, 7, 3).to(dtype)
    x = torch.randn(batch, seq, 5, dtype=dtype)
    y = torch.randn(batch, seq, 3, dtype=dtype)
    return model, (x, y)


def _grads(model: nn.Module, inputs: tuple) -> dict[str, torch.Tensor]:
    """The plain gradients of the mean loss, computed on a copy so the caller's model stays untouched."""
    model = copy.deepcopy(model)
    loss = model(*inputs)
    names, params = zip(*model.named_parameters())
    return dict(zip(names, torch.autograd.grad(loss, params)))


def _damped(a_factor: torch.Tensor, g_factor: torch.Tensor, damping: float):
    """The damped factors A + pi*sqrt(d)*I and G + sqrt(d)/pi*I, written out again from Martens & Grosse 6.3."""
    d_a, d_g = a_factor.shape[0], g_factor.shape[0]
    pi = math.sqrt((a_factor.trace() / d_a).item() / (g_factor.trace() / d_g).item())
    root = math.sqrt(damping)
    return (a_factor + pi * root * torch.eye(d_a, dtype=a_factor.dtype),
            g_factor + root / pi * torch.eye(d_g, dtype=g_factor.dtype))


def _vec(matrix: torch.Tensor) -> torch.Tensor:
    """Column-major vec: the columns stacked, the convention under which (A kron G) vec(X) = vec(G X A^T)."""
    return matrix.T.reshape(-1)


def _cosine(u: torch.Tensor, v: torch.Tensor) -> float:
    return float((u * v).sum() / (u.norm() * v.norm()))


def test_preconditioning_matches_explicit_kronecker_solve():
    """One K-FAC step on a single layer moves W by lr * (A_d kron G_d)^-1 vec(grad): the factored inverse
    G_inv @ grad @ A_inv is exactly the solve with the full Kronecker matrix the method approximates F by."""
    torch.manual_seed(1)
    model = LinearRegression(4, 3).double()
    x, y = torch.randn(10, 4, dtype=torch.float64), torch.randn(10, 3, dtype=torch.float64)
    lr, damping = 0.1, 1e-2

    _, after = reference_kfac(model, (x, y), steps=1, microbatches=2, layers=["fc"], lr=lr, damping=damping,
                              kl_clip=1e30)
    step = (model.fc.weight.detach() - after["fc.weight"]) / lr

    a_factor, g_factor = kfac_factors_one_step(model, (x, y), ["fc"], microbatches=2)["fc"]
    a_damped, g_damped = _damped(a_factor, g_factor, damping)
    grad = _grads(model, (x, y))["fc.weight"]
    expected = torch.linalg.solve(torch.kron(a_damped, g_damped), _vec(grad))

    torch.testing.assert_close(_vec(step), expected, rtol=1e-9, atol=1e-12)
    # Preconditioning has to matter here, otherwise the comparison above could not tell K-FAC from SGD.
    assert _cosine(step, grad) < 0.99


def test_kl_clip_scales_the_preconditioned_step():
    """With a small kl_clip the step is nu * P with nu = sqrt(kl_clip / (lr^2 <P, grad>)) < 1 (Ba et al. 2017)."""
    torch.manual_seed(2)
    model = LinearRegression(4, 3).double()
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)
    lr, damping, kl_clip = 0.5, 1e-2, 1e-6

    _, free = reference_kfac(model, (x, y), steps=1, microbatches=1, layers=["fc"], lr=lr, damping=damping,
                             kl_clip=1e30)
    _, clipped = reference_kfac(model, (x, y), steps=1, microbatches=1, layers=["fc"], lr=lr, damping=damping,
                                kl_clip=kl_clip)
    w0 = model.fc.weight.detach()
    p = (w0 - free["fc.weight"]) / lr
    grad = _grads(model, (x, y))["fc.weight"]
    nu = math.sqrt(kl_clip / (lr ** 2 * float((p * grad).sum())))
    assert nu < 1
    torch.testing.assert_close((w0 - clipped["fc.weight"]) / lr, nu * p, rtol=1e-9, atol=1e-12)


def test_first_layer_a_is_input_covariance():
    """A of the first layer is x^T x / N over the flattened [batch*seq, in] input rows."""
    model, (x, y) = _mlp_case()
    a_factor, _ = kfac_factors_one_step(model, (x, y), ["l1", "l2"], microbatches=1)["l1"]
    rows = x.reshape(-1, x.shape[-1])
    torch.testing.assert_close(a_factor, rows.T @ rows / rows.shape[0], rtol=1e-12, atol=1e-12)


def test_last_layer_g_is_scaled_output_gradient_covariance():
    """G of the last layer is (N dL/dz)^T (N dL/dz) / N: the covariance of per-row gradients of a mean loss."""
    model, (x, y) = _mlp_case()
    _, g_factor = kfac_factors_one_step(model, (x, y), ["l1", "l2"], microbatches=1)["l2"]

    z = model.l2(model.hidden(x))
    loss = ((z - y) ** 2).mean()
    (dz,) = torch.autograd.grad(loss, z)
    rows = dz.reshape(-1, dz.shape[-1])
    n = rows.shape[0]
    scaled = n * rows
    torch.testing.assert_close(g_factor, scaled.T @ scaled / n, rtol=1e-12, atol=1e-12)
    # The per-row loss is the mean squared error over the row's d_out outputs, whose gradient is 2 (z - y) / d_out;
    # the scaling by N must recover exactly that, independently of how many rows the batch has.
    d_out = z.shape[-1]
    torch.testing.assert_close(scaled, 2 * (z - y).detach().reshape(-1, d_out) / d_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("microbatches", [2, 3, 6])
def test_microbatch_split_keeps_the_cycle_mean(microbatches):
    """The mean of equal-size micro-batches' factors equals the whole-batch factor, for A and for G."""
    model, inputs = _mlp_case()
    whole = kfac_factors_one_step(model, inputs, ["l1", "l2"], microbatches=1)
    split = kfac_factors_one_step(model, inputs, ["l1", "l2"], microbatches=microbatches)
    for name in ("l1", "l2"):
        for got, want in zip(split[name], whole[name]):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_uneven_microbatches_are_rejected():
    """A batch the micro-batch count does not divide has no equal split, so the reference refuses it."""
    model, inputs = _mlp_case()
    with pytest.raises(ValueError, match="divisible"):
        kfac_factors_one_step(model, inputs, ["l1"], microbatches=4)


def test_huge_damping_reduces_to_the_gradient_direction():
    """With damping 1e8 both damped factors are nearly multiples of I, so each layer's step is parallel to its
    gradient; with ordinary damping the curvature must visibly turn the step, or the limit proves nothing."""
    model, inputs = _mlp_case()
    grads = _grads(model, inputs)
    start = dict(model.named_parameters())
    lr = 1.0

    _, damped = reference_kfac(model, inputs, steps=1, microbatches=2, layers=["l1", "l2"], lr=lr, damping=1e8,
                               kl_clip=1e30)
    _, normal = reference_kfac(model, inputs, steps=1, microbatches=2, layers=["l1", "l2"], lr=lr, damping=1e-3,
                               kl_clip=1e30)
    cosines = {}
    for name in ("l1.weight", "l2.weight"):
        assert _cosine(start[name].detach() - damped[name], grads[name]) > 0.9999
        cosines[name] = _cosine(start[name].detach() - normal[name], grads[name])
    assert min(cosines.values()) < 0.99, cosines


def test_refresh_two_first_step_is_plain_sgd():
    """Before the first cycle of refresh=2 ends no layer has inverses, so step 0 is exactly torch.optim.SGD
    (momentum and weight decay included); with refresh=1 the same step is preconditioned and differs."""
    model, inputs = _mlp_case(dtype=torch.float32)
    kwargs = dict(lr=0.05, momentum=0.9, weight_decay=1e-2)

    losses, after = reference_kfac(model, inputs, steps=1, microbatches=2, layers=["l1", "l2"], refresh=2, **kwargs)

    sgd_model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(sgd_model.parameters(), **kwargs)
    loss = sgd_model(*inputs)
    loss.backward()
    optimizer.step()
    assert losses == [pytest.approx(loss.item(), rel=1e-6)]
    for name, param in sgd_model.named_parameters():
        torch.testing.assert_close(after[name], param.detach(), rtol=0, atol=0)

    _, refreshed = reference_kfac(model, inputs, steps=1, microbatches=2, layers=["l1", "l2"], refresh=1, **kwargs)
    assert not torch.allclose(refreshed["l1.weight"], after["l1.weight"])
    # Biases are never preconditioned, so they follow SGD either way.
    torch.testing.assert_close(refreshed["l1.bias"], after["l1.bias"], rtol=0, atol=0)


def test_training_reduces_loss_and_leaves_model_untouched():
    """Several K-FAC steps with refresh and split phases lower the loss, and the caller's model is not modified
    (the reference runs on a deep copy)."""
    model, inputs = _mlp_case()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    phases = {("l1", 1): 1, ("l2", 0): 1}
    losses, _ = reference_kfac(model, inputs, steps=8, microbatches=2, layers=["l1", "l2"], lr=0.1, refresh=2,
                               factor_phase=phases, kl_clip=1e-2)
    assert len(losses) == 8
    assert losses[-1] < losses[0]
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name])
        assert p.grad is None
