"""autopar.diff and `autopar diff`: where two plans of one model differ, and what it costs."""
import pytest

import autopar
from autopar.cli import main as cli
from autopar.errors import PlanMismatchError
from examples import mlp
from tests.workers import FAST


@pytest.fixture(scope="module")
def plans():
    model, inputs = mlp.make(batch=8, width=256, hidden=1024)
    free = autopar.plan(model, inputs, mesh="tp=4", hardware=FAST)
    assert free.param_spec("fc1.weight").to_json() != "R"  # the solver shards it on its own
    pinned = autopar.plan(model, inputs, mesh="tp=4", hardware=FAST, pin={"fc1.weight": "R"})
    return model, inputs, free, pinned


def test_a_plan_does_not_differ_from_itself(plans):
    _, _, free, _ = plans
    result = autopar.diff(free, free)
    assert not result and result.differences == () and result.step_time_delta_s == 0
    assert str(result) == "the plans make the same decisions"


def test_pinning_a_parameter_shows_as_a_priced_difference(plans):
    _, _, free, pinned = plans
    result = autopar.diff(free, pinned)
    names = {d.role: d for d in result.differences}
    assert "fc1.weight" in names  # the pinned parameter, by its name
    weight = names["fc1.weight"]
    assert weight.layout_a == str(free.param_spec("fc1.weight")) and weight.layout_b == "(R)"
    # the deltas are the plans' own prices: they add up to the compute and collective change
    compute = pinned.predicted.compute_s - free.predicted.compute_s
    collectives = sum(r.seconds for r in pinned.redistributions) - sum(r.seconds for r in free.redistributions)
    assert sum(d.delta_s for d in result.differences) == pytest.approx(compute + collectives, abs=1e-12)
    assert result.step_time_delta_s >= 0  # the solver's own choice was the faster
    assert "fc1.weight" in str(result)


def test_cli_diff_and_a_plan_of_another_model_is_refused(plans, tmp_path, capsys):
    model, inputs, free, pinned = plans
    (tmp_path / "a.json").write_text(free.to_json())
    (tmp_path / "b.json").write_text(pinned.to_json())
    assert cli(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert "fc1.weight" in capsys.readouterr().out
    other_model, other_inputs = mlp.make(batch=8, width=128, hidden=512)
    other = autopar.plan(other_model, other_inputs, mesh="tp=4", hardware=FAST)
    with pytest.raises(PlanMismatchError, match="different graphs"):
        autopar.diff(free, other)
