"""Symbolic costs: the plan's step time as a formula of batch and sequence length."""
import dataclasses

import pytest
import sympy

import autopar
from autopar.capture.export import capture
from autopar.errors import AutoparError
from autopar.passes.base import PassContext
from autopar.passes.collectives import CollectivesPass
from autopar.passes.predict import PredictPass
from autopar.passes.recompute import RecomputePass
from autopar.passes.shapes import ShapesPass
from autopar.passes.strategies import StrategiesPass
from autopar.planning.request import resolve
from examples import gpt2

SIZES = {"batch": 0, "seq": 1}


@pytest.fixture(scope="module")
def planned(fast_network):
    model, inputs = gpt2.make("tiny")  # batch 8, seq 32
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network, symbolic_dims=SIZES)
    return model, plan, fast_network


def reprice(plan, model, hardware, batch: int, seq: int) -> float:
    """Price the plan's layouts on a capture at other sizes, through the ordinary passes."""
    inputs = gpt2.make(dataclasses.replace(gpt2.SIZES["tiny"], batch=batch, seq=seq))[1]
    program = capture(model, inputs)
    ctx = PassContext(resolve(plan.mesh, hardware))
    ShapesPass().run(program, ctx)
    StrategiesPass().run(program, ctx)
    options = program.table("strategies")
    program.tables["choice"] = {
        name: next(s for s in options[name] if (s.in_specs, s.out_specs) == (chosen.in_specs, chosen.out_specs))
        for name, chosen in plan.strategies.items()}
    for later in (CollectivesPass(), RecomputePass(), PredictPass()):
        later.run(program, ctx)
    return program.table("predicted").step_time_s


def test_the_formula_at_the_planning_sizes_is_the_predicted_step_time(planned):
    _, plan, _ = planned
    formula = plan.cost_formula()
    assert {s.name for s in formula.free_symbols} == {"batch", "seq"}
    assert plan.evaluate() == pytest.approx(plan.predicted.step_time_s, rel=1e-12)
    assert float(formula.subs({sympy.Symbol("batch", positive=True, integer=True): 8,
                               sympy.Symbol("seq", positive=True, integer=True): 32})) == \
        pytest.approx(plan.predicted.step_time_s, rel=1e-12)


@pytest.mark.parametrize("batch, seq", [(16, 32), (8, 16), (32, 8)])
def test_the_formula_at_other_sizes_matches_pricing_a_capture_at_those_sizes(planned, batch, seq):
    model, plan, hw = planned
    assert plan.evaluate(batch=batch, seq=seq) == pytest.approx(reprice(plan, model, hw, batch, seq), rel=1e-9)


def test_collective_bytes_scale_as_their_formulas_say(planned):
    _, plan, _ = planned
    f = plan.formula
    batch, seq = f.symbols["batch"], f.symbols["seq"]
    for r, i in plan.collectives():
        nbytes = f.collective_bytes[f"{r.id}.{i}"]
        assert float(nbytes.subs({batch: 8, seq: 32})) == pytest.approx(r.step_bytes[i])
        if r.is_async:  # a gradient is the size of its parameter, whatever the batch
            assert nbytes.free_symbols == set(), (r, nbytes)
    activations = [f.collective_bytes[f"{r.id}.{i}"] for r, i in plan.collectives(phase="forward")]
    assert any(sympy.degree(b, batch) == 1 and sympy.degree(b, seq) == 1 for b in activations)


def test_the_formula_survives_the_plan_file_and_shows_in_the_summary(planned):
    _, plan, _ = planned
    loaded = autopar.Plan.from_json(plan.to_json())
    assert loaded.evaluate(batch=16) == plan.evaluate(batch=16)
    text = plan.summary()
    assert "as formulas of batch, seq" in text and "*batch*seq bytes" in text


def test_bad_requests_for_formulas_are_explained(planned, fast_network):
    _, plan, _ = planned
    with pytest.raises(AutoparError, match="unknown size"):
        plan.evaluate(tokens=3)
    with pytest.raises(AutoparError, match="positive integer"):
        plan.evaluate(batch=0)
    model, inputs = gpt2.make("tiny")
    plain = autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network)
    with pytest.raises(AutoparError, match="symbolic_dims"):
        plain.cost_formula()
    with pytest.raises(AutoparError, match="no example input has dim 5"):
        autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network, symbolic_dims={"batch": 5})


def test_the_formula_hides_prefetched_gathers_as_the_prediction_does(fast_network):
    """A ZeRO-3 layout whose parameter gathers start a layer ahead: the formula prices them partly
    hidden under compute (Hardware.gradient_overlap) exactly as the predicted step time does."""
    model, inputs = gpt2.make("tiny")
    pin = {n: "S(0)" if p.shape[0] % 4 == 0 else "R" for n, p in model.named_parameters()}
    plan = autopar.plan(model, inputs, mesh="dp=4", hardware=fast_network, symbolic_dims=SIZES, pin=pin)
    assert plan.prefetch and fast_network.gradient_overlap > 0
    assert plan.evaluate() == pytest.approx(plan.predicted.step_time_s, rel=1e-12)
    gathers = sum(r.step_seconds[0] for r in plan.redistributions
                  if r.steps[0].kind == "all_gather" and r.phase == "forward")
    assert plan.predicted.hidden_communication_s > 0 and gathers > 0
