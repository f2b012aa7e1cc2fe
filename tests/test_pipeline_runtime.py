"""Pipelined plans run under torch.distributed.pipelining's schedules: every schedule and mesh
against eager on gloo (loss and every gradient, three SGD steps), the per-stage programs'
structure, and autoparallelize's pipelined module."""
from __future__ import annotations

import copy
import dataclasses
import io

import pytest
import torch
from torch import nn

import autopar
from autopar.errors import AutoparError
from autopar.lowering.stages import stage_programs
from autopar.runtime.local_cluster import get_cluster
from examples import gpt2
from tests import composition, pipeline_workers, workers
from tests.models import tiny_llama
from tests.tiers import sampled

CONFIG = gpt2.GPT2Config(vocab=256, seq=32, layers=4, heads=4, width=128, batch=8)


def _plan(mesh: str, schedule: str, microbatches: int = 4, model_inputs=None):
    model, inputs = model_inputs or gpt2.make(CONFIG)
    return model, inputs, autopar.plan(model, inputs, mesh=mesh, schedule=schedule, microbatches=microbatches,
                                       hardware=workers.FAST)


DEEPER = gpt2.GPT2Config(vocab=256, seq=32, layers=6, heads=4, width=128, batch=8)  # 8 units: pp=4 x 2 stages


@pytest.mark.parametrize("mesh,schedule", sampled(
    [(mesh, schedule) for mesh in ("pp=2", "pp=4", "pp=2,dp=2", "pp=2,tp=2")
     for schedule in ("GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble")],
    inner_loop=[("pp=2", "GPipe"), ("pp=4", "ZBVZeroBubble"), ("pp=2,dp=2", "1F1B"), ("pp=2,tp=2", "Interleaved1F1B")]))
def test_pipelined_steps_match_eager(mesh, schedule):
    deep = mesh == "pp=4"  # four ranks of two stages each need eight units, eight micro-batches
    model, inputs = gpt2.make(DEEPER if deep else CONFIG)
    _, _, plan = _plan(mesh, schedule, microbatches=8 if deep else 4, model_inputs=(model, inputs))
    assert plan.pipeline.schedule == schedule and plan.device_mesh.size == autopar.Mesh.parse(mesh).size
    if plan.mesh.size > 1:  # the stages' own axes are sharded: their collectives run too
        assert plan.predicted.sharded_flops_fraction > 0.9 and plan.redistributions
    report = autopar.check(model, inputs, plan=plan, steps=3)
    assert report.ok, str(report)
    assert len(report.losses) == 3 and len(report.tensors) == 3 + len(list(model.parameters()))


@pytest.mark.parametrize("mesh,schedule", [("pp=2", "DualPipeV"), ("pp=2,dp=2", "InterleavedZeroBubble")])
def test_the_other_zero_bubble_schedules_match_eager(mesh, schedule):
    model, inputs, plan = _plan(mesh, schedule)
    report = autopar.check(model, inputs, plan=plan, steps=3)
    assert report.ok, str(report)


@pytest.mark.parametrize("mesh,schedule", [("pp=2,dp=2", "1F1B"), ("pp=2,tp=2", "ZBVZeroBubble")])
def test_dropout_in_a_pipeline_draws_eagers_masks(mesh, schedule):
    """Megatron's block (dropout 0.1 on the attention probabilities and after each sublayer):
    each micro-batch takes its rows of the masks eager draws for the whole batch, so the
    pipelined steps equal eager's with dropout on, whichever rank runs which stage when."""
    model, inputs = gpt2.make(dataclasses.replace(CONFIG, megatron=True))
    plan = autopar.plan(model, inputs, mesh=mesh, schedule=schedule, microbatches=4, hardware=workers.FAST)
    assert sum(n.target == "aten.native_dropout.default" for n in plan.graph.nodes) >= 3 * CONFIG.layers
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)


@pytest.mark.slow  # two plans (training and evaluation modes) and four calls on four ranks
def test_evaluation_mode_between_training_steps_runs_its_own_pipeline_equal_to_eager():
    """``model.eval()`` for a validation loss between training steps, as training scripts do:
    the call in evaluation mode (dropout off) runs a plan made in that mode on the same stages
    and parameter layouts, and training resumes in training mode (dropout on, eager's masks)."""
    model, inputs = gpt2.make(dataclasses.replace(CONFIG, megatron=True))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(pipeline_workers.validate_between_steps_pipelined, buffer.getvalue(), inputs,
                             "pp=2,dp=2", 2)
    expected = pipeline_workers.train_then_validate(model, inputs, 2)
    assert expected[0] != expected[1]  # dropout makes the training loss another than evaluation's
    for losses in got:
        assert losses == pytest.approx(expected, rel=1e-5)


def test_a_mixed_precision_pipeline_matches_eager_autocast():
    model, inputs = gpt2.make(CONFIG)
    plan = autopar.plan(model, inputs, mesh="pp=2,dp=2", schedule="1F1B", microbatches=4, hardware=workers.FAST,
                        precision="bf16-mixed")
    report = autopar.check(model, inputs, plan=plan, steps=2)  # at bf16 tolerance (autopar.check)
    assert report.ok and report.tolerance[0] > 1e-3, str(report)


@pytest.mark.slow  # a Hugging Face model end to end
def test_a_hugging_face_llama_pipelines_over_two_stages_of_two_data_parallel_ranks():
    from transformers import LlamaConfig, LlamaForCausalLM

    from examples.hf_zoo import LossOf

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = LossOf(LlamaForCausalLM(cfg))
    ids = torch.randint(0, 128, (8, 16))
    _, _, plan = _plan("pp=2,dp=2", "1F1B", model_inputs=(model, (ids, ids)))
    report = autopar.check(model, (ids, ids), plan=plan, steps=3)
    assert report.ok, str(report)


def test_a_hugging_face_llama_called_with_keywords_pipelines_and_returns_its_output_type():
    """``model(input_ids=ids, labels=ids)`` as Hugging Face is called: the keywords are split into
    micro-batches as positional inputs are, and the output is the model's CausalLMOutputWithPast
    with the batch's loss and its logits, the whole batch's on every rank (check compares them
    with eager's too)."""
    model, kwargs = tiny_llama(heads=4, positions=32)
    plan = autopar.plan(model, kwargs=kwargs, mesh="pp=2,dp=2", schedule="1F1B", microbatches=4,
                        hardware=workers.FAST)
    assert plan.pipeline.microbatches == 4
    report = autopar.check(model, (), kwargs=kwargs, plan=plan, steps=3)
    assert report.ok, str(report)
    assert len(report.losses) == 3
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(pipeline_workers.keyword_call_pipelined, buffer.getvalue(), kwargs, "pp=2,dp=2", "1F1B")
    assert any("logits" in t.name for t in report.tensors), [t.name for t in report.tensors]
    eager = model(**kwargs)
    for r in got:
        assert r["type"] == "CausalLMOutputWithPast" and r["loss"] == pytest.approx(eager.loss.item(), rel=1e-5)
        torch.testing.assert_close(r["logits"], eager.logits.detach(), rtol=1e-4, atol=1e-5)
        assert not any("None" in w for w in r["warned"]), r["warned"]


@pytest.mark.slow  # a Hugging Face model trained three steps on four ranks, per schedule
@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_a_hugging_face_llama_on_pp2_dp2_trains_with_bf16_and_clipping_as_eager_autocast(schedule):
    """A Hugging Face Llama called with keywords on pp=2,dp=2 with bf16-mixed and the whole
    model's gradients clipped, the optimizer built right after autoparallelize: three steps equal
    eager's under autocast (each loss and every parameter after the last step, at the bf16
    tolerance; SGD with momentum, whose step is linear in the gradients: tests/composition.py)."""
    outcome = composition.run_recipe(frozenset({"hf", "pp", "bf16", "clip"}), schedule=schedule, steps=3)
    assert outcome.error is None and not outcome.missing, outcome
    assert outcome.worst <= 1.0, outcome


def test_logits_of_local_batches_come_back_in_the_batchs_row_order():
    """With inputs="local" micro-batch k holds every data-parallel block's k-th part; the logits
    the pipeline returns are put back in the whole batch's order (the blocks one after another),
    equal to eager's on the whole batch."""
    model, kwargs = tiny_llama(heads=4, positions=32)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(pipeline_workers.keyword_call_pipelined, buffer.getvalue(), kwargs, "pp=2,dp=2", "1F1B",
                             "local")
    eager = model(**kwargs)
    for r in got:
        assert r["loss"] == pytest.approx(eager.loss.item(), rel=1e-5)
        torch.testing.assert_close(r["logits"], eager.logits.detach(), rtol=1e-4, atol=1e-5)


class _WithPositions(nn.Module):
    """A model with an input that carries no batch dim: position embeddings indexed by ids of
    shape [1, S], broadcast over the batch."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Embedding(16, 32)
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, 1)

    def forward(self, x, positions, *, target):
        h = x + self.pos(positions)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return nn.functional.mse_loss(self.head(h).squeeze(-1), target)


def test_a_tensor_without_the_batch_dim_reaches_every_micro_batch_whole():
    torch.manual_seed(0)
    model = _WithPositions()
    x, positions, target = torch.randn(8, 16, 32), torch.arange(16).unsqueeze(0), torch.randn(8, 16)
    plan = autopar.plan(model, (x, positions), kwargs={"target": target}, mesh="pp=2", schedule="GPipe",
                        microbatches=4, hardware=workers.FAST)
    # planned on one micro-batch: the batch's rows, the positions whole
    shapes = [plan.graph.node(ph).outputs[0].shape for ph in plan.graph.inputs]
    assert sorted(map(list, shapes)) == [[1, 16], [2, 16], [2, 16, 32]]
    report = autopar.check(model, (x, positions), kwargs={"target": target}, plan=plan, steps=2)
    assert report.ok, str(report)


@pytest.mark.parametrize("mesh,schedule", sampled(
    [("pp=2,tp=2", "1F1B"), ("pp=4", "GPipe"), ("pp=2", "ZBVZeroBubble"), ("pp=2,dp=2", "Interleaved1F1B")],
    inner_loop=[("pp=2,tp=2", "1F1B"), ("pp=2", "ZBVZeroBubble")]))
def test_a_head_tied_to_the_embedding_keeps_one_weight_across_stages(mesh, schedule):
    """The GPT-2-style decoder whose head reads the token embedding's weight: the first and the
    last stage each hold a copy (on one rank under ZBVZeroBubble, whose V puts both there), their
    gradients are summed once per step, and three steps match eager's, so the copies stay one."""
    deep = mesh == "pp=4"
    cfg = dataclasses.replace(DEEPER if deep else CONFIG, tied=True)
    model, inputs = gpt2.make(cfg)
    assert model.head.weight is model.wte.weight
    _, _, plan = _plan(mesh, schedule, microbatches=8 if deep else 4, model_inputs=(model, inputs))
    assert plan.graph.tied == {"head.weight": "wte.weight"}
    assert plan.strategies[_placeholder(plan, "head.weight")].out_specs == \
        plan.strategies[_placeholder(plan, "wte.weight")].out_specs
    report = autopar.check(model, inputs, plan=plan, steps=3)
    assert report.ok, str(report)


@pytest.mark.slow  # a Hugging Face model end to end
def test_hugging_face_gpt2_with_its_tied_head_pipelines_called_with_keywords():
    """Hugging Face's GPT-2 as it is: its head tied to the embedding, dropout 0.1 on the
    embeddings, the attention probabilities and the residuals (eager's masks:
    autopar.runtime.microbatch_dropout), called
    with keywords."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.1,
                     embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False)
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 64, (8, 16))
    kwargs = {"input_ids": ids, "labels": ids}
    plan = autopar.plan(model, kwargs=kwargs, mesh="pp=2,dp=2", schedule="1F1B", microbatches=4,
                        hardware=workers.FAST)
    assert plan.graph.tied == {"lm_head.weight": "transformer.wte.weight"}
    report = autopar.check(model, (), kwargs=kwargs, plan=plan, steps=3)
    assert report.ok, str(report)


def _placeholder(plan, fqn: str) -> str:
    return next(ph for ph, name in plan.graph.params.items() if name == fqn)


# ---- the stage programs -------------------------------------------------------------------------


def test_every_statement_runs_on_one_stage_and_backward_splits_into_input_and_weight_work():
    _, _, plan = _plan("pp=2", "ZBVZeroBubble")
    stages = stage_programs(plan)
    assert len(stages) == 4
    calls = [s.defines for st in stages for s in st.forward + st.backward_input + st.backward_weight
             if s.kind in ("call", "getitem")]
    assert len(calls) == len(set(calls)) == sum(n.op == "call" for n in plan.graph.nodes)
    for st in stages:
        # what goes back to the stage before is computed before the weight gradients
        assert not set(st.grads_out) & {s.defines for s in st.backward_weight}
        # a parameter's gradient is its own stage's
        assert {plan.graph.grads[g] for g in st.gradients} == \
            {plan.graph.params[p] for p in st.placeholders if p in plan.graph.params}
        weight_gradients = [s for s in st.backward_weight if s.kind == "call" and s.node.target == "aten.mm.default"]
        assert weight_gradients or st.index == 0 and not st.gradients
    for before, after in zip(stages, stages[1:]):  # both sides of each boundary agree on it
        assert before.sends == after.receives
        assert len(before.grads_in) == len(after.grads_out)


def test_a_module_run_on_two_stages_and_buffer_updates_are_refused_with_the_reason():
    class Shared(nn.Module):  # one module called by every layer (ALBERT's sharing): one parameter, many stages
        def __init__(self):
            super().__init__()
            self.shared = nn.Linear(16, 16)
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(self.shared(layer(x)))
            return x.square().mean()

    with pytest.raises(AutoparError, match="shared.weight is read by stages"):
        _plan("pp=2", "1F1B", model_inputs=(Shared(), (torch.randn(8, 16),)))[2].emit("torch")

    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16)) for _ in range(4))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.square().mean()

    normed = Normed()
    with pytest.raises(AutoparError, match="updates buffers"):
        _plan("pp=2", "1F1B", model_inputs=(normed, (torch.randn(8, 16),)))[2].emit("torch")


def test_the_emitted_stages_name_their_programs_and_what_crosses():
    _, _, plan = _plan("pp=2", "1F1B")
    source = plan.emit("torch")
    for k in range(2):
        assert f"def forward_{k}(" in source and f"def backward_input_{k}(" in source
        assert f"def backward_weight_{k}(" in source
    assert "# received from stage 0: targets [2, 32]" in source  # the labels pass on to the loss
    with pytest.raises(AutoparError, match="only the torch backend"):
        plan.emit("jax")


# ---- autoparallelize -----------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["global", "local"])
def test_autoparallelize_on_a_pipelined_mesh_trains_as_eager(given):
    """Every rank passes the whole batch, or (inputs="local") its data-parallel block of it."""
    model, inputs = gpt2.make(CONFIG)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(pipeline_workers.train_pipelined, buffer.getvalue(), inputs, "pp=2,dp=2", "1F1B", 2, given)
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    losses, grads = [], {}
    for i in range(2):
        loss = eager(*inputs)
        loss.backward()
        if i == 0:
            grads = {n: p.grad.clone() for n, p in eager.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    (2 * eager(*inputs)).backward()
    doubled = {n: p.grad.clone() for n, p in eager.named_parameters()}
    for rank, r in enumerate(got):
        assert r["losses"] == pytest.approx(losses, rel=1e-5)
        assert r["evaluated"] == pytest.approx(eager(*inputs).item(), rel=1e-5) and r["untouched"]
        stage = rank // 2  # pp first: ranks 0, 1 hold stage 0
        assert r["held"] == sorted(r["grads"]) and all(stage == 0 or n.startswith(("blocks.2", "blocks.3", "ln_f",
                                                                                     "head")) for n in r["held"])
        for name, value in r["grads"].items():
            torch.testing.assert_close(value, grads[name], rtol=1e-4, atol=1e-6, msg=name)
            torch.testing.assert_close(r["doubled"][name], doubled[name], rtol=1e-4, atol=1e-6, msg=name)
    assert set().union(*(r["held"] for r in got)) == set(grads)


@pytest.mark.parametrize("schedule", sampled(["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble"],
                                             inner_loop=["1F1B"]))
def test_clipping_a_pipelined_model_takes_the_whole_models_norm(schedule):
    """torch's own clip_grad_norm_ on a pipelined model's parameters returns eager's norm (every
    stage's gradients, the tied head counted once) and clips every gradient as eager's; so does
    autopar.clip_grad_norm_, for the max norm too."""
    model, inputs = gpt2.make(dataclasses.replace(CONFIG, tied=True))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(pipeline_workers.clipped_pipelined, buffer.getvalue(), inputs, "pp=2,dp=2", schedule)
    eager = copy.deepcopy(model)
    eager(*inputs).backward()
    norm = torch.nn.utils.clip_grad_norm_(eager.parameters(), 0.5).item()
    largest = torch.nn.utils.clip_grad_norm_(eager.parameters(), 1e9, norm_type="inf").item()
    assert norm > 0.5  # so the clipping scales every gradient
    for r in got:
        assert r["norm"] == pytest.approx(norm, rel=1e-5) and r["largest"] == pytest.approx(largest, rel=1e-5)
        for name, grad in r["grads"].items():
            torch.testing.assert_close(grad, dict(eager.named_parameters())[name].grad, rtol=1e-4, atol=1e-6)
    assert {n for r in got for n in r["grads"]} == {n for n, _ in eager.named_parameters()}


def test_calls_under_no_sync_accumulate_their_gradients_as_eager():
    model, inputs, plan = _plan("pp=2,dp=2", "1F1B")
    batches = [inputs, tuple(torch.randint(0, CONFIG.vocab, x.shape) for x in inputs)]
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(pipeline_workers.accumulate_pipelined, buffer.getvalue(), batches, plan.to_json())
    eager = copy.deepcopy(model)
    for batch in batches:
        (eager(*batch) / len(batches)).backward()
    for r in got:
        for name, grad in r.items():
            torch.testing.assert_close(grad, dict(eager.named_parameters())[name].grad, rtol=1e-4, atol=1e-6)
    assert {n for r in got for n in r} == {n for n, _ in eager.named_parameters()}


# four single-GPU nodes on a slow network: a pipeline is among the meshes worth weighing
NODES = dataclasses.replace(workers.FAST, devices_per_node=1, inter_node=autopar.Link(1e9, 1e-5))


@pytest.mark.parametrize("mesh", sampled([4, "auto"], inner_loop=[4]))
def test_autoparallelize_searches_meshes_with_a_pipeline_on_its_first_call(mesh):
    model, inputs = gpt2.make(CONFIG)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(workers.train_searched, buffer.getvalue(), inputs, mesh, NODES, 2)
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        loss = eager(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    planned = autopar.plan(model, inputs, mesh=4, hardware=NODES).device_mesh  # what autopar.plan picks
    for r in got:
        assert r["error"] is None, r["error"]
        assert "pp=2" in r["searched"] and "pp=4" in r["searched"], r["searched"]  # weighed with the rest
        assert r["mesh"] == str(planned) and r["losses"] == pytest.approx(losses, rel=1e-5)


def test_a_searched_mesh_of_another_size_than_the_process_group_is_refused():
    model, inputs = gpt2.make(CONFIG)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(workers.train_searched, buffer.getvalue(), inputs, 8, NODES, 1)
    assert all("mesh=8 searches meshes of 8 devices, but the process group has 4 ranks" in r["error"] for r in got)


def test_micro_batches_with_different_label_counts_are_refused_not_averaged_wrongly():
    model, inputs = gpt2.make(CONFIG)
    _, _, plan = _plan("pp=2", "1F1B", model_inputs=(model, inputs))
    assert stage_programs(plan)[-1].normalizers  # cross entropy's count of labelled targets is watched
    idx, targets = inputs
    padded = targets.clone()
    padded[:2, 16:] = -100  # the first micro-batch has fewer labelled targets than the others
    with pytest.raises(AutoparError, match="different numbers of labelled targets"):
        autopar.check(model, (idx, padded), plan=plan)
    buffer = io.BytesIO()  # an evaluation's loss would be off alike
    torch.save(model, buffer)
    got = get_cluster(2).run(pipeline_workers.evaluate_pipelined, buffer.getvalue(), (idx, padded), "pp=2")
    assert all(r["loss"] is None and "different numbers of labelled targets" in r["error"] for r in got)
