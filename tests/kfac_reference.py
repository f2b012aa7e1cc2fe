"""A single-process, eager, plain-PyTorch reference K-FAC: the oracle a distributed pipelined K-FAC is checked against.

K-FAC as in Martens & Grosse (2015), with factored Tikhonov damping (their section 6.3) and the KL-based step clipping
of Ba et al. (2017). It is deliberately written from the definition alone, without anything from ``autopar``, so that
a bug shared by the two implementations cannot hide. The semantics it pins down (the project's stated definition):

* every step runs one forward and backward of the whole batch; for each listed ``nn.Linear`` the input ``a`` and the
  output gradient ``g = dL/dz`` are captured and flattened to ``[N, features]`` (N = every row of the batch);
* the output gradient is scaled to ``N * g`` (the per-row gradient of the per-row loss, for a loss that is a mean);
* dim 0 of the inputs is cut into ``microbatches`` equal consecutive parts, i.e. contiguous blocks of N/m rows, and
  each (layer, micro-batch) whose phase ``factor_phase.get((layer, k), 0)`` equals ``t % refresh`` contributes
  ``A_k = a_k^T a_k / n_k`` and ``G_k = g_k^T g_k / n_k`` to its layer's cycle accumulator;
* at the end of a cycle the mean contribution feeds an exponential moving average (the first cycle sets it), and the
  damped inverses are recomputed in float64;
* every step a layer with inverses gets ``P = G_inv @ grad @ A_inv``, the whole set of such P is scaled by the KL
  clip factor, and one ``torch.optim.SGD`` step (momentum and weight decay included) applies it.
"""

import copy
import math

import torch
from torch import nn

__all__ = ["reference_kfac", "kfac_factors_one_step"]


def _linear(model: nn.Module, name: str) -> nn.Linear:
    """The named submodule, insisting it is an ``nn.Linear`` (the only layer kind the definition covers)."""
    module = model.get_submodule(name)
    if not isinstance(module, nn.Linear):
        raise TypeError(f"K-FAC layer {name!r} is a {type(module).__name__}, not an nn.Linear")
    return module


def _forward_backward(model: nn.Module, inputs: tuple, layers: list[str]):
    """One forward and backward of the whole batch; returns the loss and each layer's flattened (a, g).

    The gradients of the model's parameters are left in ``.grad`` for the caller. A layer must run exactly once per
    forward and feed the loss: a second call or a missing gradient would make (a, g) ambiguous, so both raise.
    """
    captured: dict[str, dict[str, torch.Tensor]] = {name: {} for name in layers}
    handles = []

    def make_hook(name: str):
        def forward_hook(module, args, output):
            slot = captured[name]
            if "a" in slot:
                raise RuntimeError(f"K-FAC layer {name!r} ran more than once in one forward")
            slot["a"] = args[0].detach().reshape(-1, module.in_features)

            def grad_hook(grad):
                slot["g"] = grad.detach().reshape(-1, module.out_features)

            output.register_hook(grad_hook)

        return forward_hook

    for name in layers:
        handles.append(_linear(model, name).register_forward_hook(make_hook(name)))
    try:
        loss = model(*inputs)
        if loss.dim() != 0:
            raise ValueError(f"the model must return a scalar loss, got shape {tuple(loss.shape)}")
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()

    out = {}
    for name in layers:
        slot = captured[name]
        if "a" not in slot or "g" not in slot:
            raise RuntimeError(f"K-FAC layer {name!r} did not run in the forward or does not reach the loss")
        out[name] = (slot["a"], slot["g"])
    return loss, out


def _batch_size(inputs: tuple) -> int:
    """The batch size: dim 0 of the first tensor input (every input shares it)."""
    for item in inputs:
        if isinstance(item, torch.Tensor) and item.dim() > 0:
            return item.shape[0]
    raise ValueError("no tensor input with a batch dimension")


def _contribution(a: torch.Tensor, g: torch.Tensor, k: int, microbatches: int):
    """Micro-batch k's (A_k, G_k) in float64, with g already scaled by the whole batch's row count N."""
    n_rows = a.shape[0]
    rows = n_rows // microbatches
    a_k = a[k * rows:(k + 1) * rows].double()
    g_k = g[k * rows:(k + 1) * rows].double()
    return a_k.T @ a_k / rows, g_k.T @ g_k / rows


def _check_split(inputs: tuple, captured: dict, microbatches: int) -> None:
    """Equal micro-batches need a batch and a row count that the micro-batch count divides."""
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    batch = _batch_size(inputs)
    if batch % microbatches:
        raise ValueError(f"batch size {batch} is not divisible by {microbatches} micro-batches")
    for name, (a, _) in captured.items():
        if a.shape[0] % batch:
            raise ValueError(f"layer {name!r} has {a.shape[0]} rows, not a multiple of the batch size {batch}")


def _damped_inverses(a_factor: torch.Tensor, g_factor: torch.Tensor, damping: float):
    """Factored Tikhonov damping (Martens & Grosse 2015, section 6.3), in float64.

    pi balances the damping between the factors by their mean eigenvalues (trace / dimension), so the damped
    Kronecker product approximates F + damping * I without favouring either side.
    """
    d_a, d_g = a_factor.shape[0], g_factor.shape[0]
    pi = math.sqrt((torch.trace(a_factor).item() / d_a) / (torch.trace(g_factor).item() / d_g))
    root = math.sqrt(damping)
    eye_a = torch.eye(d_a, dtype=torch.float64, device=a_factor.device)
    eye_g = torch.eye(d_g, dtype=torch.float64, device=g_factor.device)
    return torch.linalg.inv(a_factor + pi * root * eye_a), torch.linalg.inv(g_factor + (root / pi) * eye_g)


def reference_kfac(model: nn.Module, inputs: tuple, steps: int, microbatches: int, layers: list[str], *,
                   lr: float, momentum: float = 0.0, damping: float = 1e-3, factor_decay: float = 0.95,
                   kl_clip: float = 1e-3, refresh: int = 1, factor_phase: dict | None = None,
                   weight_decay: float = 0.0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Runs `steps` training steps on a deep copy of `model` with the same batch `inputs` every step
    (model(*inputs) returns a scalar loss that is a MEAN over rows); returns (each step's loss, the named
    parameters after the last step).

    `factor_phase` maps (layer, micro-batch index) to the step of the refresh cycle (0 .. refresh - 1) on which that
    micro-batch's factor contribution is taken; absent pairs contribute in phase 0.
    """
    if refresh < 1:
        raise ValueError(f"refresh must be >= 1, got {refresh}")
    factor_phase = dict(factor_phase or {})
    for (name, k), phase in factor_phase.items():
        if name not in layers or not 0 <= k < microbatches or not 0 <= phase < refresh:
            raise ValueError(f"factor_phase entry {(name, k)!r}: {phase!r} is out of range")

    model = copy.deepcopy(model)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    modules = {name: _linear(model, name) for name in layers}

    acc_a: dict[str, torch.Tensor] = {}  # cycle accumulators: sums of contributions, float64
    acc_g: dict[str, torch.Tensor] = {}
    acc_count: dict[str, int] = {name: 0 for name in layers}
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # running (A, G), float64
    inverses: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # (A_inv, G_inv), in the weight's dtype

    losses: list[float] = []
    optimizer.zero_grad()
    for step in range(steps):
        phase = step % refresh
        loss, captured = _forward_backward(model, inputs, layers)
        losses.append(float(loss.detach()))
        _check_split(inputs, captured, microbatches)

        # Factor contributions of this phase's (layer, micro-batch) pairs.
        for name in layers:
            a, g = captured[name]
            g_hat = g * a.shape[0]
            for k in range(microbatches):
                if factor_phase.get((name, k), 0) != phase:
                    continue
                a_k, g_k = _contribution(a, g_hat, k, microbatches)
                acc_a[name] = acc_a[name] + a_k if name in acc_a else a_k
                acc_g[name] = acc_g[name] + g_k if name in acc_g else g_k
                acc_count[name] += 1

        # End of a cycle: fold the cycle's mean into the running factors and refresh the inverses.
        if phase == refresh - 1:
            for name in layers:
                count = acc_count[name]
                if count == 0:
                    continue
                mean_a, mean_g = acc_a.pop(name) / count, acc_g.pop(name) / count
                acc_count[name] = 0
                if name in factors:
                    old_a, old_g = factors[name]
                    mean_a = factor_decay * old_a + (1 - factor_decay) * mean_a
                    mean_g = factor_decay * old_g + (1 - factor_decay) * mean_g
                factors[name] = (mean_a, mean_g)
                a_inv, g_inv = _damped_inverses(mean_a, mean_g, damping)
                dtype = modules[name].weight.dtype
                inverses[name] = (a_inv.to(dtype), g_inv.to(dtype))

        # Precondition, clip by the predicted KL change, and take the SGD step.
        preconditioned: dict[str, torch.Tensor] = {}
        inner = 0.0
        for name in layers:
            if name not in inverses:
                continue
            grad = modules[name].weight.grad
            a_inv, g_inv = inverses[name]
            p = g_inv @ grad @ a_inv
            preconditioned[name] = p
            inner += float((p.double() * grad.double()).sum())
        nu = 1.0
        if preconditioned and inner > 0:
            nu = min(1.0, math.sqrt(kl_clip / (lr * lr * inner)))
        for name, p in preconditioned.items():
            modules[name].weight.grad = p * nu
        optimizer.step()
        optimizer.zero_grad()

    return losses, {name: param.detach().clone() for name, param in model.named_parameters()}


def kfac_factors_one_step(model: nn.Module, inputs: tuple, layers: list[str],
                          microbatches: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The step-0 cycle mean (A-bar, G-bar) per layer, float64, with every micro-batch contributing (refresh 1).

    Runs on a deep copy of `model` and takes no optimizer step, so tests can compare factors directly.
    """
    model = copy.deepcopy(model)
    model.train()
    _, captured = _forward_backward(model, inputs, layers)
    _check_split(inputs, captured, microbatches)
    out = {}
    for name in layers:
        a, g = captured[name]
        g_hat = g * a.shape[0]
        parts = [_contribution(a, g_hat, k, microbatches) for k in range(microbatches)]
        out[name] = (sum(p[0] for p in parts) / microbatches, sum(p[1] for p in parts) / microbatches)
    return out
