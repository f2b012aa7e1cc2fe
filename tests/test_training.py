"""The emitted step behaves as the model it replaces: calling the module runs the forward
program, ``loss.backward()`` the backward program with its gradient collectives."""

import autopar
from autopar.runtime.local_cluster import get_cluster
from examples import mlp
from tests import workers


def test_the_call_runs_forward_only_and_backward_runs_on_loss_backward():
    model, inputs = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=workers.FAST, cache=False)
    forward = sum(r.step_bytes[i] for r, i in plan.collectives("forward"))
    everything = sum(r.step_bytes[i] for r, i in plan.collectives())
    assert 0 < forward < everything  # the plan moves data in both programs

    results = get_cluster(4).run(workers.forward_then_backward, plan.to_json(), inputs)
    eager_loss = model(*inputs).item()  # gradients against eager: tests/test_equivalence.py
    for got in results:
        assert got["forward_bytes"] == forward  # the call ran the forward program alone
        assert all(g is None for g in got["grads_after_forward"])
        assert got["step_bytes"] == everything  # backward ran, gradient syncs included
        assert abs(got["loss"] - eager_loss) <= 1e-5 * abs(eager_loss)
        assert "ran for this loss already" in got["second_backward"]
        # under no_grad: the forward program only, and nothing to differentiate
        assert got["no_grad_bytes"] == forward and not got["no_grad_requires_grad"]
        assert got["no_grad_loss"] == got["loss"]


def test_inputs_of_another_shape_are_refused_naming_both_shapes():
    """mse_loss divides by the planned element count: a batch of 4 on a plan of 8 used to
    return a wrong loss (half of eager's)."""
    model, inputs = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=workers.FAST, cache=False)
    smaller = tuple(t[:4] for t in inputs)
    for got in get_cluster(4).run(workers.call_with_other_batch, plan.to_json(), smaller):
        assert got["error"] is not None, got
        assert "input 'x' has shape [4, 64]" in got["error"] and "made for shape [8, 64]" in got["error"]
