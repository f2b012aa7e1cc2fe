"""Issue 8's error cases that the other test files leave open: the CLI side of each, the
indivisible dims run for real, the budget the infeasible-budget error names, and a plan
applied to another model. Already covered elsewhere (numbered as in issue 8):

  (1) test_planning::test_capture_error_names_the_user_line
  (2) test_planning::test_op_without_rule_falls_back_and_is_listed
  (3) test_core::test_mesh_world_size_mismatch_names_both_sizes,
      test_api::test_mesh_that_does_not_fit_the_world_is_refused_before_planning
  (4) test_planning::test_never_shards_an_indivisible_dim
  (5) test_memory::test_lowering_the_budget_never_raises_the_peak_and_an_impossible_one_is_explained
  (6) test_planning::test_corrupt_and_old_plan_files_are_refused
  (8) test_scale::test_a_hit_time_limit_returns_a_valid_plan_with_its_gap,
      test_planning::test_solver_time_limit_returns_a_valid_plan_with_a_warning
"""
import re

import pytest
import torch
import torch.nn.functional as F

import autopar
from autopar import AutoparError, MeshError, Plan, PlanFormatError, PlanMismatchError
from autopar.cli import main as cli
from autopar.ir.strategy import spec_fits
from autopar.runtime.local_cluster import get_cluster
from autopar.units import parse_bytes
from examples import mlp
from tests.models import BranchyModel, UnruledOpModel
from tests.workers import FAST


def branchy_factory():
    return BranchyModel(), (torch.randn(4, 8),)


def unruled_factory():
    return UnruledOpModel(), (torch.randn(4, 16),)


class ReluMLP(mlp.MLP):
    """The examples' MLP with relu for gelu: the same parameters, another computation."""

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.relu(self.fc1(x))), y)


def test_cli_capture_error_names_the_user_line(capsys):
    assert cli(["plan", "tests.test_errors:branchy_factory", "--mesh", "dp=2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "could not capture" in err and "models.py" in err and "if h.sum() > 0" in err


def test_cli_summary_lists_the_fallback_ops(capsys):
    assert cli(["plan", "tests.test_errors:unruled_factory", "--mesh", "dp=2", "--quiet"]) == 0
    assert "aten.logcumsumexp.default x3 in scan" in capsys.readouterr().out


def test_check_refuses_a_mesh_other_than_the_plans():
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=FAST)
    with pytest.raises(MeshError, match=r"mesh \(tp=2\) differs from the plan's mesh \(dp=2\)"):
        autopar.check(model, inputs, mesh="tp=2", plan=plan)


def test_indivisible_dims_are_never_split_and_the_plan_runs():
    model, inputs = mlp.make(batch=5, width=7, hidden=256)  # 5 and 7 on tp=2: neither divides
    plan = autopar.plan(model, inputs, mesh="tp=2", hardware=FAST)
    assert any(not plan.out_spec(ph).is_replicated() for ph in plan.graph.params)  # 256 still splits
    for node in plan.graph.nodes:
        if node.name in plan.strategies:
            for spec, meta in zip(plan.strategies[node.name].out_specs, node.outputs):
                assert spec_fits(spec, meta, plan.mesh), (node.name, spec, meta)
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)


def test_an_infeasible_budget_names_one_that_works():
    model, inputs = mlp.make(batch=8, width=256, hidden=1024)
    with pytest.raises(AutoparError, match="fits the memory budget") as info:
        autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, offload=False, memory_budget="100KiB")
    budget = re.search(r"raise memory_budget to at least '([\d.]+[KMGT]iB)'", str(info.value)).group(1)
    plan = autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, offload=False, memory_budget=budget)
    assert plan.predicted.peak_memory_bytes <= parse_bytes(budget)


@pytest.mark.parametrize("text", ["{not json", '{"format_version": 0}', '{"format_version": 1, "mesh": {}}'])
def test_a_corrupt_or_old_plan_file_says_to_re_create_it(text, tmp_path, capsys):
    with pytest.raises(PlanFormatError, match="re-create it with `autopar plan`"):
        Plan.from_json(text)
    bad = tmp_path / "plan.json"
    bad.write_text(text)
    assert cli(["diff", str(bad), str(bad)]) == 2
    assert "re-create it with `autopar plan`" in capsys.readouterr().err


def test_check_refuses_a_plan_of_another_computation():
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=FAST)
    relu = ReluMLP(64, 256)
    with pytest.raises(PlanMismatchError, match=f"made for graph {plan.fingerprint}.*autopar.plan"):
        autopar.check(relu, inputs, plan=plan)
    _, other_batch = mlp.make(batch=16, width=64, hidden=256)
    with pytest.raises(PlanMismatchError, match="inputs of other shapes"):
        autopar.check(model, other_batch, plan=plan)


def run_a_given_plan(rank, world_size, plan_json, mesh):
    """Worker job: wrap ReluMLP with a plan given to autoparallelize and make its first call."""
    model = autopar.autoparallelize(ReluMLP(64, 256), mesh=mesh, plan=Plan.from_json(plan_json))
    x, y = torch.randn(8, 64), torch.randn(8, 64)
    try:
        model(x, y)
    except AutoparError as exc:
        return type(exc).__name__, str(exc)
    return None, None


def test_autoparallelize_refuses_a_plan_of_another_model_or_mesh():
    model, inputs = mlp.make(batch=8, width=64, hidden=256)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=FAST)
    cluster = get_cluster(2)
    for kind, message in cluster.run(run_a_given_plan, plan.to_json(), "dp=2"):
        assert kind == "PlanMismatchError" and plan.fingerprint in message
    for kind, message in cluster.run(run_a_given_plan, plan.to_json(), "tp=2"):
        assert kind == "MeshError" and "for mesh (dp=2), not (tp=2)" in message
