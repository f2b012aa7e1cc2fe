"""K-FAC's work planned into a pipeline's bubbles (autopar.planning.bubbles) and run on gloo
against an independent single-process K-FAC (tests/kfac_reference.py): loss and parameters
after three steps, every placed piece where its dependencies allow."""
from __future__ import annotations

import io
import re

import pytest
import torch
from torch import nn

import autopar
from autopar.errors import AutoparError
from autopar.inspect.report_html import render_html
from autopar.ir.bubbles import END, FACTOR, INVERT, PRECONDITION, REDUCE, START, TAIL
from autopar.runtime.local_cluster import get_cluster
from examples import gpt2, ill_conditioned
from tests import pipeline_workers, workers
from tests.kfac_reference import reference_kfac

SETTINGS = dict(lr=0.05, momentum=0.9, damping=1e-2, factor_decay=0.9, kl_clip=1e-2)


class DeepTanh(nn.Module):
    """A deep tanh regression: a chain of layers, each a unit of the pipeline."""

    def __init__(self, width: int = 16, depth: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return ((x - y) ** 2).mean()


def _deep():
    torch.manual_seed(0)
    return DeepTanh(), (torch.randn(8, 3, 16), torch.randn(8, 3, 16))


def _kfac_plan(model, inputs, mesh, schedule, inv_every=None, microbatches=4):
    return autopar.plan(model, inputs, mesh=mesh, schedule=schedule, microbatches=microbatches, optimizer="kfac",
                        inv_every=inv_every, hardware=workers.FAST)


def _run(model, inputs, plan, steps=3, autoparallelized=False):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    ranks = get_cluster(plan.device_mesh.size).run(pipeline_workers.train_kfac, buffer.getvalue(), inputs,
                                                   plan.to_json(), steps, SETTINGS, autoparallelized)
    params = {}
    for r in ranks:
        params.update(r["params"])
    return ranks[0]["losses"], params, ranks


def _reference(model, inputs, plan, steps=3):
    fill = plan.pipeline.fill
    phases = {(w.layers[0].removesuffix(".weight"), w.microbatch): w.phase for w in fill.work if w.kind == FACTOR}
    return reference_kfac(model, inputs, steps, plan.pipeline.microbatches,
                          [w.removesuffix(".weight") for w in fill.layers], refresh=fill.refresh,
                          factor_phase=phases, **SETTINGS)


def _assert_matches(model, inputs, plan, autoparallelized=False):
    losses, params, ranks = _run(model, inputs, plan, autoparallelized=autoparallelized)
    want_losses, want_params = _reference(model, inputs, plan)
    assert all(r["losses"] == losses for r in ranks)  # every rank reports the batch's loss
    assert losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    assert set(params) == set(want_params)
    for name, value in want_params.items():
        torch.testing.assert_close(params[name], value, rtol=2e-4, atol=2e-5, msg=name)
    moved = max(float((want_params[n] - p.detach()).abs().max()) for n, p in model.named_parameters())
    assert moved > 1e-3  # the steps changed the weights: the comparison is not of untouched values


def test_kfac_on_two_stages_equals_the_single_process_reference():
    """As a user runs it: autoparallelize with the K-FAC plan, autopar.KFAC on the model."""
    model, inputs = _deep()
    plan = _kfac_plan(model, inputs, "pp=2", "1F1B", inv_every=1)
    assert plan.pipeline.fill.refresh == 1
    _assert_matches(model, inputs, plan, autoparallelized=True)


def test_kfac_refreshed_every_second_step_on_data_parallel_stages_equals_the_reference():
    """pp=2,dp=2 under a zero-bubble schedule: factors averaged over the stage's devices, a
    cycle of two steps whose factors are computed in either step, as the plan placed them."""
    model, inputs = _deep()
    plan = _kfac_plan(model, inputs, "pp=2,dp=2", "ZBVZeroBubble", inv_every=2)
    fill = plan.pipeline.fill
    assert fill.refresh == 2 and any(w.kind == REDUCE for w in fill.work)
    _assert_matches(model, inputs, plan)


def test_kfac_on_a_gpt2_style_decoder_equals_the_reference():
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=64, seq=8, layers=2, heads=2, width=32, batch=8))
    plan = _kfac_plan(model, inputs, "pp=2", "InterleavedZeroBubble", inv_every=1)
    fill = plan.pipeline.fill
    assert {"blocks.0.attn.q.weight", "blocks.1.fc.weight", "head.weight"} <= set(fill.layers)
    assert "wte.weight" in fill.first_order and "blocks.0.fc.bias" in fill.first_order
    _assert_matches(model, inputs, plan)


# ---- the placement ------------------------------------------------------------------------------


def _check_placement(plan) -> None:
    """Every piece after what it needs, none overlapping another on its rank, and the simulated
    step with the pieces in it (each delaying its action's rank, and that action's sends) no
    longer than without them plus the margin."""
    from autopar.cost_models.pipeline_schedules import action_lists
    from autopar.cost_models.pipeline_sim import StageTimes, simulate
    from autopar.passes.predict import exposed

    pipeline, fill = plan.pipeline, plan.pipeline.fill
    ends = {str(b.action): b.end_s for b in pipeline.timeline}
    work = {w.name: w for w in fill.work}
    for w in fill.work:
        if w.kind == FACTOR:
            assert w.start_s >= min(ends[f"{w.stage}{k}{w.microbatch}"] for k in "WB" if
                                    f"{w.stage}{k}{w.microbatch}" in ends) - 1e-15
        needs = {REDUCE: [FACTOR], INVERT: [REDUCE if plan.mesh.size > 1 else FACTOR]}.get(w.kind, [])
        if w.kind == PRECONDITION and w.phase == fill.refresh - 1:
            needs = [INVERT]
        for other in fill.work:
            if other.kind in needs and other.stage == w.stage and set(other.layers) & set(w.layers):
                assert (other.phase, other.end_s) <= (w.phase, w.start_s + 1e-15), (other.name, w.name)
    for a in fill.work:
        for b in fill.work:
            if a is not b and (a.rank, a.phase) == (b.rank, b.phase):
                assert a.end_s <= b.start_s + 1e-15 or b.end_s <= a.start_s + 1e-15, (a.name, b.name)
    actions = action_lists(pipeline.schedule, pipeline.pp, pipeline.microbatches, pipeline.virtual)
    times = [StageTimes(s.forward_s, s.backward_input_s, s.backward_weight_s, s.send_s) for s in pipeline.stages]
    syncs = {}  # a stage's last weight gradients run its gradient syncs too
    for s in pipeline.stages:
        last = [str(b.action) for b in pipeline.timeline if re.fullmatch(f"{s.index}[BW][0-9]+", str(b.action))][-1]
        syncs[last] = exposed(s.sync_s, s.backward_s, workers.FAST.gradient_overlap)
    plain = simulate(actions, times, syncs).makespan_s
    first = {r: min(b.start_s for b in pipeline.timeline if b.rank == r) for r in range(pipeline.pp)}
    last = {r: max(b.end_s for b in pipeline.timeline if b.rank == r) for r in range(pipeline.pp)}
    for w in work.values():  # work at a step's start ends before the rank's first input can arrive
        if w.after == START:
            assert w.end_s <= first[w.rank] - fill.margin_s + 1e-15
        if w.after == END:  # after the rank's last action, within the step
            assert last[w.rank] - 1e-15 <= w.start_s and w.end_s <= pipeline.step_time_s - fill.margin_s + 1e-15
    for phase in range(fill.refresh):
        extra = dict(syncs)
        for w in work.values():
            if w.phase == phase and w.after not in (START, END, TAIL):
                extra[w.after] = extra.get(w.after, 0.0) + w.end_s - w.start_s
        assert simulate(actions, times, extra).makespan_s <= plain + fill.margin_s + 1e-15


@pytest.mark.parametrize("mesh,schedule", [("pp=2", "GPipe"), ("pp=2", "1F1B"), ("pp=2,dp=2", "ZBVZeroBubble"),
                                           ("pp=4", "InterleavedZeroBubble"), ("pp=2", "DualPipeV")])
def test_placed_work_follows_its_inputs_and_never_delays_the_pipeline(mesh, schedule):
    torch.manual_seed(0)
    model = DeepTanh(width=64, depth=8)
    inputs = (torch.randn(16, 32, 64), torch.randn(16, 32, 64))
    plan = _kfac_plan(model, inputs, mesh, schedule, microbatches=8)
    fill = plan.pipeline.fill
    _check_placement(plan)
    assert fill.step_first_order_s <= fill.step_filled_s <= fill.step_unfilled_s
    if all(w.after != TAIL for w in fill.work):  # (work past the step's end leaves the other ranks idle)
        assert fill.bubble_after < fill.bubble_before
    assert len([w for w in fill.work if w.kind == FACTOR]) == 8 * 8  # each layer's factors of each micro-batch
    assert plan.predicted.step_time_s == fill.step_filled_s


def test_a_zero_bubble_schedule_holds_k_fac_work_in_its_bubbles():
    """Where the schedule leaves bubbles after its weight-gradient actions, curvature work goes
    there: the filled step is shorter than K-FAC's work run after the step."""
    torch.manual_seed(0)
    model = DeepTanh(width=64, depth=8)
    inputs = (torch.randn(16, 32, 64), torch.randn(16, 32, 64))
    plan = _kfac_plan(model, inputs, "pp=4", "InterleavedZeroBubble", microbatches=8)
    fill = plan.pipeline.fill
    in_gaps = [w for w in fill.work if w.after != TAIL]
    assert len(in_gaps) > len(fill.work) / 2 and fill.step_filled_s < fill.step_unfilled_s
    assert {w.kind for w in in_gaps} >= {FACTOR, INVERT}


def test_a_kfac_plan_round_trips_through_json_and_its_hash_names_the_placement():
    model, inputs = _deep()
    plan = _kfac_plan(model, inputs, "pp=2", "1F1B", inv_every=2)
    again = autopar.Plan.from_json(plan.to_json())
    assert again.pipeline.fill == plan.pipeline.fill and again.hash == plan.hash
    first_order = autopar.plan(model, inputs, mesh="pp=2", schedule="1F1B", microbatches=4, optimizer="sgd",
                               hardware=workers.FAST)
    assert first_order.pipeline.fill is None and first_order.hash != plan.hash


def test_kfac_options_are_checked_with_the_reason():
    model, inputs = _deep()
    with pytest.raises(AutoparError, match="no 'pp' axis"):
        autopar.plan(model, inputs, mesh="dp=2", optimizer="kfac")
    with pytest.raises(AutoparError, match="inv_every"):
        autopar.plan(model, inputs, mesh="pp=2", optimizer="kfac", inv_every=0)
    with pytest.raises(AutoparError, match="inv_every"):
        autopar.plan(model, inputs, mesh="pp=2", optimizer="adam", inv_every=2)


def test_kfac_on_tensor_parallel_stages_equals_the_reference():
    """pp=2 x tp=2: features split over tp are gathered for the factors, and split gradients for
    their preconditioning (each device keeps its block)."""
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=64, seq=8, layers=2, heads=2, width=32, batch=8))
    plan = _kfac_plan(model, inputs, "pp=2,tp=2", "1F1B", inv_every=1)
    from autopar.lowering.curvature import curvature_layers

    layers = curvature_layers(plan)[0]
    assert any(la.weight_gathers for la in layers) and any(any(g) for la in layers for g in la.operand_gathers)
    _assert_matches(model, inputs, plan)


def test_kfac_needs_linear_layers():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return torch.tanh(x * self.scale)

    class Scales(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Scale() for _ in range(4))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x.square().mean()

    with pytest.raises(AutoparError, match="linear layers"):
        autopar.plan(Scales(), (torch.randn(8, 8),), mesh="pp=2", schedule="1F1B", microbatches=4,
                     optimizer="kfac", hardware=workers.FAST)


def test_the_summary_and_the_report_show_what_fills_the_bubbles():
    torch.manual_seed(0)
    model = DeepTanh(width=64, depth=8)
    inputs = (torch.randn(16, 32, 64), torch.randn(16, 32, 64))
    plan = _kfac_plan(model, inputs, "pp=4", "InterleavedZeroBubble", microbatches=8)
    fill = plan.pipeline.fill
    summary = plan.summary()
    assert f"curvature refreshed every {fill.refresh} step(s)" in summary
    assert f"bubble {fill.bubble_before:.1%} -> {fill.bubble_after:.1%}" in summary
    assert "first-order (not linear weights, or a factor wider than 8192): layers.0.bias" in summary
    assert f"curvature refreshed every {fill.refresh} step(s)" in plan.explain("pp")
    html = render_html(plan)
    assert html.count('class="filled"') == sum(w.phase == 0 for w in fill.work)
    first = next(w for w in fill.work if w.phase == 0 and w.after != TAIL)
    assert f"{first.name} (after {first.after})" in html


# ---- convergence ----------------------------------------------------------------------------------


def test_kfac_reaches_a_lower_loss_than_sgd_and_adamw_on_an_ill_conditioned_regression():
    """30 steps each; SGD (momentum 0.9) and AdamW at the best learning rate of a grid, K-FAC at
    lr 0.03, damping 1e-3, momentum 0.9, factor decay 0.95, KL clip 1e-2, run pipelined (pp=2)."""
    steps = 30
    model, inputs = ill_conditioned.make()
    sgd = min(ill_conditioned.loss_after(model, inputs, lambda p, lr=lr: torch.optim.SGD(p, lr=lr, momentum=0.9), steps)
              for lr in ill_conditioned.SGD_LRS)
    adamw = min(ill_conditioned.loss_after(model, inputs, lambda p, lr=lr: torch.optim.AdamW(p, lr=lr), steps)
                for lr in ill_conditioned.ADAMW_LRS)
    plan = _kfac_plan(model, inputs, "pp=2", "1F1B", inv_every=1)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    ranks = get_cluster(2).run(pipeline_workers.train_kfac, buffer.getvalue(), inputs, plan.to_json(), steps + 1,
                               ill_conditioned.KFAC_SETTINGS)
    kfac = ranks[0]["losses"][-1]  # the loss after `steps` updates
    assert kfac < 0.75 * adamw and kfac < 0.75 * sgd, (kfac, adamw, sgd)


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_the_greedy_placement_of_a_small_plan_against_the_exact_one(schedule):
    """On a plan small enough to search exhaustively, the exact placement is never slower than
    the greedy one, and both pass the solver's independent checker (benchmarks/bubbles.py
    prints the gap)."""
    from autopar.planning.bubbles import placement_problem
    from autopar.planning.request import resolve
    from autopar.solvers.bubble_fill import exact, verify

    torch.manual_seed(0)
    model = DeepTanh(width=32, depth=2)
    inputs = (torch.randn(4, 8, 32), torch.randn(4, 8, 32))
    plan = _kfac_plan(model, inputs, "pp=2", schedule, inv_every=1, microbatches=2)
    request = resolve("pp=2", workers.FAST, optimizer="kfac", schedule=schedule, microbatches=2, inv_every=1)
    problem, _ = placement_problem(plan, request, 1)
    assert 6 <= len(problem.items) <= 10
    greedy_fill, best = problem.solve(), exact(problem.items, problem.gaps, problem.step_end_s, 1,
                                               problem.margin_s, problem.headroom_bytes)
    for fill in (greedy_fill, best):
        verify(fill, problem.items, problem.gaps, problem.step_end_s, problem.margin_s, problem.headroom_bytes)
    assert best.mean_step_s <= greedy_fill.mean_step_s + 1e-15


def test_check_compares_a_kfac_plans_programs_with_eager():
    model, inputs = _deep()
    plan = _kfac_plan(model, inputs, "pp=2", "ZBVZeroBubble")
    report = autopar.check(model, inputs, plan=plan, steps=2)
    assert report.ok, str(report)


def make_deep():
    """A factory for the CLI: (model, example inputs)."""
    return _deep()


def test_the_cli_plans_kfac_and_shows_the_fill(capsys):
    from autopar.cli import main as cli

    code = cli(["plan", "tests.test_bubbles:make_deep", "--mesh", "pp=2", "--schedule", "ZBVZeroBubble",
                "--microbatches", "4", "--optimizer", "kfac", "--inv-every", "2", "--quiet", "--no-cache"])
    out = capsys.readouterr().out
    assert code == 0 and "K-FAC in the bubbles: 4 weights preconditioned, curvature refreshed every 2 step(s)" in out


def test_the_refresh_period_is_the_shortest_cycle_within_a_percent_of_the_best():
    """Longer cycles spread the curvature work over more steps' bubbles: the planner takes the
    shortest whose amortized step is within 1% of the best cycle's (up to 10 steps)."""
    from autopar.planning.bubbles import MAX_REFRESH, placement_problem
    from autopar.planning.request import resolve

    torch.manual_seed(0)
    model = DeepTanh(width=32, depth=4)
    inputs = (torch.randn(8, 64, 32), torch.randn(8, 64, 32))
    plan = _kfac_plan(model, inputs, "pp=2", "InterleavedZeroBubble")
    fill = plan.pipeline.fill
    request = resolve("pp=2", workers.FAST, optimizer="kfac", schedule="InterleavedZeroBubble", microbatches=4)
    steps = {r: placement_problem(plan, request, r)[0].solve().mean_step_s for r in range(1, MAX_REFRESH + 1)}
    assert 1 < fill.refresh < MAX_REFRESH  # (this instance is one where the search matters)
    assert fill.step_filled_s == pytest.approx(steps[fill.refresh], rel=1e-12)
    assert steps[fill.refresh] <= 1.01 * min(steps.values()) < steps[fill.refresh - 1]


@pytest.mark.parametrize("worker, refusal", [
    (pipeline_workers.kfac_accumulating_two_calls, "one step per training call"),  # gradients accumulated over calls
    (pipeline_workers.kfac_with_two_parameter_groups, "one learning rate"),  # a second parameter group
])
def test_kfac_refuses_what_it_cannot_precondition(worker, refusal):
    model, inputs = _deep()
    plan = _kfac_plan(model, inputs, "pp=2", "1F1B", inv_every=1)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    errors = get_cluster(2).run(worker, buffer.getvalue(), inputs, plan.to_json())
    assert all(e is not None and refusal in e for e in errors)


def test_a_zero_factor_is_damped_without_a_balance():
    """All-zero inputs give A = 0 (and a zero weight gradient): π has nothing to balance, the
    damped inverses stay finite and the preconditioned step is the zero it should be."""
    from autopar.runtime.kfac import damped_inverses

    g = torch.randn(8, 3)
    a_inv, g_inv = damped_inverses(torch.zeros(4, 4), g.t() @ g, 1e-2)
    assert torch.isfinite(a_inv).all() and torch.isfinite(g_inv).all()
    torch.testing.assert_close(a_inv, torch.eye(4) / 0.1)
    assert (g_inv @ torch.zeros(3, 4) @ a_inv).abs().max() == 0
