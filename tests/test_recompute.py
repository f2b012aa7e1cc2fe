"""Recomputation: the solver against brute force, and recompute plans that run, match eager,
and hold the memory they predict."""
import dataclasses
import math
import random
import re

import pytest
import torch
from torch import nn

import autopar
from autopar.errors import AutoparError, SolverError
from autopar.lowering.memory import simulate
from autopar.lowering.naming import readable_names
from autopar.lowering.schedule import schedule
from autopar.passes.recompute import build_problem
from autopar.solvers.recompute import RecomputeProblem, brute_force, memory_of, solve
from examples import gpt2
from tests.workers import FAST


def random_problem(rng: random.Random, n: int, points: int) -> RecomputeProblem:
    """A forward chain with branches: each value reads up to two earlier ones; some are views of
    their input; some cannot be recomputed; backward reads come in reverse order, as in backprop."""
    inputs, storage, storage_bytes, seconds = [], [], [], []
    for v in range(n):
        ins = sorted(rng.sample(range(v), min(v, rng.choice((1, 1, 2))))) if v else []
        inputs.append(ins)
        view = ins and rng.random() < 0.3
        if view:
            storage.append(storage[ins[0]])  # a view of its first input
        else:
            storage.append(len(storage_bytes))
            storage_bytes.append(float(rng.randint(1, 9) * 100))
        if view and len(ins) == 1 and rng.random() < 0.6:
            seconds.append(0.0)  # a free view: the solver folds it into its input
        else:
            seconds.append(math.inf if rng.random() < 0.15 else rng.uniform(0.1, 2.0))
    first_use, last_use = [], []
    for v in range(n):
        if rng.random() < 0.7:
            first = min(points - 1, max(0, (n - 1 - v) * points // n + rng.randint(-1, 0)))
            first_use.append(first)
            last_use.append(min(points - 1, first + rng.randint(0, 1)))
        else:
            first_use.append(None)
            last_use.append(None)
    consumers = [[c for c in range(n) if v in inputs[c]] for v in range(n)]
    hold_until = []
    for v in range(n):
        ends = [x for x in [last_use[v]] + [first_use[c] for c in consumers[v]] if x is not None]
        hold_until.append(max(ends) if ends else None)
    fixed = [float(rng.randint(0, 500)) for _ in range(points)]
    return RecomputeProblem(seconds, inputs, storage, storage_bytes, first_use, last_use, hold_until, fixed)


def test_the_recompute_solver_equals_brute_force_on_small_problems():
    rng = random.Random(7)
    compared = 0
    for trial in range(40):
        problem = random_problem(rng, n=rng.randint(5, 11), points=rng.randint(2, 5))
        everything_kept = max(memory_of(problem, set()))
        least = solve(problem, None)  # the least memory the model allows
        brute_least = min(max(memory_of(problem, set(s))) for k in range(problem.n + 1)
                          for s in _subsets(problem, k))
        assert least.memory == pytest.approx(brute_least)
        for share in (0.0, 0.3, 0.6, 0.9):
            limit = least.memory + share * (everything_kept - least.memory)
            seconds, subset = brute_force(problem, limit)
            found = solve(problem, limit)
            assert found.seconds == pytest.approx(seconds, abs=1e-9), (trial, share, subset, found)
            assert max(memory_of(problem, set(found.recomputed))) <= limit + 1e-6
            compared += 1
        with pytest.raises(SolverError):
            solve(problem, least.memory - 1.0)
    assert compared == 160


def test_with_micro_batches_in_flight_the_solver_equals_brute_force_and_counts_their_saved_values():
    """A pipeline stage holds other micro-batches' saved values (those held where backward
    starts, the first point) all through one micro-batch's backward: recomputing more of them
    pays k - 1 times over, and the solver still finds brute force's optimum."""
    rng = random.Random(11)
    for trial in range(15):
        alone = random_problem(rng, n=rng.randint(5, 10), points=rng.randint(2, 4))
        problem = dataclasses.replace(alone, in_flight=3)
        for recomputed in ({}, set(range(0, alone.n, 2))):
            one, three = memory_of(alone, recomputed), memory_of(problem, recomputed)
            saved_at_start = one[0] - alone.fixed[0]
            assert three == pytest.approx([m + 2 * saved_at_start for m in one])
        least = min(max(memory_of(problem, set(s))) for k in range(problem.n + 1) for s in _subsets(problem, k))
        assert solve(problem, None).memory == pytest.approx(least)
        for share in (0.2, 0.7):
            limit = least + share * (max(memory_of(problem, set())) - least)
            seconds, subset = brute_force(problem, limit)
            found = solve(problem, limit)
            assert found.seconds == pytest.approx(seconds, abs=1e-9), (trial, share, subset, found)
            assert max(memory_of(problem, set(found.recomputed))) <= limit + 1e-6


def test_the_recompute_shortcuts_give_real_plans_and_a_long_horizon_changes_nothing():
    """A horizon restricts the chains, folded views hold their bases longer, a gap stops early:
    what they find still meets the limit by the model's own memory function and never beats the
    optimum; a horizon as long as the problem changes nothing."""
    rng = random.Random(11)
    checked = 0
    for _trial in range(25):
        problem = random_problem(rng, n=rng.randint(5, 10), points=rng.randint(3, 5))
        everything_kept = max(memory_of(problem, set()))
        least = solve(problem, None)
        for share in (0.1, 0.5, 0.9):
            limit = least.memory + share * (everything_kept - least.memory)
            optimum = brute_force(problem, limit)[0]
            assert solve(problem, limit, horizon=len(problem.fixed)).seconds == pytest.approx(optimum, abs=1e-9)
            for shortcuts in ({"horizon": 0}, {"horizon": 1}, {"fold_views": True},
                              {"horizon": 1, "fold_views": True, "relative_gap": 0.01}):
                try:
                    found = solve(problem, limit, **shortcuts)
                except SolverError:
                    continue
                assert max(memory_of(problem, set(found.recomputed))) <= limit + 1e-6
                assert found.seconds >= optimum - 1e-9
                checked += 1
    assert checked >= 200


def _subsets(problem, k):
    import itertools

    return itertools.combinations([v for v in range(problem.n) if not math.isinf(problem.seconds[v])], k)


class TanhStack(nn.Module):
    def __init__(self, layers: int, width: int = 64):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return ((x - y) ** 2).mean()


def test_the_recompute_solver_equals_brute_force_on_a_captured_program():
    model, inputs = TanhStack(2), (torch.randn(512, 64), torch.randn(512, 64))
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware="h100-sxm")
    statements = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh)
    memory = simulate(statements, plan.graph, plan.strategies, plan.mesh, "adam")
    problem, names = build_problem(statements, memory.during, plan.strategies)
    recomputable = [v for v in range(problem.n) if not math.isinf(problem.seconds[v])]
    assert 3 <= len(recomputable) <= 14, names
    everything_kept = max(memory_of(problem, set()))
    least = solve(problem, None)
    assert least.memory < everything_kept  # recomputing saves memory on this program
    for share in (0.2, 0.5, 0.8):
        limit = least.memory + share * (everything_kept - least.memory)
        assert solve(problem, limit).seconds == pytest.approx(brute_force(problem, limit)[0], abs=1e-12)


def test_the_recompute_model_sees_every_backward_read_and_underestimates_the_simulation_by_little():
    """On a program with more backward reads than model points: every value backward reads has a
    first use in the model (one read after the last point once had none, so the model neither
    kept nor recomputed it and counted its memory as freed), and for random recomputation sets the
    model's memory at each point is at most 2% of the peak under the simulated program's. Before
    the model held a kept value until the recomputations it feeds through values backward does
    not read, it was 7-10% under here; what is left is a recomputed multi-output op, held by its
    outputs a few statements longer than the model's instant chains."""
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=256, seq=64, layers=4, heads=4, width=64, batch=4))
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=FAST, optimizer="sgd", recompute="none")
    statements = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh)
    plain = simulate(statements, plan.graph, plan.strategies, plan.mesh, "sgd")
    problem, names = build_problem(statements, plain.during, plan.strategies)
    boundary = next(i for i, s in enumerate(statements) if s.defines == plan.graph.loss) + 1
    read_in_backward = {u for s in statements[boundary:] for u in s.uses}
    sites = {min(i for i, s in enumerate(statements[boundary:], boundary) if name in s.uses)
             for name in names if name in read_in_backward}
    assert len(sites) > len(problem.at)  # the model thins its points
    assert all(problem.first_use[v] is not None for v, name in enumerate(names) if name in read_in_backward)

    rng = random.Random(0)
    recomputable = [v for v in range(problem.n) if not math.isinf(problem.seconds[v])]
    for share in (0.1, 0.3, 0.5, 0.7, 0.9):
        chosen = set(rng.sample(recomputable, int(share * len(recomputable))))
        program = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh,
                           tuple(names[v] for v in chosen))
        simulated = simulate(program, plan.graph, plan.strategies, plan.mesh, "sgd").during
        at_plain = [i for i, s in enumerate(program) if not s.recomputed]  # statement i of the plain program
        modelled = memory_of(problem, chosen)
        under = max(simulated[at_plain[at]] - modelled[t] for t, at in enumerate(problem.at))
        assert under <= 0.02 * plain.peak_bytes, (share, under, plain.peak_bytes)


def test_a_layout_no_recomputation_fits_gets_no_least_memory_solve(monkeypatch):
    """recompute="auto" under a budget no set can meet: the model's first solve says so, and
    the least-memory solve (as long as a whole descent on a 70B model) is skipped; "full" still
    reports how low recomputation goes."""
    from autopar.ir.graph import to_ir
    from autopar.passes import recompute
    from autopar.planning.state import planning_state

    model, inputs = TanhStack(2), (torch.randn(512, 64), torch.randn(512, 64))
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware="h100-sxm", cache=False)
    program, ctx = planning_state(plan)
    calls = []
    least_memory = recompute.least_memory
    monkeypatch.setattr(recompute, "least_memory", lambda *a, **k: calls.append(1) or least_memory(*a, **k))
    args = (to_ir(program), program.table("choice"), program.table("redistributions"), ctx, 1.0)
    fitted = recompute.fit(*args)
    assert fitted.recompute is None and fitted.lowest is None and not calls
    fitted = recompute.fit(*args, "full")
    assert fitted.recompute is None and fitted.lowest.peak_bytes < fitted.plain.peak_bytes and calls == [1]


@pytest.fixture(scope="module")
def recompute_plans():
    """A GPT-2-style decoder on 2 ranks, data parallel (layouts pinned, so only recomputation answers
    the budget), SGD as the workers run: no recomputation, full recomputation, and two budgets
    between. A long sequence, so that activations are most of the memory."""
    model, inputs = gpt2.make(gpt2.GPT2Config(vocab=256, seq=128, layers=2, heads=4, width=128, batch=8))
    pin = {fqn: "R" for fqn, _ in model.named_parameters()}

    def make(**options):
        return autopar.plan(model, inputs, mesh="dp=2", hardware=FAST, optimizer="sgd", pin=pin, offload=False,
                            **options)

    plain, full = make(recompute="none"), make(recompute="full")
    top, bottom = plain.predicted.peak_memory_bytes, full.predicted.peak_memory_bytes
    budgets = [bottom + share * (top - bottom) for share in (0.6, 0.25)] + [bottom * 1.01]
    return model, inputs, [(None, plain)] + [(b, make(memory_budget=b)) for b in budgets] + [(None, full)]


def test_recompute_plans_match_eager_and_their_predicted_memory(recompute_plans):
    model, inputs, plans = recompute_plans
    measured, recompute_s = [], []
    for budget, plan in plans:
        report = autopar.check(model, inputs, plan=plan, measure_memory=True)
        assert report.ok, str(report)
        peak = max(report.peak_memory_bytes)
        assert peak == pytest.approx(plan.predicted.peak_memory_bytes, rel=0.2), (budget, plan.predicted.memory_bytes)
        if budget is not None:
            assert plan.predicted.peak_memory_bytes <= budget
        measured.append(peak)
        recompute_s.append(plan.predicted.recompute_s)
    # budgets fall from none to the tightest: the measured peak never rises, the added time never
    # falls. MemTracker's peak varies between runs of one program by up to one buffer (it sees
    # gloo's asynchronous work release tensors at varying moments): 1% of the peak is allowed.
    jitter = 0.01 * measured[0]
    assert all(later <= earlier + jitter for earlier, later in zip(measured[:4], measured[1:4])), measured
    assert recompute_s[:4] == sorted(recompute_s[:4]), recompute_s
    assert recompute_s[0] == 0 and recompute_s[3] > 0
    tightest_budget = plans[3][0]
    assert measured[3] <= tightest_budget + jitter, (measured[3], tightest_budget)
    assert measured[3] < 0.8 * measured[0]  # recomputation really frees memory in the running program


def test_the_emitted_backward_recomputes_and_the_forward_copy_is_freed(recompute_plans):
    _, _, plans = recompute_plans
    plan = plans[-1][1]  # full recomputation
    assert plan.recompute and plan.predicted.recompute_s > 0
    source = plan.emit()
    lines = source.splitlines()
    printed = readable_names(plan.graph, plan.modules)  # the name the program gives a value (attention's, say)
    loss = printed.get(plan.graph.loss, plan.graph.loss)
    loss_line = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{loss} = "))
    ops_again = 0
    for var in (printed.get(v, v) for v in plan.recompute):
        copy = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{var}__rc = "))
        assert copy > loss_line and "[recomputed for backward" in lines[copy]
        freed = next(i for i, line in enumerate(lines)
                     if line.strip().startswith("del ") and re.search(rf"\b{var}\b", line))
        assert freed < copy  # the forward copy is gone before backward computes it again
        ops_again += "= aten." in lines[copy] or "= kernels." in lines[copy]
    assert ops_again >= 5  # forward ops really run again, not just views


def test_recompute_only_when_the_budget_needs_it_and_bad_modes_are_refused(fast_network):
    model, inputs = gpt2.make("tiny")
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network)
    assert plan.recompute == () and plan.predicted.recompute_s == 0
    with pytest.raises(AutoparError, match="unknown recompute mode 'some'"):
        autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network, recompute="some")


def test_recomputation_survives_the_plan_file_and_shows_in_the_summary_and_the_formula(recompute_plans):
    model, inputs, plans = recompute_plans
    plan = plans[-1][1]  # full recomputation
    again = autopar.Plan.from_json(plan.to_json())
    assert again.recompute == plan.recompute and again.predicted.recompute_s == plan.predicted.recompute_s
    assert again.emit() == plan.emit()
    assert f"recomputation: {len(plan.recompute)} forward values computed again" in plan.summary()
    # the step-time formula counts the recomputed work too
    pin = {fqn: "R" for fqn, _ in model.named_parameters()}
    symbolic = autopar.plan(model, inputs, mesh="dp=2", hardware=FAST, optimizer="sgd", pin=pin, recompute="full",
                            symbolic_dims={"batch": 0, "seq": 1})
    assert symbolic.predicted.recompute_s > 0
    assert symbolic.evaluate() == pytest.approx(symbolic.predicted.step_time_s, rel=1e-12)
