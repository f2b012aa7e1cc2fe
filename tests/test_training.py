"""The emitted step behaves as the model it replaces: calling the module runs the forward
program, ``loss.backward()`` the backward program with its gradient collectives."""
import copy

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
        if form == "model_output":  # imported before tracing, as a Hugging Face model has it
            from transformers.modeling_outputs import CausalLMOutput

            self.output_type = CausalLMOutput

    def forward(self, x, y):
        logits = self.fc(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if self.form == "tuple":
            return logits.sum(-1), loss, logits  # the loss is the first scalar
        if self.form == "dict":
            return {"logits": logits, "loss": loss}
        return self.output_type(loss=loss, logits=logits)


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


class _NestedBatch(torch.nn.Module):
    """Called with a dict batch and keywords; returns the logits, an auxiliary scalar and the loss."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, batch, *, weight, scale=1.0):
        logits = self.fc(batch["x"]) * scale
        loss = (torch.nn.functional.cross_entropy(logits, batch["y"], reduction="none") * weight).mean()
        return logits, logits.pow(2).mean(), loss


def _third(output):
    return output[2]


def _nested_call():
    g = torch.Generator().manual_seed(5)
    batch = {"x": torch.randn(8, 16, generator=g), "y": torch.randint(0, 4, (8,), generator=g)}
    return (batch,), {"weight": torch.rand(8, generator=g), "scale": 0.5}


def test_a_nested_batch_and_keywords_plan_and_loss_fn_picks_the_loss():
    """The call's tensors are the program's inputs, named by their place (batch_x); the float
    keyword is part of the planned call; loss_fn picks the third output where the first scalar
    (the auxiliary term) would have been taken, and only it is differentiated."""
    from autopar.ir.call import flatten_call
    from autopar.runtime.program import check_call_fits

    torch.manual_seed(0)
    model = _NestedBatch()
    args, kwargs = _nested_call()
    plan = autopar.plan(model, args, kwargs=kwargs, loss_fn=_third, mesh="dp=2,tp=2", hardware=workers.FAST,
                        cache=False)
    assert "def forward(rt, fc_weight, fc_bias, batch_x, batch_y, weight):" in plan.emit("torch")
    report = autopar.check(model, args, kwargs=kwargs, loss_fn=_third, plan=plan, steps=2)
    assert report.ok, str(report)
    assert [t.name for t in report.tensors if t.name.startswith("output")] == ["output [0]", "output [1]"]
    check_call_fits(plan, flatten_call(args, kwargs))  # the planned call fits
    with pytest.raises(autopar.PlanMismatchError, match="called with other arguments"):
        check_call_fits(plan, flatten_call(args, {**kwargs, "scale": 2.0}))  # another scale is another program


def test_a_loss_fn_that_computes_a_new_tensor_and_an_object_in_the_call_are_refused():
    torch.manual_seed(0)
    model = _NestedBatch()
    args, kwargs = _nested_call()
    with pytest.raises(autopar.CaptureError, match="loss_fn returned a tensor that is not one of the model's outputs"):
        autopar.plan(model, args, kwargs=kwargs, loss_fn=lambda out: out[2] * 2, mesh="dp=2", cache=False)
    with pytest.raises(autopar.CaptureError, match="called with Generator"):
        autopar.plan(model, args, kwargs={**kwargs, "scale": torch.Generator()}, mesh="dp=2", cache=False)


class _ConvNet(torch.nn.Module):
    """A small CNN with BatchNorm, whose forward updates the running statistics in training mode."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 4)

    def forward(self, x, y):
        features = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        return torch.nn.functional.cross_entropy(self.fc(features), y)


class _DropoutClassifier(torch.nn.Module):
    """Dropout between two layers; returns the logits, with the loss when given the labels."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)

    def forward(self, x, y=None):
        logits = self.fc2(torch.nn.functional.dropout(torch.relu(self.fc1(x)), 0.25, self.training))
        if y is None:
            return {"logits": logits}
        return {"loss": torch.nn.functional.cross_entropy(logits, y), "logits": logits}


def _played(model, script, mesh="dp=2,tp=2", **options):
    """``workers.play`` on an autoparallelized copy of ``model`` on 4 processes (rank 0's result)
    and on an eager copy; the eager results and the model itself are left untouched."""
    import copy
    import io

    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(workers.play_autoparallelized, buffer.getvalue(), script, mesh, options)
    eager = copy.deepcopy(model)
    return got, workers.play(eager, script), eager


def _assert_same(got: list, want: list) -> None:
    for step, (a, b) in enumerate(zip(got, want)):
        assert a["type"] == b["type"], step
        assert set(a["tensors"]) == set(b["tensors"]), step
        for path, value in b["tensors"].items():
            torch.testing.assert_close(a["tensors"][path], value, rtol=1e-4, atol=1e-5, msg=f"step {step} {path}")


def test_batch_norm_running_statistics_are_written_back_as_eager_updates_them():
    """BatchNorm's forward updates its running statistics (it used to be refused, and before that
    returned a buffer as the "loss"): each rank writes them back, equal to eager's after three
    steps, and evaluation (before training, and after) reads them. The plan may split BatchNorm's
    channels but never its batch or spatial dims in training, so its statistics are those of
    the whole batch, as eager's."""
    torch.manual_seed(0)
    model = _ConvNet()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, 10, 10, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]
    # the first call in evaluation mode: the training step is planned first all the same
    script = [("eval", batches[0], {})] + [("train", batch, {}) for batch in batches] + [("eval", batches[0], {})]
    got, want, eager = _played(model, script)
    for rank in got:
        assert rank["error"] is None, rank["error"]
        _assert_same(rank["results"], want)
        for name, value in eager.named_buffers():
            torch.testing.assert_close(rank["buffers"][name], value, rtol=1e-5, atol=1e-6, msg=name)
        assert rank["programs"] == [("forward", False), ("step", True)]
    assert eager.bn.num_batches_tracked.item() == 3 and not torch.equal(eager.bn.running_mean, model.bn.running_mean)
    plan = autopar.plan(model, batches[0], mesh="dp=2,tp=2", hardware=workers.FAST, cache=False)
    norms = [n.name for n in plan.graph.nodes if "batch_norm" in n.target]
    for n in norms:
        x = plan.strategies[n].in_specs[0]  # the activations (grad_output, for the backward)
        assert not x.has_partial() and set(x.sharded_dims()) <= {1}, (n, x)
    assert norms


def test_a_model_with_dropout_trains_after_a_first_no_grad_call_and_evaluates_as_eager():
    """The first call, under no_grad, plans the training step (which lays the parameters out),
    then runs a forward program in training mode (dropout on, as eager's); evaluation gets its
    own forward program in eval mode (no dropout); training resumes after it. Every output, the
    logits included, equals eager's."""
    torch.manual_seed(0)
    model = _DropoutClassifier()
    g = torch.Generator().manual_seed(2)
    batch = (torch.randn(8, 32, generator=g), torch.randint(0, 8, (8,), generator=g))
    script = [("no_grad", batch, {}), ("train", batch, {}), ("train", batch, {}), ("eval", batch, {}),
              ("train", batch, {}), ("eval", batch, {})]
    got, want, _ = _played(model, script)
    for rank in got:
        assert rank["error"] is None, rank["error"]
        _assert_same(rank["results"], want)
        # no_grad ran a forward program in training mode; the second eval reused its program
        assert rank["programs"] == [("forward", False), ("forward", True), ("step", True)]
    assert not torch.equal(want[0]["tensors"]["['logits']"], want[3]["tensors"]["['logits']"])  # dropout mattered


def test_a_first_call_without_a_loss_lays_the_parameters_out_for_its_forward_and_says_so():
    """Evaluation without labels first: no training step can be planned from that call, so its
    forward program sets the layouts, with a warning; the training call after it is planned
    around them and equals eager."""
    torch.manual_seed(0)
    model = _DropoutClassifier()
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(8, 32, generator=g), torch.randint(0, 8, (8,), generator=g)
    script = [("eval", (x,), {}), ("train", (x, y), {}), ("eval", (x,), {})]
    got, want, _ = _played(model, script)
    for rank in got:
        assert rank["error"] is None, rank["error"]
        _assert_same(rank["results"], want)
        assert rank["programs"] == [("forward", False), ("step", True)]
    assert any("holds no loss" in message for message, _ in got[0]["warnings"])


def test_a_new_batch_size_is_planned_and_with_replan_false_refused():
    """A call with another batch size gets its own plan (the parameters stay where the first plan
    put them) and equals eager; with replan=False it is refused, naming both shapes."""
    model, (x, y) = mlp.make(batch=8, width=64, hidden=128)
    script = [("train", (x, y), {}), ("train", (x[:4], y[:4]), {}), ("train", (x, y), {})]
    got, want, _ = _played(model, script)
    for rank in got:
        assert rank["error"] is None, rank["error"]
        _assert_same(rank["results"], want)
        assert rank["programs"] == [("step", True), ("step", True)]
    refused, _, _ = _played(model, script, replan=False)
    for rank in refused:
        assert "input 'x' has shape [4, 64]" in rank["error"] and "made for shape [8, 64]" in rank["error"]


def test_hugging_face_gpt2_trains_called_with_keywords_and_no_wrapper():
    """GPT2LMHeadModel(input_ids=..., labels=...) under autoparallelize, as it is: the loss is the
    ModelOutput's, the logits come back (as DTensors) equal to eager's, and its KV cache, which
    the programs do not return, comes back as None."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(3))
    script = [("train", (), {"input_ids": ids, "labels": ids})] * 3
    got, want, _ = _played(model, script)
    for rank in got:
        assert rank["error"] is None, rank["error"]
        _assert_same(rank["results"], want)
        cache = [w for w in rank["warnings"] if "DynamicCache" in w[0]]
        assert len(cache) == 1 and cache[0][1].endswith("workers.py")  # once, at the line that called the model
    assert want[0]["type"] == "CausalLMOutputWithCrossAttentions" and "['logits']" in want[0]["tensors"]
    assert want[0]["tensors"]["['loss']"] > want[2]["tensors"]["['loss']"]  # it trained


def test_hugging_face_llama_called_with_keywords_checks_equal_to_eager():
    """LlamaForCausalLM(input_ids=..., labels=...) on dp=2,tp=2, no wrapper: loss over three steps,
    every gradient and the logits equal eager's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                         max_position_embeddings=32))
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(4))
    report = autopar.check(model, kwargs={"input_ids": ids, "labels": ids}, mesh="dp=2,tp=2", hardware=workers.FAST,
                           steps=3)
    assert report.ok, str(report)
    assert [t.name for t in report.tensors if t.name.startswith("output")] == ["output ['logits']"]
    assert sum(t.name.startswith("grad ") for t in report.tensors) == len(list(model.parameters()))


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


class _FrozenNorm(torch.nn.Module):
    """A BatchNorm kept in evaluation mode (frozen statistics) inside a model that trains."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.out = torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)
        self.bn.running_mean.fill_(0.5)
        self.bn.eval()

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.out(self.bn(self.fc(x))), y)


def test_submodule_modes_and_frozen_parameters_select_the_program():
    """A BatchNorm left in eval mode inside a training model runs as eager runs it (its running
    statistics, not the batch's; the first plan left it in eval mode on every rank); training in eval mode
    with gradients enabled is a training step; a parameter frozen at first and unfrozen later
    gets its gradient from a step planned for it."""
    torch.manual_seed(0)
    model = _FrozenNorm()
    g = torch.Generator().manual_seed(7)
    batch = (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))
    script = [("requires_grad", ("fc.weight", False), {}), ("train", batch, {}), ("train", batch, {}),
              ("requires_grad", ("fc.weight", True), {}), ("train", batch, {}), ("train_in_eval", batch, {})]
    got, want, eager = _played(model, script)
    for rank in got:
        assert rank["error"] is None, rank["error"]
        _assert_same(rank["results"], want)
        for name, value in eager.named_buffers():  # the frozen statistics stayed as they were
            torch.testing.assert_close(rank["buffers"][name], value, msg=name)
        assert [kind for kind, _ in rank["programs"]] == ["step", "step", "step"]  # frozen, unfrozen, eval mode
    assert eager.bn.running_mean[0].item() == 0.5  # eval-mode BatchNorm never updated its statistics


class _StepScale(torch.nn.Module):
    """A buffer read for the gradient (through a copy) and then updated in place by forward."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.register_buffer("scale", torch.ones(16))

    def forward(self, x, y):
        h = self.fc(x) * self.scale.clone()
        self.scale.mul_(0.5)
        return torch.nn.functional.mse_loss(h, y), self.scale


def test_backward_reads_a_buffer_as_it_was_before_forward_updated_it():
    """Recomputing the copy in backward reads the buffer itself, which the runtime has updated by
    then: backward is given the value from before the update (the gradients were half of eager's).
    The updated buffer, returned by forward too, comes back as a value."""
    torch.manual_seed(0)
    model = _StepScale()
    inputs = (torch.randn(8, 16), torch.randn(8, 16))
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=workers.FAST, recompute="full", cache=False)
    backward = plan.emit("torch").split("def backward", 1)[1]
    assert "(scale" in backward or "scale)" in backward or "scale," in backward  # backward reads the buffer
    report = autopar.check(model, inputs, plan=plan, steps=3)
    assert report.ok, str(report)


def test_a_buffer_reassigned_in_forward_and_layer_outputs_of_copied_layers_are_not_lost():
    """Assigning a new tensor to a buffer is refused (the graph does not carry it); a model that
    returns each of its repeated layers' outputs is traced in full, not from five copied layers."""
    from autopar.capture import capture

    class Reassigns(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x):
            self.scale = self.scale * 0.5
            return (self.fc(x) * self.scale).sum()

    with pytest.raises(autopar.CaptureError, match="assigns a new tensor to buffer scale"):
        capture(Reassigns(), (torch.randn(2, 4),))

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(10))

        def forward(self, x):
            hidden = []
            for layer in self.layers:
                x = torch.tanh(layer(x))
                hidden.append(x)
            return x.pow(2).mean(), tuple(hidden)

    program = capture(Stack(), (torch.randn(4, 8),))
    assert program.expanded_from is None and len(program.values) == 10


def test_a_forward_alone_takes_an_integer_scalar_for_a_value_not_a_loss():
    """An evaluation forward that returns the logits and a count of correct answers (an integer
    scalar): no loss, two values. A training step refuses the count as its loss."""
    from autopar.capture import capture

    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 3)

        def forward(self, x, y):
            logits = self.fc(x)
            return logits, (logits.argmax(-1) == y).sum()

    inputs = (torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))
    program = capture(Counts().eval(), inputs, training_step=False)
    assert program.loss is None and len(program.values) == 2
    with pytest.raises(autopar.CaptureError, match="finds no loss"):
        capture(Counts(), inputs)


def test_a_synchronous_collective_never_waits_behind_a_gradient_sync():
    """Gradient syncs run on process groups of their own (as DDP's buckets run apart from the
    model's collectives): an all-gather completes while a sync it was issued after still waits."""
    results = get_cluster(2).run(workers.synchronous_collective_while_a_gradient_sync_waits)
    assert results == [([0, 1], [3.0] * 4), ([0, 1], [3.0] * 4)]


def test_rank_meshes_of_one_mesh_share_their_process_groups():
    """Each process group holds threads and sockets until its process ends: a process that builds
    many modules on one mesh (a worker pool, a notebook, eval plans) keeps one set."""
    for got in get_cluster(2).run(workers.process_groups_of_rank_meshes):
        assert got == {"same": True, "threads unchanged": True, "distinct": True, "summed": 3.0}


def test_a_dropped_autoparallelized_model_is_collected():
    assert get_cluster(2).run(workers.an_autoparallelized_model_once_dropped) == [True, True]


def test_a_process_destroys_its_meshes_process_groups_before_the_interpreter_finalizes():
    """Process groups destroyed during finalization join gloo threads that may still be freeing
    a finished collective's tensor: they take the GIL there, and the process aborts after all its
    output ("terminate called without an active exception"). At exit, the groups autopar made
    are destroyed while the interpreter runs: the last exit handler sees no gloo thread left."""
    import json
    import subprocess
    import sys

    probe = """
import atexit, json, os
def gloo_threads():
    names = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    return sum(name == "pt_gloo_runloop" for name in names)
atexit.register(lambda: print(json.dumps({"at exit": gloo_threads()})))  # registered first: runs last
import torch, torch.distributed as dist
import autopar
from autopar.runtime.rank_mesh import RankMesh
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
RankMesh(autopar.Mesh.of(dp=1)).all_reduce(torch.ones(2), "dp")
print(json.dumps({"running": gloo_threads()}))
dist.destroy_process_group()
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    counts = {k: v for line in done.stdout.splitlines() for k, v in json.loads(line).items()}
    assert counts["running"] >= 2  # the world's group and the mesh's, two threads each
    assert counts["at exit"] == 0, counts


def test_an_all_reduce_at_its_inputs_last_read_reuses_its_memory_only_where_nothing_else_reads_it():
    for rank, got in enumerate(get_cluster(2).run(workers.all_reduces_at_their_inputs_last_read)):
        assert got["in place"] and got["reduced"] == [3.0] * 4
        assert got["view"] == [rank + 1.0] * 3 and got["kept"] == [rank + 1.0] * 4


@pytest.mark.parametrize("bucket_bytes", [1, 2**30])
def test_gradient_syncs_go_out_in_buckets_and_still_equal_eager(bucket_bytes):
    """The dp plan's gradient all-reduces go out as DDP's buckets do: one collective per bucket
    (here all in one, or each in its own), with eager's loss and gradients."""
    import io

    from autopar.check import compare

    model, batch = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.baselines(model, batch, devices=2, hardware=workers.FAST, tp_degrees=[])["dp"]
    syncs = [r for r in plan.redistributions if r.is_async]
    assert len(syncs) >= 2
    buffer = io.BytesIO()
    torch.save(model, buffer)
    results = get_cluster(2).run(workers.step_counting_gradient_buckets, buffer.getvalue(), batch, plan.to_json(),
                                 bucket_bytes)
    eager = copy.deepcopy(model)
    loss = eager(*batch)
    loss.backward()
    for got in results:
        assert got["buckets"] == (len(syncs) if bucket_bytes == 1 else 1)
        assert got["loss"] == pytest.approx(loss.item(), rel=1e-6)
        for name, p in eager.named_parameters():
            assert compare(name, got["grads"][name], p.grad).ok, name


def test_a_bucket_buffer_is_reused_only_once_no_gradient_from_it_is_read():
    """Gradients handed out from a bucket's buffer may live in ``.grad`` past the step (accumulated
    over two backwards): the next bucket takes a new buffer then, and reuses one once they are gone."""
    import io

    model, batch = mlp.make(batch=8, width=64, hidden=128)
    plan = autopar.baselines(model, batch, devices=2, hardware=workers.FAST, tp_degrees=[])["dp"]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    g = torch.Generator().manual_seed(1)
    batches = [batch] + [tuple(torch.randn(x.shape, generator=g) for x in batch) for _ in range(2)]
    results = get_cluster(2).run(workers.bucket_buffers_over_three_backwards, buffer.getvalue(), batches,
                                 plan.to_json())
    eager = copy.deepcopy(model)
    eager(*batches[0]).backward()  # two batches of other gradients: a buffer reused too early shows
    eager(*batches[1]).backward()
    for got in results:
        for name, p in eager.named_parameters():
            torch.testing.assert_close(got["summed"][name], p.grad, rtol=1e-5, atol=1e-6, msg=name)
        assert got["buffers"] == [1, 2, 2]
