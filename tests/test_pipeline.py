"""Pipelines: torch's schedules as action lists, the event simulator against the closed forms and
against an independent timing of hand-built lists, the stage partition against brute force, and
planning with a pp axis (partition, schedule and micro-batch search, inspection, refusals)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
import warnings

import pytest

import autopar
from autopar.cost_models.hardware import PRESETS, Link
from autopar.cost_models.pipeline_schedules import Action, action_lists, stage_ranks
from autopar.cost_models.pipeline_sim import StageTimes, in_flight, simulate
from autopar.errors import AutoparError, MeshError
from autopar.ir.pipeline import Pipeline
from autopar.solvers.stage_partition import Chain, partition, pipeline_time
from examples import gpt2
from examples.hf_zoo import llama3_shaped
from tests.composition import budget_below_by_half_activations
from tests.workers import FAST

# ---- the simulator on torch's action lists -------------------------------------------------


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_simulator_equals_the_closed_forms_on_uniform_stages(p, m):
    f, b = 1.0, 2.0
    ideal = m * (f + b)

    def span(schedule, virtual, stage):
        return simulate(action_lists(schedule, p, m, virtual), [stage] * (p * virtual)).makespan_s

    gpipe = simulate(action_lists("GPipe", p, m), [StageTimes(f, b, 0.0)] * p)
    assert gpipe.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))  # of the ranks' whole time
    assert (span("1F1B", 1, StageTimes(f, b, 0.0)) - ideal) / ideal == pytest.approx((p - 1) / m)
    # interleaved: v chunks of 1/v of a stage's work each
    v = 2
    chunk = StageTimes(f / v, b / v, 0.0)
    assert (span("Interleaved1F1B", v, chunk) - ideal) / ideal == pytest.approx((p - 1) / (v * m))
    # ZB-H1 (InterleavedZeroBubble on one stage per rank) with F = I = W
    zb = span("InterleavedZeroBubble", 1, StageTimes(1.0, 1.0, 1.0))
    assert (zb - 3 * m) / (3 * m) == pytest.approx((p - 1) / (3 * m))


def _relaxed_timing(actions: dict, stages: list) -> float:
    """An independent timing: every action's start as the fixed point of ``start = max(end of
    the rank's previous action, arrival of its inputs)``, iterated over all actions at once."""
    rank_of = {a.stage: r for r, acts in actions.items() for a in acts}
    end = {(a.stage, a.kind, a.microbatch): 0.0 for acts in actions.values() for a in acts}

    def arrival(key, source, target):
        s = stages[min(source, target)].send_s if rank_of[source] != rank_of[target] else 0.0
        return end[key] + s

    for _ in range(10_000):
        changed = False
        for _r, acts in actions.items():
            clock = 0.0
            for a in acts:
                deps = []
                if a.kind == "F" and a.stage > 0:
                    deps.append(arrival((a.stage - 1, "F", a.microbatch), a.stage - 1, a.stage))
                if a.kind in ("B", "I"):
                    deps.append(end[a.stage, "F", a.microbatch])
                    if a.stage + 1 in rank_of:
                        key = (a.stage + 1, "B", a.microbatch) if (a.stage + 1, "B", a.microbatch) in end else \
                            (a.stage + 1, "I", a.microbatch)
                        deps.append(arrival(key, a.stage + 1, a.stage))
                if a.kind == "W":
                    deps.append(end[a.stage, "I", a.microbatch])
                start = max([clock] + deps)
                new_end = start + stages[a.stage].duration(a.kind)
                if new_end != end[a.stage, a.kind, a.microbatch]:
                    end[a.stage, a.kind, a.microbatch], changed = new_end, True
                clock = new_end
        if not changed:
            return max(end.values())
    raise AssertionError("no fixed point")


def test_simulator_equals_an_independent_timing_of_hand_built_lists():
    # two ranks, uneven stages, a split backward on rank 1 and a send on the boundary
    actions = {0: [Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1)],
               1: [Action(1, "F", 0), Action(1, "I", 0), Action(1, "F", 1), Action(1, "I", 1), Action(1, "W", 0),
                   Action(1, "W", 1)]}
    stages = [StageTimes(1.0, 1.5, 0.5, send_s=0.25), StageTimes(2.0, 1.0, 3.0)]
    timeline = simulate(actions, stages)
    assert timeline.makespan_s == pytest.approx(_relaxed_timing(actions, stages))
    # by hand: 0F0 0-1, 0F1 1-2; 1F0 1.25-3.25, 1I0 -4.25, 1F1 -6.25, 1I1 -7.25, 1W0 -10.25, 1W1 -13.25;
    # 0B0 waits for 1I0 + send: 4.5-6.5; 0B1: 7.5-9.5
    assert timeline.makespan_s == pytest.approx(13.25)
    assert timeline.rank_end_s(0) == pytest.approx(9.5)
    random.seed(3)
    for schedule, p, m, v in [("1F1B", 4, 8, 1), ("Interleaved1F1B", 2, 4, 2), ("ZBVZeroBubble", 2, 4, 2),
                              ("InterleavedZeroBubble", 4, 8, 1), ("DualPipeV", 2, 4, 2), ("GPipe", 3, 5, 1)]:
        acts = action_lists(schedule, p, m, v)
        stages = [StageTimes(random.uniform(0.5, 2), random.uniform(0.5, 2), random.uniform(0.1, 1),
                             random.uniform(0, 0.3)) for _ in range(p * v)]
        assert simulate(acts, stages).makespan_s == pytest.approx(_relaxed_timing(acts, stages)), schedule


def test_a_deadlocked_order_is_refused_naming_the_stuck_actions():
    actions = {0: [Action(0, "B", 0), Action(0, "F", 0)], 1: [Action(1, "F", 0), Action(1, "B", 0)]}
    with pytest.raises(AutoparError, match="deadlocks: rank actions 0B0"):
        simulate(actions, [StageTimes(1, 1, 0)] * 2)


def test_schedules_keep_the_micro_batches_their_papers_say_in_flight():
    p, m = 4, 8
    for s, acts in action_lists("1F1B", p, m).items():
        assert in_flight(acts) == {s: p - s}  # torch's 1F1B warms up p - s forwards on stage s
    assert all(in_flight(acts) == {s: m} for s, acts in action_lists("GPipe", p, m).items())
    assert stage_ranks("ZBVZeroBubble", 4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert stage_ranks("Interleaved1F1B", 4, 2) == (0, 1, 2, 3, 0, 1, 2, 3)
    with pytest.raises(AutoparError, match="cannot run 2 micro-batches"):
        action_lists("DualPipeV", 2, 2, 2)
    with pytest.raises(AutoparError, match="unknown pipeline schedule 'PipeDream'"):
        action_lists("PipeDream", 2, 4)


# ---- the stage partition -------------------------------------------------------------------


def _brute_force(chain: Chain, stages: int, m: int, held, budget):
    n, best = len(chain), None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0,) + cuts + (n,)
        ranges = list(zip(bounds[:-1], bounds[1:]))
        if any(sum(chain.static_bytes[i:j]) + held[s] * sum(chain.activation_bytes[i:j]) > budget[s]
               for s, (i, j) in enumerate(ranges)):
            continue
        times = [sum(chain.seconds[i:j]) + (chain.boundary_s[j - 1] if j < n else 0.0) for i, j in ranges]
        value = pipeline_time(times, m)
        best = value if best is None or value < best else best
    return best


def test_stage_partition_equals_brute_force_on_short_chains():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 8)
        stages, m = rng.randint(1, n), rng.randint(1, 8)
        chain = Chain([rng.uniform(0.1, 2) for _ in range(n)], [rng.uniform(0, 3) for _ in range(n)],
                      [rng.uniform(0, 1) for _ in range(n)], [rng.uniform(0, 0.5) for _ in range(n - 1)])
        held = [max(1, stages - s) for s in range(stages)]
        budget = [rng.uniform(2, 10)] * stages
        found, expected = partition(chain, stages, m, held, budget), _brute_force(chain, stages, m, held, budget)
        assert (found is None) == (expected is None)
        if found is not None:
            assert found.objective_s == pytest.approx(expected)
            assert [j for _, j in found.ranges[:-1]] == [i for i, _ in found.ranges[1:]]  # contiguous


# ---- planning with a pp axis ---------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_pipeline():
    model, inputs = gpt2.make("demo")
    return model, inputs, autopar.plan(model, inputs, mesh="pp=2,dp=2", cache=False)


def test_a_pp_mesh_plans_stages_schedule_and_micro_batches(demo_pipeline):
    model, inputs, plan = demo_pipeline
    pl = plan.pipeline
    assert plan.device_mesh == autopar.Mesh.of(pp=2, dp=2) and plan.mesh == autopar.Mesh.of(dp=2)
    units = [u for st in pl.stages for u in st.units]
    assert units == ["<before layers>", "blocks.0", "blocks.1", "<after layers>"]  # every unit once, in order
    assert [st.rank for st in pl.stages] == list(stage_ranks(pl.schedule, 2, pl.virtual))
    assert pl.microbatches in (2, 4, 8) and inputs[0].shape[0] % pl.microbatches == 0
    priced = [c for c in pl.candidates if math.isfinite(c.step_time_s)]
    assert {c.schedule for c in priced} >= {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble",
                                            "ZBVZeroBubble", "DualPipeV"}
    assert pl.candidates[0].step_time_s == plan.predicted.step_time_s == pl.step_time_s == min(
        c.step_time_s for c in pl.candidates)
    # the stages' memory and the timeline are what the step was priced with
    assert plan.predicted.peak_memory_bytes == pytest.approx(max(pl.rank_peak_bytes))
    assert max(b.end_s for b in pl.timeline) <= pl.step_time_s
    assert plan.predicted.step_time_s == pytest.approx(plan.predicted.compute_s + plan.predicted.communication_s
                                                       + plan.predicted.bubble_s)
    again = autopar.Plan.from_json(plan.to_json())
    assert again.pipeline == pl and again.hash == plan.hash


def test_a_pipeline_is_inspectable(demo_pipeline):
    _, _, plan = demo_pipeline
    summary = plan.summary()
    assert "mesh (pp=2, dp=2)" in summary and f"schedule {plan.pipeline.schedule}" in summary
    for st in plan.pipeline.stages:  # a row per stage: its units
        assert (st.units[0] if len(st.units) == 1 else f"{st.units[0]} .. {st.units[-1]}") in summary
    why = plan.explain("pp")
    assert why.splitlines()[2].split()[0] == "schedule" and "->" + plan.pipeline.schedule in why
    assert "ruled out" in why and "why: the least predicted step time" in why
    from autopar.inspect.report_html import render_html

    page = render_html(plan)
    section = page[page.index('<section class="pipeline">'):]
    section = section[:section.index("</section>")]
    assert section.count("<title>") == len(plan.pipeline.timeline) + plan.pipeline.pp  # each block, each rank's idle
    assert all(f"<title>{b.action}: " in section for b in plan.pipeline.timeline)


def test_pinned_schedule_and_micro_batches_are_kept_and_priced_by_the_simulator(demo_pipeline):
    model, inputs, _ = demo_pipeline
    plan = autopar.plan(model, inputs, mesh="pp=2,dp=2", schedule="1F1B", microbatches=4, cache=False)
    pl = plan.pipeline
    assert (pl.schedule, pl.microbatches, pl.virtual) == ("1F1B", 4, 1)
    stages = [StageTimes(st.forward_s, st.backward_input_s, st.backward_weight_s, st.send_s) for st in pl.stages]
    assert max(b.end_s for b in pl.timeline) == pytest.approx(simulate(action_lists("1F1B", 2, 4), stages).makespan_s)
    assert all(st.in_flight == 2 - st.index for st in pl.stages)


def test_a_budget_only_the_micro_batches_in_flight_exceed_is_met_by_recomputing(demo_pipeline):
    """Below a 1F1B pipeline's peak by half its activations, with the state as it was (no ZeRO on
    one dp rank): the first stage's micro-batches in flight fit only by recomputing, which the
    micro-batch's program chooses when fitted with them; every rank's peak, the in-flight
    activations included, is under the budget. With recompute="none" the stages' state goes to
    host memory (offload's last lever), and with offload=False as well it is refused."""
    model, inputs, _ = demo_pipeline
    options = dict(mesh="pp=2", schedule="1F1B", microbatches=4, cache=False)
    free = autopar.plan(model, inputs, recompute="none", **options)
    budget = budget_below_by_half_activations(free)
    plan = autopar.plan(model, inputs, memory_budget=budget, **options)
    assert plan.recompute and not free.recompute
    assert max(plan.pipeline.rank_peak_bytes) <= budget < max(free.pipeline.rank_peak_bytes)
    assert "micro-batches' saved activations in flight" in plan.history[0].note
    assert plan.pipeline.offload is None
    offloaded = autopar.plan(model, inputs, memory_budget=budget, recompute="none", **options)
    assert offloaded.pipeline.offload is not None and not offloaded.recompute
    with pytest.raises(AutoparError, match="no balanced partition fits the memory budget"):
        autopar.plan(model, inputs, memory_budget=budget, recompute="none", offload=False, **options)


def test_stages_in_host_memory_fit_a_budget_only_more_micro_batches_in_flight_than_pp_meet():
    """bf16-mixed with the stages' state in host memory, below the pipeline's peak by half its
    activations: the first stage's two layers hold more than the pp or 2 pp micro-batches' worth
    the micro-batch was once fitted with, so it is fitted with more (doubling), and every
    rank's peak is under the budget."""
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=96, seq=64, layers=2, heads=2, width=48, batch=8))
    options = dict(mesh="pp=2,dp=2", schedule="1F1B", microbatches=4, cache=False, precision="bf16-mixed",
                   offload=True, hardware=FAST)
    free = autopar.plan(model, inputs, recompute="none", **options)
    budget = budget_below_by_half_activations(free)
    plan = autopar.plan(model, inputs, memory_budget=budget, **options)
    in_flight = int(re.search(r"with (\d+) micro-batches' saved activations in flight", plan.history[0].note)[1])
    assert in_flight > 2 * 2 and plan.recompute and plan.pipeline.offload is not None
    assert max(plan.pipeline.rank_peak_bytes) <= budget < max(free.pipeline.rank_peak_bytes)


def test_pipeline_options_are_refused_where_they_cannot_apply(demo_pipeline):
    model, inputs, plan = demo_pipeline
    with pytest.raises(MeshError, match="'pp' goes first"):
        autopar.plan(model, inputs, mesh="dp=2,pp=2")
    with pytest.raises(AutoparError, match="no 'pp' axis"):
        autopar.plan(model, inputs, mesh="dp=2", schedule="1F1B")
    with pytest.raises(AutoparError, match="unknown pipeline schedule"):
        autopar.plan(model, inputs, mesh="pp=2", schedule="Looped")
    with pytest.raises(AutoparError, match="microbatches=3 does not divide the batch of 8"):
        autopar.plan(model, inputs, mesh="pp=2", microbatches=3)


def test_a_model_without_repeated_layers_is_not_pipelined():
    from examples import mlp

    model, inputs = mlp.make()
    with pytest.raises(AutoparError, match="between repeated layers"):
        autopar.plan(model, inputs, mesh="pp=2", cache=False)


def test_json_of_a_pipeline_round_trips_its_infinite_candidates(demo_pipeline):
    _, _, plan = demo_pipeline
    body = json.loads(plan.to_json())["pipeline"]
    assert Pipeline.from_json(body) == plan.pipeline


# ---- cost model: when a pipeline pays --------------------------------------------------------


@pytest.mark.slow  # a mesh search over every pp, dp and tp of 16 devices
def test_the_planner_pipelines_across_slow_links_and_not_inside_a_fast_node():
    """Llama-70B-shaped layers (8 of them, to keep the test short) on 8 nodes x 8 H100s with
    25 GB/s between nodes: a pipeline over the nodes beats data parallelism across them; on one
    node (NVLink) tensor parallelism beats a pipeline."""
    model, inputs = llama3_shaped("70b", batch=8, seq=4096, layers=8)
    slow = dataclasses.replace(PRESETS["h100-sxm"], inter_node=Link(25e9, 5e-6))
    # the LPs of the 8x8 layouts need 13-18k simplex iterations: a smaller work limit leaves them unsolved
    options = dict(optimizer="adam-mixed", microbatches=8, cache=False, solver_work_limit=25_000, offload=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the solver's work limit on the 2-D layouts
        across = autopar.plan(model, inputs, mesh=["dp=8,tp=8", "pp=8,dp=1,tp=8"], hardware=slow, **options)
        inside = autopar.plan(model, inputs, mesh=["dp=1,tp=8", "pp=2,dp=1,tp=4"], hardware="h100-sxm", **options)
    assert across.pipeline is not None and across.pipeline.pp == 8
    assert inside.pipeline is None and inside.mesh == autopar.Mesh.of(dp=1, tp=8)


def test_megatron_3d_baselines_split_layers_evenly_and_are_priced_by_the_simulator():
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=256, seq=32, layers=4, heads=4, width=128, batch=8))
    plans = autopar.baselines(model, inputs, devices=16, hardware="h100-sxm", tp_degrees=[4],
                              only=["megatron-pp2-tp4-1f1b", "megatron-pp2-tp4-interleaved"])
    assert sorted(plans) == ["megatron-pp2-tp4-1f1b", "megatron-pp2-tp4-interleaved"]
    for name, schedule in (("megatron-pp2-tp4-1f1b", "1F1B"), ("megatron-pp2-tp4-interleaved", "Interleaved1F1B")):
        plan = plans[name]
        pl = plan.pipeline
        assert plan.device_mesh == autopar.Mesh.of(pp=2, dp=2, tp=4) and pl.schedule == schedule
        assert pl.microbatches == inputs[0].shape[0] // 2  # one sample per dp rank in each micro-batch
        layers = [sum(u.startswith("blocks.") for u in st.units) for st in pl.stages]
        assert max(layers) - min(layers) <= 1 and pl.stages[0].units[0] == "<before layers>"
        stages = [StageTimes(st.forward_s, st.backward_input_s, st.backward_weight_s, st.send_s) for st in pl.stages]
        timeline = simulate(action_lists(schedule, 2, pl.microbatches, pl.virtual), stages)
        assert max(b.end_s for b in pl.timeline) == pytest.approx(timeline.makespan_s)


def test_megatron_pins_split_projections_over_tp_and_everything_over_dp_and_an_unknown_baseline_is_named():
    from autopar.baseline_plans import megatron_pins

    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=96, seq=16, layers=2, heads=2, width=48, batch=8))
    pins = megatron_pins(model, tp=2, dp=2)
    assert pins["blocks.0.attn.q.weight"] == "S(1),S(0)"  # column-parallel over tp, its other dim over dp
    assert pins["blocks.0.attn.proj.weight"] == "S(0),S(1)"  # row-parallel
    assert pins["blocks.0.ln1.weight"] == "S(0),R"
    assert set(megatron_pins(model, tp=2).values()) <= {"R,R", "R,S(0)", "R,S(1)"}
    with pytest.raises(AutoparError, match="no baseline named 'megatron-tp3-sp'"):
        autopar.baselines(model, inputs, devices=4, only=["megatron-tp3-sp"])
    with pytest.raises(AutoparError, match="no baseline named 'megatron-pp2-tp4-1f1b'"):  # 4 devices fill no node
        autopar.baselines(model, inputs, devices=4, only=["megatron-pp2-tp4-1f1b"])


def test_explain_of_a_pipelined_plan_reads_the_stage_layout(demo_pipeline):
    _, _, plan = demo_pipeline
    assert "blocks.0.fc.weight" in str(plan.explain("blocks.0.fc.weight"))


def test_the_command_line_pins_the_schedule_and_micro_batches(capsys):
    from autopar.cli import main as cli

    assert cli(["plan", "examples.gpt2:factory", "--mesh", "pp=2,dp=2", "--schedule", "GPipe", "--microbatches", "4",
                "--quiet", "--no-cache"]) == 0
    assert "schedule GPipe, 4 micro-batches" in capsys.readouterr().out
