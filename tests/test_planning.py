"""Planning-only tests: fake tensors, no process group."""
import functools
import os

import pytest
import torch

import autopar
from autopar import CaptureError, Plan, PlanFormatError
from autopar.ir.placement import Partial, Shard
from autopar.ir.strategy import spec_fits
from examples import gpt2, mlp
from tests.models import BranchyModel, TupleLoss, UnruledOpModel


def param_specs(plan: Plan) -> dict:
    return {fqn: plan.out_spec(ph) for ph, fqn in plan.graph.params.items()}


def test_megatron_column_then_row_for_small_batch_large_hidden():
    model, inputs = mlp.make(batch=8, width=1024, hidden=4096)
    plan = autopar.plan(model, inputs, mesh="tp=4", hardware="h100-sxm")
    specs = param_specs(plan)
    assert specs["fc1.weight"].placements == (Shard(0),)  # column-parallel: output features split
    assert specs["fc1.bias"].placements == (Shard(0),)
    assert specs["fc2.weight"].placements == (Shard(1),)  # row-parallel: input features split
    forward = [(r, i) for r, i in plan.collectives("forward")]
    assert len(forward) == 1, [r.steps for r, _ in forward]
    redistribution, index = forward[0]
    assert redistribution.steps[index].kind == "all_reduce"
    assert isinstance(redistribution.src.placements[0], Partial)
    producer = plan.graph.node(redistribution.value)
    assert producer.target == "aten.addmm.default" and any(
        a == {"ref": ph} or a == {"ref": "t_1"} for a in producer.args for ph in plan.graph.params)


def test_data_parallel_for_large_batch_small_hidden():
    model, inputs = mlp.make(batch=16384, width=64, hidden=256)
    plan = autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm")
    x = plan.graph.inputs[0]
    assert plan.out_spec(x).placements == (Shard(0),)  # batch sharded
    assert all(s.is_replicated() for s in param_specs(plan).values())  # weights replicated
    grad_reductions = {r.value for r in plan.redistributions if r.consumers == ("output",)
                       and [s.kind for s in r.steps] == ["all_reduce"]}
    assert grad_reductions == set(plan.graph.grads)  # every gradient is all-reduced


def test_never_shards_an_indivisible_dim(fast_network):
    model, inputs = mlp.make(batch=6, width=6, hidden=10)
    plan = autopar.plan(model, inputs, mesh="tp=4", hardware=fast_network)
    for node in plan.graph.nodes:
        strategy = plan.strategies.get(node.name)
        if strategy is None:
            continue
        for spec, meta in zip(strategy.out_specs, node.outputs):
            assert spec_fits(spec, meta, plan.mesh), (node.name, spec, meta)


def test_op_without_rule_falls_back_and_is_listed():
    model = UnruledOpModel()
    plan = autopar.plan(model, (torch.randn(4, 16),), mesh="dp=2")
    assert "aten.logcumsumexp.default" in plan.fallback_ops
    node = next(n for n, op in plan.fallback_nodes.items() if op == "aten.logcumsumexp.default")
    assert all(s.is_replicated() for s in plan.strategies[node].in_specs + plan.strategies[node].out_specs)
    # forward, and the backward's logcumsumexp over flipped gradients: each named with the module it
    # sits in (flip has a rule of its own)
    assert plan.fallback_sites["aten.logcumsumexp.default"] == ["scan"] * 3
    assert "aten.flip.default" not in plan.fallback_ops
    assert "aten.logcumsumexp.default x3 in scan" in plan.summary()


def test_json_round_trip_is_lossless():
    model, inputs = gpt2.make("tiny")
    plan = autopar.plan(model, inputs, mesh="dp=2")
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.to_json() == plan.to_json()
    assert again.emit("torch") == plan.emit("torch")


def test_emitted_source_is_deterministic_and_readable():
    model, inputs = gpt2.make("tiny")
    first = autopar.plan(model, inputs, mesh="tp=2", cache=False).emit("torch")
    second = autopar.plan(model, inputs, mesh="tp=2", cache=False).emit("torch")
    assert first == second
    assert first.startswith("# autopar: per-rank training step")
    assert "mesh (tp=2)" in first and "hardware h100-sxm" in first and "#   solve_sharding:" in first
    compile(first, "<emitted>", "exec")


def test_meta_device_model_plans_like_the_real_one():
    real, real_inputs = gpt2.make("tiny")
    meta, meta_inputs = gpt2.make("tiny", device="meta")
    assert autopar.plan(meta, meta_inputs, mesh="tp=2", cache=False).hash == \
        autopar.plan(real, real_inputs, mesh="tp=2", cache=False).hash


def test_capture_error_names_the_user_line():
    with pytest.raises(CaptureError) as err:
        autopar.plan(BranchyModel(), (torch.randn(4, 8),), mesh="dp=2")
    message = str(err.value)
    assert "models.py" in message and "if h.sum() > 0" in message


def test_non_scalar_loss_is_refused():
    with pytest.raises(CaptureError, match="scalar"):
        autopar.plan(TupleLoss(), (torch.randn(4, 8),), mesh="dp=2")


def test_corrupt_and_old_plan_files_are_refused():
    with pytest.raises(PlanFormatError, match="not valid JSON"):
        Plan.from_json("{not json")
    with pytest.raises(PlanFormatError, match="format version 0"):
        Plan.from_json('{"format_version": 0}')
    with pytest.raises(PlanFormatError, match="corrupt"):
        Plan.from_json('{"format_version": 1, "mesh": {}}')


def test_summary_lists_placements_collectives_time_and_memory():
    model, inputs = mlp.make(batch=8, width=1024, hidden=4096)
    text = autopar.plan(model, inputs, mesh="tp=4").summary()
    assert "fc1.weight" in text and "(S(0))" in text
    assert "all_reduce" in text and "predicted step time" in text and "memory per device" in text


def test_predicted_step_time_is_compute_plus_communication():
    model, inputs = mlp.make(batch=8, width=1024, hidden=4096)
    plan = autopar.plan(model, inputs, mesh="tp=4")
    p = plan.predicted
    assert p.step_time_s == pytest.approx(p.compute_s + p.communication_s)
    assert p.communication_s + p.hidden_communication_s == pytest.approx(sum(r.seconds for r in plan.redistributions))
    assert p.step_time_s > 0


def test_sharded_flops_fraction():
    model, inputs = mlp.make(batch=8, width=1024, hidden=4096)
    megatron = autopar.plan(model, inputs, mesh="tp=4")
    assert megatron.sharded_flops_fraction > 0.99
    small, small_inputs = mlp.make(batch=8, width=16, hidden=16)
    replicated = autopar.plan(small, small_inputs, mesh="tp=4")
    assert all(s.is_replicated() for s in param_specs(replicated).values())
    assert replicated.sharded_flops_fraction == 0.0


_BY_TIME = (dict(solver_time_limit_s=0.01),
            r"its safety time limit of 0\.01 s per solve stopped it .* depends on this machine's speed and load")


# (the LP-first path proves this model optimal in its first few units of work: its work limit is
# exercised on larger models, tests/test_pipeline.py)
@pytest.mark.parametrize("solver,limit,says", [("mip", dict(solver_work_limit=1), r"in its work limit of 1 per solve"),
                                               ("mip",) + _BY_TIME, ("lp-first",) + _BY_TIME])
def test_a_solve_stopped_by_a_limit_returns_a_valid_plan_with_a_warning_naming_the_limit(solver, limit, says):
    model, inputs = gpt2.make("tiny")
    with pytest.warns(UserWarning, match=r"the plan (is within .* of optimal|has no proven bound): " + says):
        plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", solver=solver, cache=False, **limit)
    assert plan.solver.status == "feasible" and plan.solver.gap > 0
    assert plan.solver.timed_out == ("solver_time_limit_s" in limit)
    assert plan.emit("torch")  # still a complete program


def _busy() -> None:
    while True:
        pass


@pytest.mark.slow  # two plans of Mixtral, one beside a busy loop on every core
def test_a_plan_stopped_by_its_work_limit_is_the_same_on_an_idle_and_a_loaded_machine(fast_network, monkeypatch):
    """Mixtral's routing graph, captured op by op, leaves the LP-first branch and bound open past
    20k units of work (a gap under 1%): the plan it stops at is the same with every core busy
    with other work, where a time limit would have stopped it elsewhere."""
    import multiprocessing
    import warnings

    from autopar.solvers import sharding
    from autopar.solvers.lp_first import Relaxations
    from examples import hf_zoo

    model, inputs = hf_zoo.make("mixtral")
    for experts in (m for m in model.modules() if hasattr(m, "gate_up_proj")):
        # a gate of its own (the same SwiGLU) keeps the layer out of autopar's one-op capture (autopar.ops.moe)
        experts._apply_gate = functools.partial(type(experts)._apply_gate, experts)
    messages = []

    def plan():
        monkeypatch.setattr(sharding, "_RELAXATIONS", Relaxations())  # no LP left warm by the last solve
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # not proven optimal: the point of the test
            return autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network, solver_work_limit=20_000,
                                cache=False, progress=messages.append)
    idle = plan()
    burners = [multiprocessing.get_context("spawn").Process(target=_busy, daemon=True)
               for _ in range(os.cpu_count() or 2)]
    for burner in burners:
        burner.start()
    try:
        loaded = plan()
    finally:
        for burner in burners:
            burner.kill()
    assert any("branch and bound: work limit" in m for m in messages)
    assert idle.solver.status == loaded.solver.status == "feasible" and not loaded.solver.timed_out
    assert loaded.hash == idle.hash and loaded.solver.objective_s == idle.solver.objective_s
