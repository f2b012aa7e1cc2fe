import math
import random

import pytest

from autopar.errors import SolverError
from autopar.solvers.limits import SolveLimits
from autopar.solvers.sharding import MemoryLimit, Overlap, brute_force, evaluate, solve


def random_problem(rng: random.Random):
    n = rng.randint(2, 8)
    sizes = [rng.randint(1, 4) for _ in range(n)]
    node_costs = [[rng.uniform(0, 1e-3) for _ in range(s)] for s in sizes]
    edges = []
    for _ in range(rng.randint(1, 12)):
        i, j = rng.sample(range(n), 2)
        matrix = [[rng.uniform(0, 2e-3) for _ in range(sizes[j])] for _ in range(sizes[i])]
        if sizes[i] > 1 and sizes[j] > 1 and rng.random() < 0.3:
            matrix[0][1] = math.inf  # a forbidden pair
        edges.append((i, j, matrix))
    return node_costs, edges


@pytest.mark.parametrize("backend", ["lp-first", "mip", "cp-sat"])
def test_solver_matches_brute_force(backend):
    rng = random.Random(1234)
    for _ in range(25):
        node_costs, edges = random_problem(rng)
        _, best = brute_force(node_costs, edges)
        result = solve(node_costs, edges, backend=backend)
        assert result.status == "optimal"
        assert result.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert evaluate(node_costs, edges, result.choice) == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert result.gap <= 1e-6  # CP-SAT's bound is of costs in whole nanoseconds


@pytest.mark.parametrize("backend", ["lp-first", "mip", "cp-sat"])
def test_overlapped_costs_count_only_beyond_their_cover(backend):
    """Hidden edge costs add max(0, Σ hidden − Σ cover): the solver agrees with brute force."""
    rng = random.Random(99)
    for _ in range(20):
        node_costs, edges = random_problem(rng)
        n = len(node_costs)
        hidden = []
        for _ in range(rng.randint(1, 3)):
            i, j = rng.sample(range(n), 2)
            hidden.append((i, j, [[rng.uniform(0, 3e-3) for _ in node_costs[j]] for _ in node_costs[i]]))
        overlap = Overlap(hidden, [[rng.uniform(0, 1e-3) for _ in c] for c in node_costs])
        _, best = brute_force(node_costs, edges, overlap)
        result = solve(node_costs, edges, backend=backend, overlap=overlap)
        assert result.status == "optimal"
        assert result.objective == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_overlap_hides_up_to_the_cover_and_no_more():
    node_costs, edges = [[1.0], [0.0]], []
    choice = (0, 0)
    assert evaluate(node_costs, edges, choice, Overlap([(0, 1, [[3.0]])], [[2.0], [0.0]])) == pytest.approx(2.0)
    assert evaluate(node_costs, edges, choice, Overlap([(0, 1, [[1.5]])], [[2.0], [0.0]])) == pytest.approx(1.0)


def test_forbidden_choice_is_never_taken():
    node_costs = [[0.0, math.inf], [1.0, 0.5]]
    edges = [(0, 1, [[0.0, 2.0], [0.0, 0.0]])]
    result = solve(node_costs, edges)
    assert result.choice == (0, 0)
    assert result.objective == pytest.approx(1.0)


def test_reduction_keeps_the_optimum_and_drops_dominated_strategies():
    """Forbidden, dominated and duplicate strategies go before the solve; brute force on the full
    problem still agrees, and a warm start on a dropped strategy maps to one no worse."""
    from autopar.solvers.reduction import reduce_problem

    rng = random.Random(7)
    removed = 0
    for _ in range(30):
        node_costs, edges = random_problem(rng)
        i = rng.randrange(len(node_costs))
        node_costs[i] = node_costs[i] + [node_costs[i][0] + 1e-3]  # strategy 0 plus a cost: dominated ...
        for n, (a, b, m) in enumerate(edges):
            if a == i:
                edges[n] = (a, b, m + [list(m[0])])
            if b == i:
                edges[n] = (a, b, [row + [row[0]] for row in m])
        node_costs[0] = node_costs[0] + [math.inf]  # ... and a forbidden one
        for n, (a, b, m) in enumerate(edges):
            if a == 0:
                edges[n] = (a, b, m + [[0.0] * len(m[0])])
            if b == 0:
                edges[n] = (a, b, [row + [0.0] for row in m])
        reduced = reduce_problem(node_costs, edges)
        assert len(node_costs[i]) - 1 not in reduced.keep[i]
        assert len(node_costs[0]) - 1 not in reduced.keep[0]
        removed += reduced.n_removed
        best_choice, best = brute_force(node_costs, edges)
        result = solve(node_costs, edges)
        assert result.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
        warm = reduced.reduce_choice(best_choice)
        assert evaluate(node_costs, edges, reduced.expand(warm)) <= best + 1e-12
    assert removed >= 60


def test_a_memory_limit_under_every_nodes_leanest_allowed_strategy_fails_before_solving():
    costs = [[1.0, 2.0], [math.inf, 1.0], [1.0, 1.0]]
    memory = [[4.0, 2.0], [1.0, 3.0], [5.0, 6.0]]  # the forbidden strategy's 1 byte does not count
    edges = [(0, 1, [[0.0, 1.0], [1.0, 0.0]])]
    with pytest.raises(SolverError, match="leanest allowed strategies hold 10 B"):
        solve(costs, edges, memory=MemoryLimit(memory, 9.0))
    result = solve(costs, edges, memory=MemoryLimit(memory, 10.0))  # the floor itself fits
    assert result.choice == (1, 1, 0) and result.status == "optimal"


def random_memory(rng: random.Random, node_costs) -> MemoryLimit:
    """Bytes per strategy and a limit between the leanest and the heaviest choice: it binds."""
    held = [[rng.choice([0.0, rng.uniform(1, 100)]) for _ in costs] for costs in node_costs]
    leanest = sum(min(row) for row in held)
    heaviest = sum(max(row) for row in held)
    return MemoryLimit(held, leanest + rng.uniform(0.2, 0.6) * (heaviest - leanest))


def brute_force_within(node_costs, edges, memory: MemoryLimit, overlap=None) -> float:
    import itertools

    values = [evaluate(node_costs, edges, c, overlap) for c in itertools.product(*(range(len(r)) for r in node_costs))
              if memory.used(c) <= memory.limit]
    return min(values, default=math.inf)


@pytest.mark.parametrize("path", ["scip", "branch-and-bound"])
def test_lp_first_meets_brute_force_under_a_memory_limit_and_its_bound_is_a_true_lower_bound(path, monkeypatch):
    """Memory limits make the relaxation fractional (it splits the knapsack): the LP-first path
    still returns the optimum, whether what reduced-cost fixing leaves goes to SCIP or to its own
    branch and bound, and every bound it reports is at most the optimum."""
    from autopar.solvers import lp_first

    if path == "branch-and-bound":
        monkeypatch.setattr(lp_first, "_SCIP_VARIABLES", 0)
    rng = random.Random(2024)
    fractional = branched = 0
    for _ in range(40):
        node_costs, edges = random_problem(rng)
        memory = random_memory(rng, node_costs)
        best = brute_force_within(node_costs, edges, memory)
        if math.isinf(best) or memory.limit < sum(min(r) for r in memory.bytes):
            continue
        messages = []
        result = solve(node_costs, edges, backend="lp-first", memory=memory, progress=messages.append)
        fractional += any("fractional" in m and not m.split(", ")[1].startswith("0 of") for m in messages)
        branched += any(m.startswith("branch and bound") for m in messages)
        assert memory.used(result.choice) <= memory.limit
        assert result.objective == pytest.approx(best, rel=1e-4, abs=1e-12)
        assert result.bound <= best * (1 + 1e-9) + 1e-12
        assert result.status == "optimal"
    assert fractional >= 5  # the paths after the LP ran
    assert branched >= (3 if path == "branch-and-bound" else 0)


def test_any_row_prices_give_a_bound_no_integer_solution_beats():
    """LocalPolytope.dual_bound is weak duality recomputed in float64: random prices, however
    bad, never give a bound above the brute-force optimum; the LP's own prices give the LP value."""
    import numpy as np

    from autopar.solvers.local_polytope import SCALE, LocalPolytope

    rng = random.Random(5)
    np_rng = np.random.default_rng(5)
    for _ in range(25):
        node_costs, edges = random_problem(rng)
        memory = random_memory(rng, node_costs)
        overlap = Overlap([(0, 1, [[rng.uniform(0, 3e-3) for _ in node_costs[1]] for _ in node_costs[0]])],
                          [[rng.uniform(0, 1e-3) for _ in c] for c in node_costs])
        best = brute_force_within(node_costs, edges, memory, overlap)
        if math.isinf(best):
            continue
        polytope = LocalPolytope.build(node_costs, edges, overlap, memory)
        for _ in range(5):
            prices = np_rng.normal(scale=1e3, size=len(polytope.rows))
            assert polytope.dual_bound(prices)[0] / SCALE <= best * (1 + 1e-9) + 1e-12
        solution = polytope.relaxation().solve(SolveLimits(work=100_000, seconds=10.0))
        assert solution.bound == pytest.approx(polytope.objective @ solution.values, rel=1e-6, abs=1e-6)
        assert solution.bound / SCALE <= best * (1 + 1e-9) + 1e-12


def test_the_same_problem_at_a_new_memory_limit_is_re_optimized_not_rebuilt():
    """The budget search re-solves one problem at tighter limits: the LP is kept and re-optimized
    from its last basis, with the answer a fresh build gives."""
    import copy

    rng = random.Random(11)
    checked = 0
    for _ in range(20):
        node_costs, edges = random_problem(rng)
        memory = random_memory(rng, node_costs)
        first = solve(node_costs, edges, memory=memory)
        tighter = MemoryLimit(memory.bytes, (memory.limit + sum(min(r) for r in memory.bytes)) / 2)
        if math.isinf(brute_force_within(node_costs, edges, tighter)):
            continue
        messages = []
        again = solve(node_costs, edges, memory=tighter, progress=messages.append)
        fresh = solve(copy.deepcopy(node_costs), copy.deepcopy(edges),
                      memory=MemoryLimit(copy.deepcopy(memory.bytes), tighter.limit))
        assert any("re-optimized at the new memory limit" in m for m in messages)
        assert again.objective == pytest.approx(fresh.objective, rel=1e-9, abs=1e-12)
        assert again.objective == pytest.approx(brute_force_within(node_costs, edges, tighter), rel=1e-4, abs=1e-12)
        assert again.objective >= first.objective - 1e-12
        checked += 1
    assert checked >= 5


def test_a_re_optimized_lp_proves_only_true_bounds_at_a_raised_or_lowered_limit():
    """The kept LP's memory row moves with the limit, and so does the bound its prices prove: read
    against the old limit, a raised one gave bounds above the optimum and a false "optimal"."""
    rng = random.Random(35)
    checked = 0
    for _ in range(60):
        node_costs, edges = random_problem(rng)
        memory = random_memory(rng, node_costs)
        leanest, heaviest = sum(min(r) for r in memory.bytes), sum(max(r) for r in memory.bytes)
        for share in (0.2, 0.6, 0.3):  # raised, then lowered
            limit = MemoryLimit(memory.bytes, leanest + share * (heaviest - leanest))
            best = brute_force_within(node_costs, edges, limit)
            if math.isinf(best):
                continue
            result = solve(node_costs, edges, memory=limit)
            assert result.bound <= best * (1 + 1e-9) + 1e-12, (result, best)
            assert result.objective == pytest.approx(best, rel=1e-4, abs=1e-12)
            checked += 1
    assert checked >= 60


def test_the_lp_relaxation_leaves_no_thread_behind():
    """HiGHS runs serially: a worker thread of its own would outlive the solve and can abort a
    process at exit (a torchrun rank that planned)."""
    import os
    import random

    from autopar.solvers.local_polytope import LocalPolytope

    def threads() -> int:
        return len(os.listdir(f"/proc/{os.getpid()}/task"))

    rng = random.Random(0)
    node_costs = [[rng.random() for _ in range(6)] for _ in range(300)]
    edges = [(i, i + 1, [[rng.random() for _ in range(6)] for _ in range(6)]) for i in range(299)]
    relaxation = LocalPolytope.build(node_costs, edges, None, None).relaxation()
    before = threads()
    assert relaxation.solve(SolveLimits(work=100_000, seconds=60.0)).status == "optimal"
    assert threads() == before
