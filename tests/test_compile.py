"""compile=True: the emitted programs through torch.compile (Inductor), their collectives
functional (autopar.runtime.traced_collectives) so that communication stays inside the graph."""
import dataclasses
import io
import re

import pytest
import torch

import autopar
from autopar.check import compare, train
from autopar.runtime.local_cluster import get_cluster
from examples import gpt2
from tests import workers

SMALL = gpt2.GPT2Config(vocab=384, seq=48, layers=2, heads=4, width=128, batch=4)


def test_functional_collectives_equal_the_eager_runtimes():
    for rank_results in get_cluster(2).run(workers.functional_and_eager_collectives):
        for name, (eager, functional) in rank_results.items():
            torch.testing.assert_close(functional, eager, msg=name)


@pytest.mark.slow  # torch.compile of a decoder on four ranks
def test_a_compiled_decoder_on_dp2_tp2_equals_eager_in_one_graph_per_program(tmp_path):
    """Equal to eager, with one graph per program, and compiled once for the host: the four
    ranks' graphs are the same (process groups named by axis, coordinates read from tensors),
    so one rank compiles each and the other three load it from Inductor's cache."""
    model, inputs = gpt2.make(SMALL)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=workers.FAST)
    source = plan.emit("torch")
    kinds = set(re.findall(r"rt\.(\w+)\(", source))
    # every kind of collective the programs call, on both axes: the graphs hold communication
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "start_all_reduce"} <= kinds, kinds
    buffer = io.BytesIO()
    torch.save(model, buffer)
    steps = 2
    results = get_cluster(4).run(workers.compiled_training_steps, buffer.getvalue(), inputs, plan.to_json(), steps,
                                 str(tmp_path / "inductor"))  # an empty cache: every graph is met first here
    eager_losses, eager_grads, _ = train(model, lambda: model(*inputs), steps, lr=0.1)  # grads of the first step
    for got in results:
        assert got["graph_breaks"] == {} and got["graphs"] == 2, (got["graph_breaks"], got["graphs"])
        assert got["losses"] == pytest.approx(eager_losses, rel=1e-5)
        for name, want in eager_grads.items():
            assert compare(name, got["grads"][name], want).ok, name
    compiled = [(got["inductor_compiles"], got["inductor_cache_hits"]) for got in results]
    assert sum(c for c, _ in compiled) == 2 and sum(h for _, h in compiled) == 6, compiled  # forward, backward


def test_compile_is_refused_for_the_jax_backend():
    model, inputs = gpt2.make("tiny")
    with pytest.raises(ValueError, match="compile=True compiles the torch programs"):
        autopar.check(model, inputs, mesh="dp=2", backend="jax", compile=True)


@pytest.mark.slow  # torch.compile of a Hugging Face model on four ranks, twice
@pytest.mark.filterwarnings("ignore:the sharding solver did not prove")
def test_a_compiled_bf16_llama_on_dp2_tp2_equals_eager_autocast():
    """compile=True with precision="bf16-mixed" on tensor parallelism, through autopar.check and
    through the one-liner called with keywords: eager's losses and gradients under autocast,
    within the bf16 tolerance."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, use_cache=False)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 128, (8, 16))
    labels = ids.clone()
    labels[:, :4] = -100  # unlabelled positions: the loss's integer masks run in the compiled graph
    kwargs = {"input_ids": ids, "labels": labels}
    # one plan for both runs; the layout's optimality does not matter here, so a short solve (by
    # work, not time: the same plan on a loaded machine)
    plan = autopar.plan(model, kwargs=kwargs, mesh="dp=2,tp=2", hardware=workers.FAST, precision="bf16-mixed",
                        solver_work_limit=2000)
    report = autopar.check(model, (), kwargs=kwargs, plan=plan, compile=True, steps=2)
    assert report.ok and report.tolerance[0] > 1e-3, str(report)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    got = get_cluster(4).run(workers.train_compiled_mixed, buffer.getvalue(), kwargs, plan.to_json(), 2)
    def forward_under_autocast():  # backward and the step outside it, as autocast is meant to be used
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(**kwargs)

    eager_losses, _, _ = train(model, forward_under_autocast, 2, lr=0.1)
    for r in got:
        assert r["losses"] == pytest.approx(eager_losses, rel=report.tolerance[0])


@pytest.mark.slow  # torch.compile of every stage program on four ranks
def test_a_compiled_pipeline_on_pp2_dp2_equals_eager():
    """compile=True on a pipelined plan: each stage's forward, input-gradient and
    weight-gradient programs run compiled under torch's 1F1B schedule (two micro-batches: the
    weight gradients kept local, then synced), equal to eager: loss and every gradient. Its
    dropout (Megatron's block: 0.1) draws eager's masks from the compiled programs too (a
    graph break at each draw)."""
    model, inputs = gpt2.make(dataclasses.replace(SMALL, megatron=True))
    plan = autopar.plan(model, inputs, mesh="pp=2,dp=2", schedule="1F1B", microbatches=2, hardware=workers.FAST)
    report = autopar.check(model, inputs, plan=plan, steps=1, compile=True)
    assert report.ok, str(report)
