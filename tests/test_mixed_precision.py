"""Mixed precision (precision="bf16-mixed" / "fp16-mixed"): float32 master weights and optimizer
state, compute in the low precision, gradients reduced in float32; checked against eager under
torch.autocast at the tolerance autopar.check states (MIXED_TOLERANCE), on gloo."""
import copy
import io
import math

import pytest
import torch

import autopar
from autopar.check import MIXED_TOLERANCE, compare
from autopar.ir.precision import MixedPrecision
from autopar.runtime.local_cluster import get_cluster
from examples import gpt2, mlp
from tests import precision_workers, state_workers, workers

BF16 = MIXED_TOLERANCE["bfloat16"]


def _run(job, model, *args, world=4):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return get_cluster(world).run(job, buffer.getvalue(), *args)


def _gradient_reductions(plan) -> list[str]:
    """The dtype every backward all-reduce or reduce-scatter sums in."""
    return [r.wire_dtype or plan.graph.node(r.value).outputs[0].dtype for r, i in plan.collectives("backward")
            if r.steps[i].kind in ("all_reduce", "reduce_scatter")]


def _matmul_seconds(plan) -> float:
    return sum(plan.strategies[n.name].compute_s for n in plan.graph.nodes
               if n.target in ("aten.mm.default", "aten.addmm.default"))


def _local_parameter_elements(plan) -> int:
    total = 0
    for ph in plan.graph.params:
        spec, numel = plan.out_spec(ph), math.prod(plan.graph.node(ph).outputs[0].shape)
        split = math.prod(size for size, p in zip(plan.mesh.shape, spec.placements) if isinstance(p, autopar.Shard))
        total += numel // split
    return total


def _meta_mlp():
    model, (x, y) = mlp.make(batch=4096, width=1024, hidden=4096)
    return model.to("meta"), (x.to("meta"), y.to("meta"))


def test_bf16_mixed_plans_compute_in_bf16_keep_float32_masters_and_reduce_gradients_in_float32():
    model, batch = _meta_mlp()
    full = autopar.plan(model, batch, mesh="dp=4", cache=False)
    mixed = autopar.plan(model, batch, mesh="dp=4", precision="bf16-mixed", cache=False)
    graph = mixed.graph
    matmuls = [n for n in graph.nodes if n.target in ("aten.mm.default", "aten.addmm.default")]
    assert matmuls and all(n.outputs[0].dtype == "bfloat16" for n in matmuls)
    assert all(graph.node(ph).outputs[0].dtype == "float32" for ph in graph.params)  # the masters
    assert all(graph.node(g).outputs[0].dtype == "float32" for g in graph.grads)
    reductions = _gradient_reductions(mixed)
    assert reductions and set(reductions) == {"float32"}, reductions
    # matmuls priced at the bf16 rate (twice fp32's on the h100 preset); the masters and Adam's
    # two moments counted in float32, each rank's blocks of them
    assert _matmul_seconds(mixed) == pytest.approx(_matmul_seconds(full) / 2, rel=0.05)
    assert mixed.predicted.step_time_s < full.predicted.step_time_s
    masters = _local_parameter_elements(mixed) * 4
    assert mixed.predicted.memory_bytes["parameters"] == pytest.approx(masters)
    assert mixed.predicted.memory_bytes["optimizer_state"] == pytest.approx(2 * masters)


def test_gradients_reduced_in_bf16_on_request():
    """MixedPrecision(reduce="bf16"): the gradient syncs move bf16 (half the bytes, still
    overlapping backward): a plan no slower, moving fewer bytes in backward."""
    model, batch = _meta_mlp()
    fp32 = autopar.plan(model, batch, mesh="dp=4", precision="bf16-mixed", cache=False)
    bf16 = autopar.plan(model, batch, mesh="dp=4", precision=MixedPrecision("bf16", reduce="bf16"), cache=False)
    reductions = _gradient_reductions(bf16)
    assert reductions and set(reductions) == {"bfloat16"}, reductions
    assert bf16.predicted.step_time_s <= fp32.predicted.step_time_s
    assert sum(r.step_bytes[i] for r, i in bf16.collectives("backward")) < \
        sum(r.step_bytes[i] for r, i in fp32.collectives("backward"))


def test_gradients_reduced_in_bf16_check_equal_to_eager_autocast():
    model, batch = gpt2.make("tiny")
    plan = autopar.plan(model, batch, mesh="dp=2,tp=2", hardware=workers.FAST,
                        precision=MixedPrecision("bf16", reduce="bf16"))
    assert any(r.wire_dtype == "bfloat16" for r, _ in plan.collectives("backward"))
    report = autopar.check(model, batch, plan=plan, steps=2)
    assert report.ok, str(report)


def test_a_mixed_precision_comparison_allows_eagers_own_rounding_and_no_more():
    """A gradient small beside the terms summed into it (a key projection's bias: softmax cancels
    most of it) is mostly their bf16 rounding, which another summation order rounds otherwise:
    eager's own distance from float32 bounds how far autopar's may lie from eager's."""
    tolerance = MIXED_TOLERANCE["bfloat16"]
    small = torch.tensor([5e-4, -3e-4, 1e-4])
    assert not compare("grad k.bias", small + 1.2e-5, small, tolerance).ok  # past 1e-5 and 2% of 5e-4
    assert compare("grad k.bias", small + 1.2e-5, small, tolerance, rounding=5e-6).ok
    assert not compare("grad k.bias", small + 3e-5, small, tolerance, rounding=5e-6).ok
    assert not compare("grad w", torch.ones(3) * 1.03, torch.ones(3), tolerance, rounding=4e-3).ok  # bf16's 2^-8


def test_an_overflow_in_eager_mixed_precision_widens_no_comparison():
    """Eager's fp16 gradients overflowing to inf is no rounding allowance: autopar's finite but
    wrong gradient still fails against it."""
    from autopar.check import _eagers_rounding

    model, batch = mlp.make(batch=4, width=8, hidden=16)
    overflowed = {n: torch.full_like(p, math.inf) for n, p in model.named_parameters()}
    rounding = _eagers_rounding(model, batch, {}, 1, 0.1, None, ([1.0], overflowed, {}))
    assert rounding and all(math.isfinite(r) for r in rounding.values())
    assert not any(name.startswith("grad") for name in rounding)


def test_bf16_mixed_check_equals_eager_autocast_over_three_steps():
    """autopar.check runs eager under torch.autocast and compares loss, every gradient and the
    logits at the bf16 tolerance; a plan that drops its forward all-reduces fails it."""
    model, batch = gpt2.make("tiny")
    plan = autopar.plan(model, batch, mesh="dp=2,tp=2", hardware=workers.FAST, precision="bf16-mixed")
    assert plan.sharded_flops_fraction > 0.9
    report = autopar.check(model, batch, plan=plan, steps=3)
    assert report.ok, str(report)
    assert report.tolerance == BF16 and report.max_abs_error > 0  # bf16 rounding shows: autocast ran
    from tests.test_equivalence import _corrupt

    assert not autopar.check(model, batch, plan=_corrupt(plan)).ok


def test_the_jax_program_of_a_bf16_mixed_plan_equals_eager_autocast():
    model, batch = mlp.make(batch=8, width=64, hidden=128)
    report = autopar.check(model, batch, mesh="dp=2,tp=2", hardware=workers.FAST, precision="bf16-mixed",
                           backend="jax")
    assert report.ok and report.tolerance == BF16, str(report)
    bf16_syncs = autopar.plan(model, batch, mesh="dp=2,tp=2", hardware=workers.FAST,
                              precision=MixedPrecision("bf16", reduce="bf16"))
    with pytest.raises(autopar.AutoparError, match="reduces gradients in bfloat16"):
        bf16_syncs.emit("jax")


@pytest.mark.slow  # fp16 end to end; bf16's runs in the inner loop, fp16's loss scaling in its own tests
def test_fp16_mixed_check_equals_eager_autocast():
    model, batch = gpt2.make("tiny")
    report = autopar.check(model, batch, mesh="dp=2,tp=2", hardware=workers.FAST, precision="fp16-mixed", steps=2)
    assert report.ok and report.tolerance == MIXED_TOLERANCE["float16"], str(report)


def test_autoparallelize_bf16_mixed_trains_float32_masters_with_adamw_like_eager_autocast():
    """Parameters, gradients and AdamW's state are float32 DTensors; three clipped AdamW steps
    give eager-under-autocast's losses and gradient norms at the bf16 tolerance (not each
    parameter: AdamW's normalized update turns the rounding noise of a near-zero gradient entry
    into a full-size step of either sign; autopar.check compares every gradient). A call under
    autocast of the plan's dtype runs, and so does a call under no_grad (a forward program
    planned in the same precision); a call under another autocast is refused."""
    model, batch = mlp.make(batch=8, width=64, hidden=128)
    results = _run(precision_workers.train_bf16_mixed, model, batch, "dp=2,tp=2")
    want = state_workers.train_clipped(copy.deepcopy(model), batch, "adamw", True, autocast=torch.bfloat16)
    for got in results:
        assert got["dtensors"] and got["sharded"] > 0
        assert got["master_dtypes"] == ["torch.float32"] and got["state_dtypes"] == ["torch.float32"]
        assert got["losses"] == pytest.approx(want["losses"], rel=BF16[0])
        assert got["norms"] == pytest.approx(want["norms"], rel=BF16[0])
        assert got["loss_under_matching_autocast"] == pytest.approx(want["next_loss"], rel=BF16[0])
        assert got["no_grad_loss"] == pytest.approx(want["next_loss"], rel=BF16[0])
        assert "torch.autocast('cpu', dtype=torch.float16)" in got["other_autocast"]
        assert "planned under autocast to bfloat16" in got["other_autocast"]


def test_fp16_skip_decisions_agree_on_every_rank_when_one_rank_overflows():
    """The linear layer's weight is sharded by rows over dp: at loss scale 2**16 only rank 0's
    rows overflow float16. torch.amp.GradScaler on each rank sees its own blocks (and DTensor's
    found-inf reduction reads the first gradient's placement, the replicated gain's); autopar
    makes the overflow every rank's, so every rank skips the first step as eager does, and the
    next two steps match eager's."""
    model = precision_workers.OverflowingLinear()
    x = torch.rand(8, 8, generator=torch.Generator().manual_seed(0)) * 1e-3
    plan = autopar.plan(model, (x,), mesh="dp=2", hardware=workers.FAST, precision="fp16-mixed",
                        pin={"fc.weight": "S(0)", "gain": "R"})
    want = precision_workers.scaled_fp16_steps(copy.deepcopy(model), x, autocast=True)
    assert want["taken"] == [False, True, True]
    results = _run(precision_workers.train_fp16_with_loss_scaling, model, x, plan.to_json(), world=2)
    assert [r["local_rows"] for r in results] == [(4, 8), (4, 8)]
    for got in results:
        assert got["programs"] == [("forward", "float16"), ("step", "float16")]
        assert got["taken"] == want["taken"] and got["scales"] == want["scales"]
        for name, value in want["params"].items():
            assert compare(name, got["params"][name], value, MIXED_TOLERANCE["float16"]).ok, name


def test_the_command_line_plans_in_mixed_precision(capsys):
    from autopar.cli import main

    assert main(["plan", "examples.mlp:factory", "--mesh", "dp=2", "--precision", "bf16-mixed", "--quiet",
                 "--no-cache"]) == 0
    assert "mixed precision: float32 parameters, computing in bfloat16" in capsys.readouterr().out


def test_precision_errors_name_the_cause():
    model, batch = mlp.make(batch=8, width=64, hidden=128)
    with pytest.raises(autopar.AutoparError, match="unknown precision 'bf16'"):
        autopar.plan(model, batch, mesh="dp=2", precision="bf16")
    with pytest.raises(autopar.AutoparError, match="use optimizer='adam'"):
        autopar.plan(model, batch, mesh="dp=2", precision="bf16-mixed", optimizer="adam-mixed")
    with pytest.raises(autopar.AutoparError, match="reduced in 'fp32' or in the compute dtype"):
        MixedPrecision("bf16", reduce="fp16")
    with pytest.raises(autopar.CaptureError, match=r"parameters are bfloat16: build it in float32"):
        autopar.plan(copy.deepcopy(model).to(torch.bfloat16), (batch[0].bfloat16(), batch[1].bfloat16()),
                     mesh="dp=2", precision="bf16-mixed")
