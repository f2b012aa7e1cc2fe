"""Scale features: repeated-layer clustering, the solver time limit, mesh search, baselines."""
import dataclasses
import re
import warnings

import pytest

import autopar
from autopar.capture.export import capture
from autopar.capture.module_paths import module_paths
from autopar.ir.mesh import Mesh
from autopar.planning.meshes import candidate_meshes
from examples import gpt2, mlp

# no dim of this decoder shares the sequence length (48) or batch x sequence (192), which the
# Megatron baselines without sequence parallelism recognise by size
SMALL = gpt2.GPT2Config(vocab=384, seq=48, layers=2, heads=4, width=128, batch=4)


def test_clustering_gives_the_unclustered_optimum_on_four_layers():
    model, inputs = gpt2.make(dataclasses.replace(gpt2.SIZES["small"], layers=4), device="meta")
    clustered = autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm")
    separate = autopar.plan(model, inputs, mesh="dp=4", hardware="h100-sxm", cluster_layers=False)
    note = next(r.note for r in clustered.history if r.name == "cluster_layers")
    assert note == "2 of 4 layers of blocks share layer 1's variables"
    assert clustered.solver.status == separate.solver.status == "optimal"
    assert clustered.solver.n_variables < separate.solver.n_variables
    assert clustered.solver.objective_s == pytest.approx(separate.solver.objective_s, rel=1e-9)
    # the shared layers really have one layout
    for name in ("attn.q.weight", "fc.weight", "out.weight"):
        assert clustered.param_spec(f"blocks.1.{name}") == clustered.param_spec(f"blocks.2.{name}")


def test_a_hit_time_limit_returns_a_valid_plan_with_its_gap(fast_network):
    model, inputs = gpt2.make("tiny")
    with pytest.warns(UserWarning, match=r"within \d+\.\d% of optimal|has no proven bound"):
        plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network, solver="mip",
                            solver_time_limit_s=1.0, cluster_layers=False)
    assert plan.solver.status == "feasible"
    assert 0.0 < plan.solver.gap <= 1.0
    assert plan.solver.bound_s <= plan.solver.objective_s
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)


def test_mesh_search_tries_every_factorisation_and_keeps_the_cheapest():
    hw = autopar.PRESETS["h100-sxm"]
    assert candidate_meshes(8, hw) == [Mesh.of(dp=8), Mesh.of(dp=4, tp=2), Mesh.of(dp=2, tp=4)]
    # 2 nodes of 8: tp groups inside a node (2, 4, 8) or spanning both (no 16 = the 1-D mesh), and a
    # pipeline of two stages, one node each, over each layout of a node
    assert [m.shape for m in candidate_meshes(16, hw)] == [(16,), (8, 2), (4, 4), (2, 8), (2, 8), (2, 4, 2),
                                                           (2, 2, 4)]
    assert [m.axis_names[0] for m in candidate_meshes(16, hw)[4:]] == ["pp"] * 3
    assert all("pp" not in m.axis_names for m in candidate_meshes(16, hw, pipelines=False))
    model, inputs = mlp.make(batch=16, width=256, hidden=1024)
    searched = autopar.plan(model, inputs, mesh=8, hardware="h100-sxm")
    each = {str(m): autopar.plan(model, inputs, mesh=m, hardware="h100-sxm").predicted.step_time_s
            for m in candidate_meshes(8, hw)}
    assert searched.predicted.step_time_s == pytest.approx(min(each.values()), rel=1e-9)
    assert str(searched.mesh) == min(each, key=each.get)
    note = searched.history[0].note
    assert searched.history[0].name == "mesh_search" and all(m in note for m in each)


def test_mesh_search_runs_the_full_program_only_on_2d_meshes_near_the_best():
    """With solver="mip" the sweep plans every mesh by the axis-by-axis descent; only 2-D meshes
    within 5% of the fastest get the full integer program (on 64 GPUs it takes 40-95 s per
    Llama-shaped mesh). LP first solves every mesh exactly in the sweep, and re-plans none."""
    from autopar.planning.pipeline import FINALIST_MARGIN as _FINALIST_MARGIN

    model, inputs = mlp.make(batch=8, width=1024, hidden=4096)
    messages = []
    exact = autopar.plan(model, inputs, mesh=16, hardware="h100-sxm", progress=messages.append, cache=False)
    assert not any("full integer program on" in m for m in messages)
    assert exact.solver.status == "optimal"
    messages = []
    searched = autopar.plan(model, inputs, mesh=16, hardware="h100-sxm", solver="mip", progress=messages.append,
                            cache=False)
    unit = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    swept = {}
    for m in messages:
        if m.startswith("mesh search: (") and ": " in m[len("mesh search: "):]:
            mesh, time_text = m[len("mesh search: "):].rsplit(": ", 1)
            value, suffix = time_text.split()
            swept.setdefault(mesh, float(value) * unit[suffix])  # the sweep reports each mesh first
    finalists = {m.split(" on ")[1].removesuffix(" ...") for m in messages if "full integer program on" in m}
    fastest = min(swept.values())
    expected = {mesh for mesh, t in swept.items() if "tp" in mesh and t <= fastest * (1 + _FINALIST_MARGIN)}
    assert len(swept) == 4 and finalists == expected
    assert 0 < len(finalists) < 3  # some 2-D meshes are left out: the margin decides
    assert searched.solver.status == "optimal"  # the winner's full program proved it
    assert exact.predicted.step_time_s == pytest.approx(searched.predicted.step_time_s, rel=1e-6)


def test_mesh_search_warns_once_and_for_the_winning_mesh_only():
    model, inputs = gpt2.make(SMALL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = autopar.plan(model, inputs, mesh=4, hardware="h100-sxm", solver="mip", solver_time_limit_s=0.01,
                            cache=False)
    stopped = [str(w.message) for w in caught if "did not prove" in str(w.message)]
    assert plan.solver.status == "feasible"
    assert len(stopped) == 1 and f"on mesh {plan.mesh};" in stopped[0]


def test_the_time_limit_warning_points_at_the_line_that_asked_for_the_plan():
    model, inputs = gpt2.make(SMALL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware="h100-sxm", solver="mip", solver_time_limit_s=0.01,
                     cache=False)
    stopped = [w for w in caught if "did not prove" in str(w.message)]
    assert len(stopped) == 1 and stopped[0].filename == __file__


def test_mesh_search_explains_a_bad_device_count():
    with pytest.raises(autopar.MeshError, match="process group"):
        candidate_meshes("auto", autopar.PRESETS["h100-sxm"])


@pytest.mark.slow  # a sweep: every baseline run on gloo
def test_baselines_are_real_plans_that_pass_check(fast_network):
    model, inputs = gpt2.make(SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        plans = autopar.baselines(model, inputs, devices=4, hardware=fast_network)
    assert set(plans) == {"dp", "zero3", "megatron-tp2", "megatron-tp2-sp", "megatron-tp2-fsdp",
                          "megatron-tp2-fsdp-sp", "megatron-tp4", "megatron-tp4-sp"}, plans.skipped
    megatron = plans["megatron-tp2"]
    assert str(megatron.param_spec("blocks.0.attn.q.weight")) == "(R, S(0))"  # column-parallel
    assert str(megatron.param_spec("blocks.0.attn.proj.weight")) == "(R, S(1))"  # row-parallel
    assert str(plans["zero3"].param_spec("blocks.0.fc.weight")) == "(S(0))"
    assert str(plans["megatron-tp2-fsdp"].param_spec("blocks.0.fc.weight")) == "(S(1), S(0))"
    # without sequence parallelism no activation is split along the sequence on tp
    for name, spec in megatron.strategies.items():
        node = megatron.graph.node(name)
        for meta, out in zip(node.outputs, spec.out_specs):
            p = out.placements[1]
            if meta is not None and isinstance(p, autopar.Shard) and node.op == "call":
                assert meta.shape[p.dim] not in (48, 192), (name, meta, out)
    # with sequence parallelism every norm runs on sequence shards over tp, forward and backward
    paths = module_paths(capture(model, inputs))
    for name in ("megatron-tp2-sp", "megatron-tp4-sp", "megatron-tp2-fsdp-sp"):
        plan, norms = plans[name], 0
        for node in plan.graph.nodes:
            if node.op == "call" and re.search(r"\.ln\w*$|^ln_f$", paths.get(node.name, "")):
                for meta, out in zip(node.outputs, plan.strategies[node.name].out_specs):
                    if meta is not None and len(meta.shape) == 3:
                        norms += 1
                        assert out.placements[1] == autopar.Shard(1), (name, node.name, str(out))
        assert norms >= 10, (name, norms)
    # data parallel as DDP runs it: every activation that carries the batch, forward and
    # backward, is split along it over dp (the solver alone replicates some on this preset)
    batch, seq = inputs[0].shape
    for name, plan in plans.items():
        if plan.mesh.shape[0] > 1:
            assert _not_split_along_the_batch(plan, {batch, batch * seq}) == [], name
    for name in ("dp", "zero3", "megatron-tp2", "megatron-tp2-fsdp-sp", "megatron-tp4-sp"):
        report = autopar.check(model, inputs, plan=plans[name])
        assert report.ok, (name, str(report))


def _not_split_along_the_batch(plan, batch_sizes: set) -> list:
    """The activations (values computed from the inputs) with a dim of the batch's size that are
    not split along such a dim over the plan's first mesh axis (dp)."""
    graph, activations, found = plan.graph, set(plan.graph.inputs), []
    for node in graph.nodes:
        if node.op == "call" and any(ref in activations for ref in node.refs()):
            activations.add(node.name)
    for name in activations:
        for meta, spec in zip(graph.node(name).outputs, plan.strategies[name].out_specs):
            dims = [d for d, size in enumerate(meta.shape) if size in batch_sizes] if meta is not None else []
            placement = spec.placements[0]
            if dims and not (isinstance(placement, autopar.Shard) and placement.dim in dims):
                found.append((name, meta.shape, str(spec)))
    return found


def test_a_hugging_face_models_baselines_take_its_keyword_call(fast_network):
    """``kwargs=`` as autopar.plan takes it: Megatron's sequence-parallel layout of a Llama called
    with ``input_ids=`` and ``labels=``, its projections split over tp and its norms on sequence
    shards (the tokens found among the keywords)."""
    from tests.models import tiny_llama

    model, kwargs = tiny_llama(heads=2, positions=16, sequence=16)
    plans = autopar.baselines(model, kwargs=kwargs, devices=4, hardware=fast_network, tp_degrees=[2],
                              only=["megatron-tp2-sp"])
    plan = plans["megatron-tp2-sp"]
    assert str(plan.param_spec("model.layers.0.self_attn.q_proj.weight")) == "(R, S(0))"
    assert str(plan.param_spec("model.layers.0.mlp.down_proj.weight")) == "(R, S(1))"
    paths = module_paths(capture(model, (), kwargs=kwargs))
    norms = [out.placements[1] for node in plan.graph.nodes if node.op == "call"
             and re.search(r"norm$", paths.get(node.name, ""))
             for meta, out in zip(node.outputs, plan.strategies[node.name].out_specs)
             if meta is not None and meta.shape[:2] == (8, 16)]
    assert len(norms) >= 5 and set(norms) == {autopar.Shard(1)}, norms


def test_a_baseline_whose_dp_does_not_divide_the_batch_is_skipped_with_the_reason(fast_network):
    model, inputs = gpt2.make(dataclasses.replace(SMALL, batch=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        plans = autopar.baselines(model, inputs, devices=4, hardware=fast_network, tp_degrees=[4])
    assert set(plans) == {"megatron-tp4", "megatron-tp4-sp"}
    assert "the batch of 2 samples does not split over dp=4" in plans.skipped["dp"]


def test_cli_searches_the_meshes_of_a_device_count(capsys):
    from autopar.cli import main as cli

    assert cli(["plan", "examples.mlp:factory", "--mesh", "4", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "predicted step time" in text and "mesh search: best (dp=" in text and "(dp=2, tp=2)" in text


def test_the_axis_by_axis_warm_start_runs_on_2d_meshes_and_the_full_solve_only_improves_it():
    model, inputs = mlp.make(batch=16, width=256, hidden=1024)
    messages = []
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware="h100-sxm", solver="mip",
                        progress=messages.append)
    warm = [float(m.split("objective ")[1].split(" ms")[0]) for m in messages if m.startswith("warm start:")]
    assert warm and warm == sorted(warm, reverse=True)  # each accepted axis solve lowers the objective
    assert plan.solver.objective_s * 1e3 <= warm[-1] + 1e-4
    # the budget search keeps the descent's layout; the full program, run once on it, proves it
    assert plan.solver.status == "optimal" and plan.solver.gap == 0.0


def test_the_axis_descent_stops_once_every_axis_is_settled():
    """Two nodes on a 2-D mesh, a strategy per (axis-0, axis-1) choice; the restricted solve is
    brute force. After the last change, made by a proven optimum, one look at the other axis
    ends the descent; a change found at a time limit gets a second look at its own axis."""
    from autopar.solvers.sharding import SolverResult, brute_force
    from autopar.solvers.warm_start import descend_axes

    class Strategy:
        def __init__(self, a0, a1):
            spec = type("Spec", (), {"placements": (a0, a1)})()
            self.in_specs, self.out_specs = (), (spec,)

    options = [[Strategy(a, b) for a in "RS" for b in "RS"] for _ in range(2)]
    costs = [[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 2.0, 1.5]]
    edges = [(0, 1, [[0.0 if a == b else 0.5 for b in range(4)] for a in range(4)])]

    def run(status):
        axes = []

        def restricted(node_costs, hint, _step):
            free = [options[0][k].out_specs[0].placements for k in range(4) if node_costs[0][k] != float("inf")]
            axes.append(int(free[0][0] == free[1][0]))  # the axis whose placement varies
            choice, value = brute_force(node_costs, edges)
            return SolverResult(choice, value, value, status, 0.0, "test", 8)

        found = descend_axes(restricted, costs, options, 2, [0, 0], lambda _: None)
        return found, axes

    found, axes = run("optimal")
    assert found.choice == (3, 3) and found.objective == pytest.approx(2.5)
    # axis 0 moves both nodes to S?, axis 1 to SS, axis 0 confirms: no fourth solve of axis 1
    assert axes == [0, 1, 0]
    found, axes = run("feasible")
    assert found.choice == (3, 3) and axes == [0, 1, 0, 1]


def test_a_full_program_too_large_for_its_limit_is_skipped_and_the_plan_says_it_has_no_bound(monkeypatch):
    from autopar.passes import budget_search

    monkeypatch.setattr(budget_search, "_POLISH_BOOLEANS_PER_WORK", 0)
    model, inputs = mlp.make(batch=16, width=256, hidden=1024)
    messages = []
    with pytest.warns(UserWarning, match="the plan has no proven bound"):
        plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware="h100-sxm", solver="mip",
                            progress=messages.append, cache=False)
    assert any("too large to solve" in m for m in messages)
    assert plan.solver.status == "feasible" and plan.solver.gap == 1.0


def test_a_descent_step_is_reused_only_where_its_optimum_still_holds():
    """A budget attempt reuses a one-axis step solved before when the result was proven optimal,
    meets the new memory limit, and every layout that meets the new limit met the old one (the
    same rows with a lower limit, or the budgeted rows after what a rank holds all step: those
    rows are at least these, row by row)."""
    from autopar.passes.budget_layout import BUDGETED, HELD
    from autopar.passes.budget_search import _StepMemo
    from autopar.solvers.sharding import MemoryLimit, SolverResult

    held, rows = [[1.0, 2.0]], [[3.0, 4.0]]
    solves = []

    def ask(memo, limit, status="optimal", key="step"):
        def solve_now():
            solves.append(limit)
            return SolverResult((0,), 1.0, 1.0, status, 0.0, "test", 2)
        return memo.solve(key, limit, solve_now)

    memo = _StepMemo()
    ask(memo, MemoryLimit(rows, 10.0, BUDGETED))
    ask(memo, MemoryLimit(rows, 8.0, BUDGETED))  # tighter, and the result (3 bytes) meets it: reused
    assert len(solves) == 1
    ask(memo, MemoryLimit(rows, 12.0, BUDGETED))  # looser: the optimum may have moved
    ask(memo, MemoryLimit(rows, 2.0, BUDGETED))  # the result no longer fits
    assert len(solves) == 3

    memo = _StepMemo()
    ask(memo, MemoryLimit(held, 5.0, HELD))
    ask(memo, MemoryLimit(rows, 5.0, BUDGETED))  # rows <= 5 implies held <= 5: reused
    assert len(solves) == 4
    ask(memo, MemoryLimit(held, 4.0, HELD), key="other")
    ask(memo, MemoryLimit([[0.5, 0.5]], 4.0, "other rows"), key="other")  # other rows: not nested
    ask(memo, None, key="other")  # no limit at all
    assert len(solves) == 7

    memo = _StepMemo()
    ask(memo, None, status="feasible")
    ask(memo, MemoryLimit(rows, 5.0, BUDGETED))  # only a time-limited result: solved again
    assert len(solves) == 9
