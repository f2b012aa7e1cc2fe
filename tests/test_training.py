"""The emitted step behaves as the model it replaces: calling the module runs the forward
program, ``loss.backward()`` the backward program with its gradient collectives."""
import pytest
import torch

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


class _Outputs(torch.nn.Module):
    """A linear classifier returning its loss with the logits, in one of three forms."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.fc = torch.nn.Linear(32, 16)

    def forward(self, x, y):
        logits = self.fc(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if self.form == "tuple":
            return logits.sum(-1), loss, logits  # the loss is the first scalar
        if self.form == "dict":
            return {"logits": logits, "loss": loss}
        from transformers.modeling_outputs import CausalLMOutput

        return CausalLMOutput(loss=loss, logits=logits)


@pytest.mark.parametrize("form", ["tuple", "dict", "model_output"])
def test_a_model_returning_more_than_its_loss_gets_its_losss_gradients(form):
    """Capture used to differentiate every output (the gradients of loss + logits.sum())."""
    torch.manual_seed(0)
    model, inputs = _Outputs(form), (torch.randn(8, 32), torch.randint(0, 16, (8,)))
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=workers.FAST, cache=False)
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)
    assert sum(t.name.startswith("grad ") for t in report.tensors) == 2


def test_a_model_without_a_loss_is_refused_saying_what_to_return():
    class NoLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return {"logits": self.fc(x)}

    with pytest.raises(autopar.CaptureError, match="without a 'loss' \\(keys: logits\\)"):
        autopar.plan(NoLoss(), (torch.randn(2, 4),), mesh="dp=2", cache=False)


def test_a_forward_that_updates_running_statistics_is_refused():
    """BatchNorm's running statistics used to come out as the step's "loss"."""
    class ConvNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2)

        def forward(self, x, y):
            features = torch.relu(self.bn(self.conv(x))).mean((2, 3))
            return torch.nn.functional.cross_entropy(self.fc(features), y)

    inputs = (torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(autopar.CaptureError, match="updates bn.running_mean, bn.running_var"):
        autopar.plan(ConvNet(), inputs, mesh="dp=2", cache=False)


def test_a_first_call_under_no_grad_still_plans_a_training_step_and_eval_mode_is_refused():
    model, inputs = mlp.make(batch=8, width=64, hidden=128)
    with torch.no_grad():
        plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=workers.FAST, cache=False)
    assert sorted(plan.graph.grads.values()) == sorted(n for n, _ in model.named_parameters())
    for got in get_cluster(4).run(workers.call_in_eval_mode, plan.to_json(), inputs):
        assert "captured in training mode and the model is now in evaluation mode" in got["error"]


def _data_parallel(model, inputs):
    """Parameters replicated, the batch split over dp=4: every gradient all-reduced."""
    from autopar.capture import capture

    batch = {ph: "S(0)" for ph in capture(model, inputs).user_inputs}
    params = {name: "R" for name, _ in model.named_parameters()}
    return autopar.plan(model, inputs, mesh="dp=4", hardware=workers.FAST, pin={**params, **batch}, cache=False)


@pytest.mark.parametrize("layout", ["dp", "solver's dp=2,tp=2"])
@pytest.mark.parametrize("count", [2, 4])
def test_no_sync_accumulates_micro_batches_and_syncs_once(layout, count):
    """Data parallel (gradients synced at the end of backward) and the solver's own 2-D layout
    (a gradient sync started mid-backward): accumulated under no_sync() they equal eager's
    accumulation, with one sync."""
    from autopar.runtime.rank_mesh import local_shard

    model, inputs = mlp.make(batch=4, width=64, hidden=128)
    if layout == "dp":
        plan = _data_parallel(model, inputs)
    else:
        plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=workers.FAST, cache=False)
        assert any(r.is_async for r in plan.redistributions)
    sync_bytes = sum(r.step_bytes[i] for r, i in plan.collectives() if r.consumers == ("output",))
    assert sync_bytes > 0
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)) for _ in range(count)]
    eager_losses = []
    for batch in batches:  # eager accumulation: the gradient of the micro-batches' mean loss
        loss = model(*batch) / count
        loss.backward()
        eager_losses.append(loss.item())
    cluster = get_cluster(4)
    synced_every_time = cluster.run(workers.accumulate_micro_batches, plan.to_json(), batches, False)
    deferred = cluster.run(workers.accumulate_micro_batches, plan.to_json(), batches, True)
    for every, got in zip(synced_every_time, deferred):
        assert got["losses"] == pytest.approx(eager_losses, rel=1e-5)
        for ph, fqn in plan.graph.params.items():
            want = local_shard(dict(model.named_parameters())[fqn].grad, plan.out_spec(ph), plan.mesh, got["coords"])
            torch.testing.assert_close(got["grads"][fqn], want, rtol=1e-4, atol=1e-6)
        assert got["unsynced"] == 0  # the synced backward took every deferred gradient
        # the same work but the deferred gradient collectives: one sync instead of one per micro-batch
        assert got["bytes"] == every["bytes"] - (count - 1) * sync_bytes


def test_no_sync_is_refused_where_backward_reads_a_synced_gradient():
    """A gradient's move to its parameter's layout that a backward op also reads cannot be
    deferred: the backward program refuses sync=False before doing anything."""
    import dataclasses
    import types

    model, inputs = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=workers.FAST, cache=False)
    sync = next(r for r in plan.redistributions if r.consumers == ("output",))
    shared = dataclasses.replace(sync, consumers=("some_backward_op", "output"))
    plan = dataclasses.replace(plan, redistributions=tuple(shared if r is sync else r for r in plan.redistributions))
    program = types.ModuleType("shared_sync")
    exec(plan.emit("torch"), program.__dict__)
    placeholders = [None] * len(program.PLACEHOLDERS)
    with pytest.raises(RuntimeError, match=f"cannot defer the gradient sync of {plan.graph.grads[sync.value]}"):
        program.backward(None, *placeholders, [], None, False, {})
