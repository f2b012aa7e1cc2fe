"""Hugging Face transformers models (random init, small configs) planned sharded and
checked against eager. Mixtral's routing ops still fall back to replication (listed)."""
import pytest

import autopar
from examples import hf_zoo

pytest.importorskip("transformers", reason="transformers is a test dependency: pip install -e '.[test]'")

SHARDED = ["gpt2", "llama", "mistral", "bert", "vit"]


@pytest.mark.parametrize("name", SHARDED + ["mixtral"])
def test_zoo_model_on_dp2_matches_eager(name, fast_network):
    model, inputs = hf_zoo.make(name)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network)
    if name in SHARDED:
        assert plan.fallback_ops == (), plan.fallback_ops
    assert plan.sharded_flops_fraction > 0.5
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", SHARDED)
def test_zoo_model_on_dp2_tp2_matches_eager(name, fast_network):
    model, inputs = hf_zoo.make(name)
    # SCIP proves these optimal in 10-55 s on 2 cores (llama and mistral are the slow ones)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network, solver_time_limit_s=180)
    assert plan.fallback_ops == ()
    assert plan.sharded_flops_fraction > 0.9
    assert any(s.kind != "shard" and plan.mesh.axis_names[s.axis] == "tp"
               for r in plan.redistributions for s in r.steps)  # the tp axis is really used
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)


def test_mixtral_fallbacks_are_listed_in_the_summary():
    model, inputs = hf_zoo.make("mixtral")
    plan = autopar.plan(model, inputs, mesh="dp=2")
    assert "aten.topk.default" in plan.fallback_ops
    assert "aten.topk.default x2" in plan.summary()


@pytest.mark.parametrize("mesh", ["tp=2", "dp=2,tp=2"])
@pytest.mark.parametrize("name", SHARDED)
def test_zoo_plans_shard_where_it_pays(name, mesh):
    """At GPU-sized widths (planned on the meta device) the H100 plan splits nearly all FLOPs
    and is much faster than one device in the same cost model."""
    import torch

    with torch.device("meta"):
        model, inputs = hf_zoo.make(name, **hf_zoo.sizes(name))
    plan = autopar.plan(model, inputs, mesh=mesh, hardware="h100-sxm", solver_time_limit_s=180)
    single = autopar.plan(model, inputs, mesh="dp=1", hardware="h100-sxm")
    assert plan.fallback_ops == ()
    assert plan.sharded_flops_fraction >= 0.9
    assert single.sharded_flops_fraction == 0.0
    assert plan.predicted.step_time_s < 0.8 * single.predicted.step_time_s
