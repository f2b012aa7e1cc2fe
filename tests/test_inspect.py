"""Inspection: plan.explain, the summary by module, and the progress display."""
import io
import re

import pytest

import autopar
from autopar.errors import AutoparError, PlanMismatchError
from autopar.inspect.progress import terminal_progress
from examples import mlp


@pytest.fixture(scope="module")
def planned():
    model, inputs = mlp.make(batch=8, width=256, hidden=1024)
    messages = []
    plan = autopar.plan(model, inputs, mesh="tp=4", hardware="h100-sxm", cache=False, progress=messages.append)
    return model, inputs, plan, messages


def test_explain_lists_the_chosen_layout_and_dearer_rejected_ones(planned):
    _, _, plan, _ = planned
    explanation = plan.explain("fc1.weight")
    (node,) = explanation.nodes
    assert node.what == "fc1.weight" and node.module == "fc1"
    assert node.chosen.layout == str(plan.param_spec("fc1.weight"))
    dearer = [r for r in node.rejected if r.total_s > node.chosen.total_s]
    assert dearer, "no rejected layout costs more"
    # the prices are the plan's own cost model: replicating the weight gathers it for the matmul
    assert any("all_gather[tp]" in r.collectives for r in dearer)
    text = str(explanation)
    assert "->" + node.chosen.layout in text and dearer[0].layout in text and "why: the cheapest" in text


def test_explain_a_module_covers_its_parameters_and_ops(planned):
    _, _, plan, _ = planned
    explanation = plan.explain("fc2")
    whats = [n.what for n in explanation.nodes]
    assert whats[:2] == ["fc2.weight", "fc2.bias"] and "aten.addmm.default" in whats
    for node in explanation.nodes:
        assert node.chosen.allowed and all(r.total_s >= node.chosen.total_s - 1e-15 for r in node.strategies
                                           if r.allowed)


def test_explain_marks_what_a_pin_rules_out(planned):
    model, inputs, plan, _ = planned
    pinned = autopar.plan(model, inputs, mesh="tp=4", hardware="h100-sxm", cache=False, pin={"fc1.weight": "R"})
    (node,) = pinned.explain("fc1.weight").nodes
    assert node.chosen.layout == "(R)"
    assert [r.allowed for r in node.rejected] == [False] * len(node.rejected)
    assert "ruled out by constraints" in node.reason


def test_explain_a_loaded_plan_needs_its_model(planned):
    model, inputs, plan, _ = planned
    loaded = autopar.Plan.from_json(plan.to_json())
    with pytest.raises(AutoparError, match="pass the model and example inputs"):
        loaded.explain("fc1.weight")
    again = loaded.explain("fc1.weight", model, inputs)
    assert [(r.layout, r.total_s) for r in again.nodes[0].strategies] == \
        [(r.layout, r.total_s) for r in plan.explain("fc1.weight").nodes[0].strategies]
    other, other_inputs = mlp.make(batch=8, width=128, hidden=512)
    with pytest.raises(PlanMismatchError, match="made for"):
        loaded.explain("fc1.weight", other, other_inputs)
    with pytest.raises(AutoparError, match="did you mean fc1.weight"):
        plan.explain("fc1.weigth")


def test_progress_reports_passes_and_the_solvers_objective_and_bound(planned):
    _, _, _, messages = planned
    assert "pass 4/7 solve_sharding ..." in messages
    assert any(m.startswith("pass 7/7 predict done in") for m in messages)
    solver = [m for m in messages if m.startswith("solver lp-first: optimal")]
    assert solver and "objective" in solver[0] and "bound" in solver[0]


def test_the_terminal_display_shows_finished_passes_and_stays_quiet_off_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    with terminal_progress(stream=screen) as progress:
        progress("pass 1/2 shapes ...")
        progress("pass 1/2 shapes done in 0.10s 12 nodes")
        progress("solver mip: optimal, objective 1.0 ms, bound 1.0 ms")
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # without the terminal's escapes
    assert "✓ 1/2 shapes done in 0.10s 12 nodes\n" in shown  # stays on screen
    assert "solver mip: optimal, objective 1.0 ms, bound 1.0 ms" in shown  # on the live line
    with terminal_progress(stream=io.StringIO()) as progress:  # a pipe or a log file
        assert progress is None
    with terminal_progress(quiet=True, stream=screen) as progress:
        assert progress is None


def test_the_summary_groups_parameters_time_and_collectives_by_module(planned):
    _, _, plan, _ = planned
    lines = plan.summary().splitlines()
    start = lines.index("by module (compute per step; parameters with their placement per mesh axis: tp):")
    fc1 = next(k for k in range(start, len(lines)) if lines[k].startswith("  fc1: forward "))
    assert lines[fc1 + 1].split() == ["fc1.weight", "[1024,", "256]", str(plan.param_spec("fc1.weight"))]
    moved = sum(1 for r, _ in plan.collectives() if plan.modules.get(r.value) == "fc2")
    fc2 = next(line for line in lines[start:] if line.startswith("  fc2: forward "))
    assert (f"{moved} collectives (" in fc2) == (moved > 0)
