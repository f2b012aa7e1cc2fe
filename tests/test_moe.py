"""Mixture-of-experts layers: capture puts one op in place of each Hugging Face experts module,
equal to it; expert parallelism (tokens sent to their experts' ranks by all-to-all, dropless)
equals the model on one device in training, also when routing crowds one expert; DCP saves and
resumes it; the JAX backend runs the op and refuses expert parallelism by name."""
import copy
import io
import re

import pytest
import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralExperts

import autopar
from autopar.baseline_plans import ExpertLayout
from autopar.capture.export import capture
from autopar.check import compare
from autopar.errors import AutoparError
from autopar.ops.moe import ALL_TO_ALL_FORWARD, KERNEL_OPS, OF_RANK_FORWARD, expert_axis
from autopar.runtime.local_cluster import get_cluster
from examples import hf_zoo
from tests import moe_workers, state_workers
from tests.moe_workers import expert_parallel_axes, no_expert_parallelism
from tests.test_extend import Constrain
from tests.tiers import sampled
from tests.workers import FAST

MODELS = {"mixtral": hf_zoo.mixtral, "qwen2_moe": hf_zoo.qwen2_moe, "deepseek_v3": hf_zoo.deepseek_v3}


def _model(name):
    torch.manual_seed(0)
    return MODELS[name]()


def test_the_experts_op_and_its_backward_equal_hugging_face_experts():
    torch.manual_seed(0)
    layer = MixtralExperts(MixtralConfig(hidden_size=8, intermediate_size=12, num_local_experts=8))
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x, index, weights, _, _, grad = moe_workers.routed_layer(crowded=3)
    x, weights = x.requires_grad_(), weights.requires_grad_()
    operands = (x, weights, layer.gate_up_proj, layer.down_proj)
    want = layer(x, index, weights)
    got = torch.ops.autopar.moe_experts(x, index, weights, layer.gate_up_proj, layer.down_proj)
    torch.testing.assert_close(got, want)
    for g, w in zip(torch.autograd.grad(got, operands, grad), torch.autograd.grad(want, operands, grad)):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_capture_makes_each_experts_module_one_op(name):
    model, batch = _model(name)
    layers = sum(type(m).__name__.endswith("Experts") for m in model.modules())
    targets = [str(n.target) for n in capture(model, batch).gm.graph.nodes]
    assert targets.count("autopar.moe_experts.default") == layers > 0
    assert targets.count("autopar.moe_experts_backward.default") == layers
    assert not any("grouped_mm" in t for t in targets)


def test_an_experts_module_the_op_does_not_compute_is_captured_op_by_op():
    """A module whose gate is its own (here GELU-gated) keeps its forward: the op would compute SwiGLU."""
    model, batch = _model("mixtral")
    for m in model.modules():
        if isinstance(m, MixtralExperts):
            m._apply_gate = lambda gate_up: torch.nn.functional.gelu(gate_up.chunk(2, -1)[0]) * gate_up.chunk(2, -1)[1]
    assert not any("moe_experts" in str(n.target) for n in capture(model, batch).gm.graph.nodes)


@pytest.mark.parametrize("crowded", [pytest.param(None, marks=pytest.mark.slow), 5],
                         ids=["random routing", "one expert crowded"])
def test_expert_parallel_all_to_all_equals_the_layer_on_one_device(crowded):
    results = get_cluster(4).run(moe_workers.expert_parallel_layer, crowded)
    for r in results:
        for got, want in zip(r["got"], r["want"]):
            torch.testing.assert_close(got, want)
    received = [r["pairs received"] for r in results]
    if crowded is not None:  # the crowded expert's rank gets more than its share: dropless, still equal
        assert max(received) >= 2 * min(received), received


def _run(job, model, *args):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return get_cluster(4).run(job, buffer.getvalue(), *args)


_KERNEL = {"routed": ALL_TO_ALL_FORWARD, "whole": OF_RANK_FORWARD}  # the forward kernel of each dispatch


def _kernel_call(tokens: str) -> str:
    """How the emitted program calls the experts kernel of a dispatch."""
    return f"{_KERNEL[tokens]}(rt, "


# the two dispatches: the tokens routed to their experts by all-to-all over ep; over tp, where
# tensor parallelism leaves every rank all tokens (split over dp), each rank's experts' share
_DISPATCH = {"ep=4": ExpertLayout("ep", tokens="routed"), "dp=2,tp=2": ExpertLayout("tp", tokens="whole")}


@pytest.mark.parametrize("name,mesh", sampled(
    [(name, mesh) for name in sorted(MODELS) for mesh in ("ep=4", "dp=2,tp=2")],
    inner_loop=[("mixtral", "ep=4"), ("deepseek_v3", "ep=4"), ("qwen2_moe", "dp=2,tp=2")]))
def test_expert_parallel_training_equals_eager(name, mesh):
    """Three clipped AdamW steps on DTensor parameters, the experts split over a mesh axis, the
    tokens routed by all-to-all (ep=4) or whole on the axis (dp=2,tp=2): eager's losses, norms
    and parameters."""
    model, batch = _model(name)
    dispatch = _DISPATCH[mesh]
    plan = autopar.plan(model, batch, mesh=mesh, hardware=FAST, passes=[dispatch])
    assert expert_parallel_axes(plan) == {dispatch.axis}, plan.summary()
    assert _kernel_call(dispatch.tokens) in plan.emit(), plan.summary()
    results = _run(state_workers.train_dtensor_state, model, batch, mesh, "adamw", True, [dispatch])
    want = state_workers.train_clipped(copy.deepcopy(model), batch, "adamw", True)
    for got in results:
        assert got["dtensors"] and got["sharded"] > 0
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-4)
        for param, value in want["params"].items():
            assert compare(param, got["params"][param], value).ok, param


def test_expert_parallelism_is_dropless_when_routing_crowds_one_expert():
    """Every token the same: each layer sends all of them to the same two experts' ranks."""
    model, (ids, labels) = _model("mixtral")
    same = torch.full_like(ids, 7)
    plan = autopar.plan(model, (same, same), mesh="ep=4", hardware=FAST, passes=[ExpertLayout("ep", tokens="routed")])
    assert expert_parallel_axes(plan) == {"ep"} and _kernel_call("routed") in plan.emit()
    report = autopar.check(model, (same, same), plan=plan, steps=2)
    assert report.ok, str(report)


def test_experts_split_inside_pipeline_stages_train_as_eager():
    """Two stages of two ranks each, each stage's experts split over its pair, the tokens routed
    by all-to-all: what a stage sends is made contiguous (a stage may end on a view, and torch's
    sends take none)."""
    model, batch = _model("mixtral")
    plan = autopar.plan(model, batch, mesh="pp=2,ep=2", hardware=FAST, microbatches=2,
                        passes=[ExpertLayout("ep", tokens="routed")])
    assert expert_parallel_axes(plan) == {"ep"} and _kernel_call("routed") in plan.emit(), plan.summary()
    report = autopar.check(model, batch, plan=plan, steps=2)
    assert report.ok, str(report)


@pytest.mark.slow  # a 4-rank pipeline of Mixtral under autocast
def test_experts_split_inside_bf16_pipeline_stages_train_within_bf16_tolerance():
    """Each stage's pair holds every token and runs its experts' share (the other dispatch than
    the float32 pipeline's)."""
    model, batch = _model("mixtral")
    plan = autopar.plan(model, batch, mesh="pp=2,ep=2", hardware=FAST, microbatches=2, precision="bf16-mixed",
                        passes=[ExpertLayout("ep", tokens="whole")])
    assert expert_parallel_axes(plan) == {"ep"} and _kernel_call("whole") in plan.emit(), plan.summary()
    assert plan.graph.autocast == "bfloat16"
    report = autopar.check(model, batch, plan=plan, steps=2)
    assert report.ok, str(report)


@pytest.mark.slow  # a 4-rank run of Mixtral under autocast
def test_expert_parallel_bf16_training_is_within_bf16_tolerance():
    model, batch = _model("mixtral")
    plan = autopar.plan(model, batch, mesh="ep=4", hardware=FAST, precision="bf16-mixed")
    assert expert_parallel_axes(plan) == {"ep"}
    report = autopar.check(model, batch, plan=plan, steps=2)
    assert report.ok, str(report)


@pytest.mark.slow  # two 4-rank runs of Mixtral
def test_an_expert_parallel_checkpoint_resumes_bit_equal_and_loads_whole(tmp_path):
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, batch = _model("mixtral")
    directory = str(tmp_path / "step2")
    uninterrupted = _run(state_workers.train_and_checkpoint, model, batch, "ep=4", 4, 2, directory)
    resumed = _run(state_workers.resume_from_checkpoint, model, batch, "ep=4", 2, directory)
    for whole_run, tail in zip(uninterrupted, resumed):
        assert tail == whole_run[2:]
    eager = copy.deepcopy(model)
    opt = state_workers.make_optimizer("adamw", eager.parameters(), foreach=True)
    model_state, optim_state = get_state_dict(eager, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp_load(state, checkpoint_id=directory, no_dist=True)
    set_state_dict(eager, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert state_workers._steps(eager, opt, batch, 2) == pytest.approx(uninterrupted[0][2:], rel=1e-5)


@pytest.mark.slow  # JAX in a fresh interpreter
def test_the_jax_backend_runs_the_experts_op_and_refuses_expert_parallelism():
    model, batch = _model("mixtral")
    data_parallel = autopar.plan(model, batch, mesh="dp=4", hardware=FAST,
                                 passes=[Constrain(no_expert_parallelism, name="no-ep")])
    assert not expert_parallel_axes(data_parallel)
    report = autopar.check(model, batch, plan=data_parallel, backend="jax")
    assert report.ok, str(report)
    for tokens in ("routed", "whole"):
        expert_parallel = autopar.plan(model, batch, mesh="ep=4", hardware=FAST, passes=[ExpertLayout("ep", tokens)])
        refusal = rf"does not emit {re.escape(_KERNEL[tokens])} yet.*axis 'ep', as expert"
        with pytest.raises(AutoparError, match=refusal):
            expert_parallel.emit("jax")


def _mixtral_8x7b(layers: int):
    """Mixtral-8x7B's widths and expert count (layers reduced), on the meta device."""
    with torch.device("meta"):
        return hf_zoo.mixtral(batch=8, seq=4096, width=4096, heads=32, kv_heads=8, layers=layers, vocab=32000,
                              experts=8, intermediate=14336)


def _expert_parallel_share(plan) -> float:
    layers = [n for n in plan.graph.nodes if n.target in KERNEL_OPS]
    return sum(expert_axis(plan.strategies[n.name].in_specs) is not None for n in layers) / len(layers)


def test_mixtral_8x7b_on_eight_h100s_splits_its_experts_where_replicas_do_not_fit():
    """Eight layers of replicated experts with Adam's state need ~100 GB a device: the solver
    splits the experts over the devices (expert parallelism) rather than gathering them per use."""
    model, batch = _mixtral_8x7b(layers=8)
    plan = autopar.plan(model, batch, mesh="dp=8", hardware="h100-sxm", cache=False)
    assert expert_parallel_axes(plan) == {"dp"}
    assert _expert_parallel_share(plan) >= 0.75, plan.summary()
    assert "expert parallel over dp" in plan.summary()


def test_on_a_very_slow_network_the_experts_are_not_split():
    import dataclasses

    slow = autopar.Link(1e9, 1e-4)
    hardware = dataclasses.replace(autopar.PRESETS["h100-sxm"], name="slow", intra_node=slow, inter_node=slow)
    model, batch = _mixtral_8x7b(layers=2)
    plan = autopar.plan(model, batch, mesh="dp=8", hardware=hardware, cache=False)
    assert not expert_parallel_axes(plan), plan.summary()


def test_routing_imbalance_is_measured_priced_and_stated():
    model, batch = _model("mixtral")
    measured = autopar.routing_imbalance(model, *batch)
    assert 1.0 < measured <= 4.0  # 4 experts: at most all pairs on one
    balanced = autopar.plan(model, batch, mesh="ep=4", hardware=FAST, cache=False)
    skewed = autopar.plan(model, batch, mesh="ep=4", hardware=FAST, cache=False, moe_imbalance=measured)
    layer = next(n.name for n in balanced.graph.nodes if n.target in KERNEL_OPS)
    assert skewed.strategies[layer].compute_s > balanced.strategies[layer].compute_s  # the busiest rank's wait
    assert "balanced routing assumed" in balanced.summary()
    assert f"routing imbalance {measured:g}" in skewed.summary()
    assert autopar.Plan.from_json(skewed.to_json()).moe_imbalance == measured
    with pytest.raises(AutoparError, match="moe_imbalance=0.5"):
        autopar.plan(model, batch, mesh="ep=4", moe_imbalance=0.5)


def test_explain_moe_weighs_each_layers_layouts():
    model, batch = _model("mixtral")
    plan = autopar.plan(model, batch, mesh="ep=4", hardware=FAST, cache=False)
    text = str(plan.explain("moe", model, batch))
    assert text.count("autopar.moe_experts.default") == 2
    assert "all_to_all[ep] inside" in text and "(R), (R), (R), (R), (R) -> (R)" in text


def test_baselines_keep_experts_whole_except_the_expert_parallel_ones():
    """zero3 gathers its sharded experts per use, as FSDP does; zero3-ep (torchtitan's FSDP with
    EP over every device) and megatron-tp2-ep-sp (Megatron-Core's dense TP with EP over dp) split
    them; each is a plan priced by the same cost model as autopar's."""
    model, batch = _mixtral_8x7b(layers=4)
    plans = autopar.baselines(model, batch, devices=8, hardware="h100-sxm",
                              only=["zero3", "zero3-ep", "megatron-tp2-ep-sp", "megatron-tp8-ep"])
    assert not expert_parallel_axes(plans["zero3"])
    assert expert_parallel_axes(plans["zero3-ep"]) == expert_parallel_axes(plans["megatron-tp2-ep-sp"]) == {"dp"}
    assert _expert_parallel_share(plans["zero3-ep"]) == 1.0
    assert "needs an expert count it divides" in plans.skipped["megatron-tp8-ep"]
    assert plans["zero3-ep"].predicted.peak_memory_bytes < plans["zero3"].predicted.peak_memory_bytes


@pytest.mark.slow  # compiles the programs on 4 ranks
@pytest.mark.parametrize("tokens", ["routed", "whole"])
def test_a_compiled_expert_parallel_program_equals_eager(tokens):
    """The experts' kernels (all-to-all, or each rank's share of every token) are graph breaks:
    the statements around them compile."""
    model, batch = _model("mixtral")
    plan = autopar.plan(model, batch, mesh="ep=4", hardware=FAST, passes=[ExpertLayout("ep", tokens=tokens)])
    assert expert_parallel_axes(plan) == {"ep"} and _kernel_call(tokens) in plan.emit(), plan.summary()
    report = autopar.check(model, batch, plan=plan, compile=True, steps=2)
    assert report.ok, str(report)
