"""The training state as DTensors: parameters, gradients and optimizer state in the plan's
layouts, so torch's optimizers, clip_grad_norm_ and state dicts work as they do for FSDP2 and
tensor parallelism (gloo, against eager)."""
import copy
import io

import pytest
import torch

from autopar.check import compare
from autopar.runtime.local_cluster import get_cluster
from examples import gpt2, mlp
from tests import workers


def _run(job, model, *args, world=4):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return get_cluster(world).run(job, buffer.getvalue(), *args)


@pytest.mark.parametrize("optimizer,foreach,model_name", [
    ("adamw", True, "gpt2"), ("adamw", False, "mlp"), ("sgd", True, "mlp")])
def test_dtensor_parameters_train_with_torch_optimizers_and_global_clipping(optimizer, foreach, model_name):
    """Parameters and gradients are DTensors with the plan's placements; clip_grad_norm_ returns
    the global norm (a local norm would be smaller on a sharded model); three clipped steps of
    AdamW or SGD with momentum, foreach or not, give eager's losses and parameters."""
    if model_name == "gpt2":
        model, batch = gpt2.make("tiny")
    else:
        model, batch = mlp.make(batch=8, width=64, hidden=128)
    results = _run(workers.train_dtensor_state, model, batch, "dp=2,tp=2", optimizer, foreach)
    want = workers.train_clipped(copy.deepcopy(model), batch, optimizer, foreach)
    assert want["norms"][0] > 0.1  # the clip bites
    for got in results:
        assert got["dtensors"] and got["sharded"] > 0
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-4)
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
        for name, value in want["params"].items():  # the project's fp32 tolerance (autopar.check)
            assert compare(name, got["params"][name], value).ok, name


def test_an_optimizer_built_on_the_parameters_before_sharding_is_refused():
    """Sharding replaces each parameter by a DTensor: an optimizer holding the old ones would
    step tensors that get no gradient, silently."""
    model, batch = mlp.make(batch=8, width=64, hidden=128)
    for message in _run(workers.step_an_optimizer_built_too_early, model, batch, "dp=2,tp=2"):
        assert message is not None and "built on parameters that autopar has since replaced" in message
        assert "fc1.weight" in message
