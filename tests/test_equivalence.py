"""Every emitted program against single-process eager: loss and every gradient,
and the losses over 3 SGD steps, on a local gloo group (fp32, rtol 1e-4)."""
import pytest
import torch

import autopar
from autopar.check import RTOL
from examples import gpt2, mlp
from tests.models import UnruledOpModel

MESHES = ["dp=2", "tp=2", "tp=4", "dp=2,tp=2"]
MODELS = {
    "mlp": lambda: mlp.make(batch=8, width=64, hidden=256),
    "gpt2": lambda: gpt2.make("tiny"),
}


def sharded_fraction(plan) -> float:
    """Share of ops whose result is split (sharded or partial) on some mesh axis."""
    calls = [n for n in plan.graph.nodes if n.op == "call" and n.outputs[0] is not None and n.outputs[0].shape]
    return sum(not plan.out_spec(n.name).is_replicated() for n in calls) / len(calls)


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_plan_matches_eager(name, mesh, fast_network):
    model, inputs = MODELS[name]()
    plan = autopar.plan(model, inputs, mesh=mesh, hardware=fast_network)
    # the check must exercise a real sharded program, not a replicated one
    assert sharded_fraction(plan) >= 0.5, plan.summary()
    assert len(plan.collectives()) > 0
    assert any(not plan.out_spec(ph).is_replicated() for ph in plan.graph.params)
    report = autopar.check(model, inputs, plan=plan, steps=3)
    assert report.ok, str(report)
    assert report.max_rel_error <= RTOL
    assert len(report.losses) == 3 and report.losses[2] < report.losses[0]
    n_params = sum(1 for p in model.parameters())
    assert sum(t.name.startswith("grad ") for t in report.tensors) == n_params


def test_check_reports_a_mismatch_instead_of_raising(fast_network):
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    plan = autopar.plan(model, inputs, mesh="tp=2", hardware=fast_network)
    other, _ = mlp.make(batch=8, width=64, hidden=256, seed=1)  # same shapes, other weights
    report = autopar.check(other, (inputs[0], inputs[1] * 0), plan=plan)
    assert report.ok  # a plan is weight-independent: still correct for other data
    broken = autopar.check(model, inputs, plan=_corrupt(plan))
    assert not broken.ok and broken.max_rel_error > RTOL
    assert "MISMATCH" in str(broken)


def _corrupt(plan):
    """Drop the forward all-reduces: each rank then keeps only its partial result (same shapes)."""
    from dataclasses import replace

    keep = tuple(r for r in plan.redistributions
                 if not (r.phase == "forward" and all(s.kind == "all_reduce" for s in r.steps)))
    assert len(keep) < len(plan.redistributions)
    return replace(plan, redistributions=keep)


def test_the_plan_the_h100_preset_picks_runs_correctly():
    """Not only the fast-network plans: the real preset's plan for a GPT-2-style model (mostly data
    parallel over the axis, its gradient syncs overlapping backward)."""
    model, inputs = gpt2.make("small")
    plan = autopar.plan(model, inputs, mesh="tp=4", hardware="h100-sxm")
    assert plan.sharded_flops_fraction > 0.5 and plan.collectives(), plan.summary()
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)


def test_indivisible_dims_and_fallback_ops_still_give_correct_programs(fast_network):
    model, inputs = mlp.make(batch=6, width=6, hidden=10)
    report = autopar.check(model, inputs, mesh="tp=4", hardware=fast_network)
    assert report.ok, str(report)
    model = UnruledOpModel()
    inputs = (torch.randn(4, 16),)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network)
    assert "aten.logcumsumexp.default" in plan.fallback_ops
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)


def test_dropout_masks_match_eager_when_sharded(fast_network):
    from tests.models import DropoutMLP

    torch.manual_seed(0)
    model = DropoutMLP(p=0.2)
    inputs = (torch.randn(8, 32), torch.randn(8, 32))
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network)
    dropout = next(n for n in plan.graph.nodes if n.target == "aten.native_dropout.default")
    assert not plan.strategies[dropout.name].out_specs[0].is_replicated()  # the mask itself is sharded
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)
    model.drop.p = 0.0  # another graph: the plan above would be refused, so plan it again
    without = autopar.check(model, inputs, mesh="dp=2,tp=2", hardware=fast_network, steps=1)
    assert without.reference_losses[0] != report.reference_losses[0]  # dropout really acted


def test_collective_bytes_counted_at_run_time_match_the_plan(fast_network):
    """Every rank runs each planned collective once a step, moving the message the cost model priced."""
    model, inputs = gpt2.make("tiny")
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network)
    predicted: dict = {}
    for r, i in plan.collectives():
        predicted[r.steps[i].kind] = predicted.get(r.steps[i].kind, 0) + r.step_bytes[i]
    assert predicted
    # gradient syncs start asynchronously in the emitted program (and still match eager)
    assert any(r.is_async for r in plan.redistributions) and "rt.start_" in plan.emit()
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)
    assert report.bytes_moved == {k: 2 * plan.mesh.size * v for k, v in predicted.items()}


def test_a_worker_that_dies_is_reported_at_once():
    import time

    from autopar.runtime.local_cluster import LocalCluster, WorkerError
    from tests.workers import die

    cluster = LocalCluster(2)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"exited before answering \(rank \d: exit code 3"):
        cluster.run(die)
    assert time.monotonic() - start < 60


def test_a_worker_that_crashes_in_native_code_is_named_and_prints_where():
    """A segmentation fault is named, and the workers print a native crash's Python stack (to
    the stderr their fork server was started with): where a collective or a compiled kernel
    corrupts memory, that stack is all there is to go on."""
    from autopar.runtime.local_cluster import LocalCluster, WorkerError, get_cluster
    from tests.workers import crash_in_native_code, prints_native_crashes

    with pytest.raises(WorkerError, match=r"killed by SIGSEGV\).*printed where it crashed"):
        LocalCluster(2).run(crash_in_native_code)
    assert get_cluster(2).run(prints_native_crashes) == [True, True]


def test_a_rank_that_raises_while_its_peers_wait_is_reported_without_waiting_them_out():
    """A pipeline stage that raises leaves the others blocked in a send for good: the parent
    reports the failure once the peers' grace has passed, not at the pool's timeout."""
    import time

    from autopar.runtime.local_cluster import LocalCluster, WorkerError
    from tests.workers import raise_on_rank_0_while_rank_1_waits

    cluster = LocalCluster(2, peers_grace_s=1.0)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"(?s)rank 0 gives up.*no answer within 1 s of that failure"):
        cluster.run(raise_on_rank_0_while_rank_1_waits)
    assert time.monotonic() - start < 60
    assert not cluster.alive


def _rule_cases():
    from tests import models

    g = torch.Generator().manual_seed(0)

    def randint(high, *shape):
        return torch.randint(0, high, shape, generator=g)

    return {
        "grouped convolutions": lambda: (models.GroupedConvNet(), (torch.randn(8, 8, 8, 8, generator=g),
                                                                   torch.randn(8, 4, generator=g))),
        "depthwise convolution": lambda: (models.DepthwiseConvNet(), (torch.randn(8, 4, 8, 8, generator=g),
                                                                      torch.randn(8, 4, 8, 8, generator=g))),
        "gather then scatter": lambda: (models.GatherScatter(), (torch.randn(32, 64, generator=g),
                                                                 randint(64, 16, 64))),
        "histogram over the data's range": lambda: (models.HistogramPenalty(), (torch.randn(64, 64, generator=g),)),
        "frequency-scaled embedding": lambda: (models.FrequencyScaledEmbedding(), (randint(8, 8, 16),
                                                                                   randint(32, 8, 16))),
    }


RULE_CASES = _rule_cases()


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_models_whose_rules_once_computed_something_else_now_equal_eager(name, fast_network):
    """Each once planned a strategy whose local op computed something else (or crashed): grouped
    and depthwise convolutions split channels across groups, a gather read the wrong rows, a
    histogram binned each rank's own range, an embedding counted frequencies per rank."""
    torch.manual_seed(0)
    model, inputs = RULE_CASES[name]()
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network)
    assert plan.sharded_flops_fraction >= 0.9 and not plan.fallback_ops, plan.summary()
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)


def test_ops_without_a_rule_are_decomposed_for_planning_and_their_parts_shard(fast_network):
    """softplus's backward and stack have no rule of their own: capture writes them in Core ATen
    ops, which do, so the layers stay sharded instead of replicated around them."""
    from tests.models import SoftplusStack

    torch.manual_seed(0)
    model = SoftplusStack()
    inputs = (torch.randn(32, 64), torch.randn(32, 64))
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network)
    targets = {n.target for n in plan.graph.nodes}
    assert "aten.stack.default" not in targets and "aten.softplus_backward.default" not in targets
    assert not plan.fallback_ops and plan.sharded_flops_fraction >= 0.9, plan.summary()
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)
