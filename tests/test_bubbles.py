"""K-FAC's work planned into a pipeline's bubbles (autopar.planning.bubbles) and run on gloo
against an independent single-process K-FAC (tests/kfac_reference.py): loss and parameters
after three steps, every placed piece where its dependencies allow."""
from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import autopar
from autopar.errors import AutoparError
from autopar.ir.bubbles import FACTOR, INVERT, PRECONDITION, REDUCE, TAIL
from autopar.runtime.local_cluster import get_cluster
from examples import gpt2
from tests import workers
from tests.kfac_reference import reference_kfac

SETTINGS = dict(lr=0.05, momentum=0.9, damping=1e-2, factor_decay=0.9, kl_clip=1e-2)


class DeepTanh(nn.Module):
    """A deep tanh regression: a chain of layers, each a unit of the pipeline."""

    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return ((x - y) ** 2).mean()


def _deep():
    torch.manual_seed(0)
    return DeepTanh(), (torch.randn(8, 3, 16), torch.randn(8, 3, 16))


def _kfac_plan(model, inputs, mesh, schedule, inv_every=None, microbatches=4):
    return autopar.plan(model, inputs, mesh=mesh, schedule=schedule, microbatches=microbatches, optimizer="kfac",
                        inv_every=inv_every, hardware=workers.FAST)


def _run(model, inputs, plan, steps=3):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    ranks = get_cluster(plan.device_mesh.size).run(workers.train_kfac, buffer.getvalue(), inputs, plan.to_json(),
                                                   steps, SETTINGS)
    params = {}
    for r in ranks:
        params.update(r["params"])
    return ranks[0]["losses"], params, ranks


def _reference(model, inputs, plan, steps=3):
    fill = plan.pipeline.fill
    phases = {(w.layers[0].removesuffix(".weight"), w.microbatch): w.phase for w in fill.work if w.kind == FACTOR}
    return reference_kfac(model, inputs, steps, plan.pipeline.microbatches,
                          [w.removesuffix(".weight") for w in fill.layers], refresh=fill.refresh,
                          factor_phase=phases, **SETTINGS)


def _assert_matches(model, inputs, plan):
    losses, params, ranks = _run(model, inputs, plan)
    want_losses, want_params = _reference(model, inputs, plan)
    assert all(r["losses"] == losses for r in ranks)  # every rank reports the batch's loss
    assert losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert set(params) == set(want_params)
    for name, value in want_params.items():
        torch.testing.assert_close(params[name], value, rtol=2e-4, atol=2e-5, msg=name)
    moved = max(float((want_params[n] - p.detach()).abs().max()) for n, p in model.named_parameters())
    assert moved > 1e-3  # the steps changed the weights: the comparison is not of untouched values


def test_kfac_on_two_stages_equals_the_single_process_reference():
    model, inputs = _deep()
    plan = _kfac_plan(model, inputs, "pp=2", "1F1B", inv_every=1)
    assert plan.pipeline.fill.refresh == 1
    _assert_matches(model, inputs, plan)


def test_kfac_refreshed_every_second_step_on_data_parallel_stages_equals_the_reference():
    """pp=2,dp=2 under a zero-bubble schedule: factors averaged over the stage's devices, a
    cycle of two steps whose factors are computed in either step, as the plan placed them."""
    model, inputs = _deep()
    plan = _kfac_plan(model, inputs, "pp=2,dp=2", "ZBVZeroBubble", inv_every=2)
    fill = plan.pipeline.fill
    assert fill.refresh == 2 and any(w.kind == REDUCE for w in fill.work)
    _assert_matches(model, inputs, plan)


def test_kfac_on_a_gpt2_style_decoder_equals_the_reference():
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=64, seq=8, layers=2, heads=2, width=32, batch=8))
    plan = _kfac_plan(model, inputs, "pp=2", "InterleavedZeroBubble", inv_every=1)
    fill = plan.pipeline.fill
    assert {"blocks.0.attn.q.weight", "blocks.1.fc.weight", "head.weight"} <= set(fill.layers)
    assert "wte.weight" in fill.first_order and "blocks.0.fc.bias" in fill.first_order
    _assert_matches(model, inputs, plan)
