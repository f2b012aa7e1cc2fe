"""The bubble-fill solver (PipeFisher-style placement of deferrable work into pipeline gaps): hand-derived
placements, the exact search against an independent brute force, and the checker on broken fills."""
import itertools
import random

import pytest

from autopar.errors import AutoparError
from autopar.solvers.bubble_fill import TAIL, Fill, Gap, Item, Placed, exact, greedy, verify

EPS = 1e-9


def random_instance(rng: random.Random, max_items: int, max_gaps: int) -> dict:
    """1-2 ranks with 2..max_gaps gaps each (the last ends at the step's end), items with random deps on
    earlier items, pins that respect their deps' pins, and sometimes a margin and a memory headroom."""
    step_end, ranks, refresh = 10.0, rng.randint(1, 2), rng.randint(1, 2)
    gaps = []
    for rank in range(ranks):
        n = rng.randint(2, max_gaps)
        points = sorted(round(rng.uniform(0, step_end), 1) for _ in range(2 * n - 1)) + [step_end]
        gaps += [Gap(rank, f"{rank}A{k}", points[2 * k], points[2 * k + 1]) for k in range(n)]
    items, earliest = [], {}
    for i in range(rng.randint(3, max_items)):
        names = [item.name for item in items]
        deps = tuple(rng.sample(names, min(len(names), rng.choice((0, 0, 1, 2)))))
        low = max((earliest[d] for d in deps), default=0)
        pin = rng.randint(low, refresh - 1) if rng.random() < 0.3 else None
        earliest[f"i{i}"] = low if pin is None else pin
        items.append(Item(f"i{i}", rng.randrange(ranks), round(rng.uniform(0.2, 2.5), 1),
                          bytes=rng.choice((0.0, 0.0, 50.0, 100.0)), release_s=round(rng.uniform(0, 8), 1),
                          deps=deps, phase=pin))
    return dict(items=items, gaps=gaps, step_end_s=step_end, refresh=refresh, margin_s=rng.choice((0.0, 0.1)),
                headroom_bytes=rng.choice((None, {0: 120.0}, {0: 60.0, 1: 120.0})))


def brute_force_mean(items, gaps, step_end_s, refresh, margin_s, headroom_bytes) -> float:
    """The least mean step time over every assignment of every item to a (phase, gap or tail), with no
    pruning and its own copy of the model's rules; each assignment is simulated in the items' order."""
    own_gaps = {rank: sorted((g for g in gaps if g.rank == rank), key=lambda g: g.start_s)
                for rank in {g.rank for g in gaps}}
    headroom = headroom_bytes or {}
    latest = {}  # a cycle item's last phase: the least pin among the items that depend on it, transitively
    for item in reversed(items):
        dependants = [latest[o.name] for o in items if item.name in o.deps]
        latest[item.name] = item.phase if item.phase is not None else min([refresh - 1] + dependants)

    def options(item):
        return [(phase, gap) for phase in range(refresh) for gap in own_gaps.get(item.rank, []) + [None]]

    def times(done, item, phase, gap):
        if gap is None:
            start = max([step_end_s, item.release_s]
                        + [e for o, ph, g, s, e in done if ph == phase and o.rank == item.rank and g is None]
                        + [e for o, ph, g, s, e in done if ph == phase and o.name in item.deps])
        else:
            start = gap.start_s + sum(o.duration_s for o, ph, g, s, e in done if ph == phase and g is gap)
        return start, start + item.duration_s

    def on_time(done, item, phase, gap, start, end):
        deps_ok = all(ph < phase or (ph == phase and e <= start + EPS) for o, ph, g, s, e in done
                      if o.name in item.deps)
        return (item.phase in (None, phase) and item.release_s <= start + EPS and deps_ok
                and (gap is None or end <= gap.end_s - margin_s + EPS))

    def memory_ok(done, item, phase, start):
        limit = headroom.get(item.rank)
        if limit is None or item.bytes == 0 or start <= item.release_s:
            return True
        held = [(o.release_s, s, o.bytes) for o, ph, g, s, e in done if ph == phase and o.rank == item.rank]
        held.append((item.release_s, start, item.bytes))
        instants = [item.release_s] + [r for r, _, _ in held if item.release_s < r < start]
        return all(sum(b for r, s, b in held if r <= t < s) <= limit + EPS for t in instants)

    def allowed(done, item, phase, gap):
        start, end = times(done, item, phase, gap)
        return on_time(done, item, phase, gap, start, end) and memory_ok(done, item, phase, start)

    best = float("inf")
    for assignment in itertools.product(*(options(item) for item in items)):
        done = []
        for item, (phase, gap) in zip(items, assignment):
            start, end = times(done, item, phase, gap)
            if not on_time(done, item, phase, gap, start, end):
                break
            if not memory_ok(done, item, phase, start):
                # a tail may break the headroom only when no placement in the item's phases keeps it
                in_reach = [(ph, g) for ph, g in options(item) if ph <= latest[item.name]]
                if gap is not None or any(allowed(done, item, ph, g) for ph, g in in_reach):
                    break
            done.append((item, phase, gap, start, end))
        else:
            tails = [(ph, e) for o, ph, g, s, e in done if g is None]
            steps = [max([step_end_s] + [e for ph, e in tails if ph == p]) for p in range(refresh)]
            best = min(best, sum(steps) / refresh)
    return best


def gap_ends(gaps, margin_s):
    return {(g.rank, g.after): g.end_s - margin_s for g in gaps}


# rank 0 gaps: 0F1 [2, 4], 0B1 [7, 10]; rank 1 gaps: 1F0 [3, 5], 1B1 [8, 10]; margin 0.5, so the usable
# ends are 3.5, 9.5, 4.5 and 9.5; the step ends at 10; a cycle of 2 phases.
HAND_GAPS = [Gap(0, "0F1", 2.0, 4.0), Gap(0, "0B1", 7.0, 10.0), Gap(1, "1F0", 3.0, 5.0), Gap(1, "1B1", 8.0, 10.0)]
HAND_ITEMS = [
    Item("a", 0, 1.0, release_s=1.0),
    Item("b", 0, 1.0, deps=("a",)),
    Item("c", 1, 1.5, deps=("a",)),
    Item("f", 1, 1.0, release_s=6.0, phase=0),
    Item("d", 1, 1.5, deps=("c",)),
    Item("e", 0, 0.5, release_s=7.5),
    Item("g", 1, 3.0, deps=("d",)),
]


def test_greedy_hand_built():
    # a: phase 0, 0F1 at 2 (released at 1), ends 3 <= 3.5.
    # b: 0F1 would run [3, 4], past 3.5; 0B1 at 7 (a ended at 3), ends 8.
    # c: 1F0 at 3 = a's end, ends 4.5 <= 4.5.
    # f (pinned to phase 0): 1F0 would start at 4.5 < its release 6; 1B1 at 8, ends 9.
    # d: phase 0 is full (1F0 [4.5, 6] and 1B1 [9, 10.5] overrun 4.5 and 9.5); phase 1's 1F0 at 3, ends 4.5
    #    (c ran in phase 0, an earlier phase).
    # e: 0F1 would start at 3 < its release 7.5; 0B1 after b, at 8 >= 7.5: [8, 8.5].
    # g: 3 s fits no gap; its dep d is in phase 1, so phase 1's tail: [max(10, d's end 4.5), 13].
    # Steps: phase 0 has no tail (10), phase 1 runs to 13.
    fill = greedy(HAND_ITEMS, HAND_GAPS, 10.0, 2, margin_s=0.5)
    assert fill.placed == (
        Placed("a", 0, 0, "0F1", 2.0, 3.0),
        Placed("b", 0, 0, "0B1", 7.0, 8.0),
        Placed("c", 0, 1, "1F0", 3.0, 4.5),
        Placed("f", 0, 1, "1B1", 8.0, 9.0),
        Placed("d", 1, 1, "1F0", 3.0, 4.5),
        Placed("e", 0, 0, "0B1", 8.0, 8.5),
        Placed("g", 1, 1, TAIL, 10.0, 13.0),
    )
    assert fill.step_s == (10.0, 13.0) and fill.mean_step_s == 11.5
    verify(fill, HAND_ITEMS, HAND_GAPS, 10.0, 0.5)
    # g overflows in whichever phase it runs, so the optimum is no better
    assert exact(HAND_ITEMS, HAND_GAPS, 10.0, 2, margin_s=0.5).mean_step_s == 11.5


def test_random_instances_verify_and_exact_not_worse():
    rng = random.Random(7)
    strictly_better = 0
    for _ in range(200):
        case = random_instance(rng, max_items=6, max_gaps=4)
        fast, best = greedy(**case), exact(**case)
        ends = gap_ends(case["gaps"], case["margin_s"])
        assert all(p.end_s <= ends[p.rank, p.after] + EPS for p in fast.placed if p.after != TAIL)
        for fill in (fast, best):
            verify(fill, case["items"], case["gaps"], case["step_end_s"], case["margin_s"], case["headroom_bytes"])
        assert best.mean_step_s <= fast.mean_step_s + EPS
        strictly_better += best.mean_step_s < fast.mean_step_s - EPS
    assert strictly_better > 0  # the greedy's gap to the optimum shows up on random instances too


def test_exact_matches_brute_force():
    rng = random.Random(11)
    for _ in range(50):
        case = random_instance(rng, max_items=4, max_gaps=3)
        assert exact(**case).mean_step_s == pytest.approx(brute_force_mean(**case), abs=1e-9)


def test_greedy_strictly_worse_than_exact():
    # The long item grabs A first, so one short item overflows; the optimum puts the long one in B and both
    # short ones in A, and nothing overflows.
    gaps = [Gap(0, "A", 0.0, 2.0), Gap(0, "B", 3.0, 4.5)]
    items = [Item("long", 0, 1.5), Item("short1", 0, 1.0), Item("short2", 0, 1.0)]
    fast, best = greedy(items, gaps, 5.0, 1), exact(items, gaps, 5.0, 1)
    assert fast.placed[2] == Placed("short2", 0, 0, TAIL, 5.0, 6.0) and fast.mean_step_s == 6.0
    assert best.mean_step_s == 5.0
    assert [p.after for p in best.placed] == ["B", "A", "A"]


def test_exact_breaks_ties_by_bytes_held():
    # Either order fits both items without overflow; the greedy leaves x's 100 bytes held until B (5 s), the
    # exact search puts x first, holding them until A (1 s).
    gaps = [Gap(0, "A", 1.0, 2.0), Gap(0, "B", 5.0, 6.0)]
    items = [Item("y", 0, 1.0), Item("x", 0, 1.0, bytes=100.0)]
    assert [p.after for p in greedy(items, gaps, 10.0, 1).placed] == ["A", "B"]
    best = exact(items, gaps, 10.0, 1)
    assert [p.after for p in best.placed] == ["B", "A"] and best.mean_step_s == 10.0


def test_exact_eight_items_six_options():
    gaps = [Gap(0, f"g{k}", 2.0 * k, 2.0 * k + 1.2) for k in range(5)]
    items = [Item(f"i{k}", 0, 0.3 + 0.1 * k, release_s=0.5 * k, deps=(f"i{k - 1}",) if k % 3 else ()) for k in range(8)]
    fast, best = greedy(items, gaps, 10.0, 1), exact(items, gaps, 10.0, 1)
    verify(best, items, gaps, 10.0, 0.0)
    assert best.mean_step_s <= fast.mean_step_s
    with pytest.raises(AutoparError, match="limit"):
        exact(items, gaps, 10.0, 1, limit=5)


def test_headroom_keeps_deferred_inputs_out_of_late_gaps():
    # w (released at 3) can only use "late"; y takes "early" under the greedy, so x (released at 0.5) would
    # wait for "late", holding its 100 bytes over w's: 200 > 150. With the headroom the greedy sends x to
    # the tail; the exact search puts y in "late" and x in "early", holding x's bytes only until 1.
    gaps = [Gap(0, "early", 1.0, 2.0), Gap(0, "late", 6.0, 7.5)]
    items = [Item("w", 0, 0.5, bytes=100.0, release_s=3.0), Item("y", 0, 1.0),
             Item("x", 0, 0.5, bytes=100.0, release_s=0.5)]
    assert greedy(items, gaps, 8.0, 1).placed[2] == Placed("x", 0, 0, "late", 6.5, 7.0)
    limited = greedy(items, gaps, 8.0, 1, headroom_bytes={0: 150.0})
    assert limited.placed[2].after == TAIL and limited.mean_step_s == 8.5
    best = exact(items, gaps, 8.0, 1, headroom_bytes={0: 150.0})
    assert best.placed[2] == Placed("x", 0, 0, "early", 1.0, 1.5) and best.mean_step_s == 8.0
    for fill in (limited, best):
        verify(fill, items, gaps, 8.0, 0.0, {0: 150.0})
    with pytest.raises(AutoparError, match="headroom"):
        verify(greedy(items, gaps, 8.0, 1), items, gaps, 8.0, 0.0, {0: 150.0})


def test_greedy_tail_lengthens_the_shortest_step_within_headroom():
    # No gaps on rank 0; step ends at 4. t1 overflows into phase 0 (tie, lowest phase): [4, 6]. t2 then
    # lengthens phase 1 less (5 against 7): [4, 5]. t3 holds 100 bytes from 0; phase 1's tail would hold them
    # over h's (released at 1, pinned to phase 1's tail), 200 > 150, so t3 goes to phase 0 though it ends later
    # there; t4 breaks the headroom in both phases, so it goes to the shortest step anyway.
    items = [Item("t1", 0, 2.0), Item("t2", 0, 1.0), Item("h", 0, 0.5, bytes=100.0, release_s=1.0, phase=1),
             Item("t3", 0, 0.5, bytes=100.0), Item("t4", 0, 0.5, bytes=200.0)]
    fill = greedy(items, [Gap(1, "other", 0.0, 1.0)], 4.0, 2, headroom_bytes={0: 150.0})
    assert fill.placed == (Placed("t1", 0, 0, TAIL, 4.0, 6.0), Placed("t2", 1, 0, TAIL, 4.0, 5.0),
                           Placed("h", 1, 0, TAIL, 5.0, 5.5), Placed("t3", 0, 0, TAIL, 6.0, 6.5),
                           Placed("t4", 1, 0, TAIL, 5.5, 6.0))
    assert fill.step_s == (6.5, 6.0)


def test_exact_breaks_the_headroom_in_a_tail_only_when_nothing_else_is_left():
    # h holds 100 bytes over [7.5, 8) and fills Z but for 0.3 s. x (100 bytes, released at 0) fits gap A,
    # holding them until 1; in the tail it would hold them over h's (200 > 150). So x takes A, y no longer fits
    # there and overflows: the step runs to 11. Sending x to the tail (ending 10.2) and y to A would be shorter
    # but breaks the headroom while a placement within it exists. Without a headroom x waits for Z, after h, and
    # nothing overflows.
    gaps = [Gap(0, "A", 1.0, 2.0), Gap(0, "Z", 8.0, 8.8)]
    items = [Item("h", 0, 0.5, bytes=100.0, release_s=7.5), Item("x", 0, 0.2, bytes=100.0), Item("y", 0, 1.0)]
    best = exact(items, gaps, 10.0, 1, headroom_bytes={0: 150.0})
    assert best.placed[1] == Placed("x", 0, 0, "A", 1.0, 1.2) and best.mean_step_s == 11.0
    assert exact(items, gaps, 10.0, 1).placed[1] == Placed("x", 0, 0, "Z", 8.5, 8.7)


GAP = [Gap(0, "G", 0.0, 4.0)]
PAIR = [Item("a", 0, 1.0), Item("b", 0, 1.0, deps=("a",))]


@pytest.mark.parametrize("fill, items, margin, reason", [
    (Fill((Placed("a", 0, 0, "G", 1.0, 2.0), Placed("b", 0, 0, "G", 0.0, 1.0)), 1, (4.0,)), PAIR, 0.0, "dependency"),
    (Fill((Placed("u", 0, 0, TAIL, 4.0, 5.0), Placed("v", 0, 0, TAIL, 4.5, 5.5)), 1, (5.5,)),
     [Item("u", 0, 1.0), Item("v", 0, 1.0)], 0.0, "overlap"),
    (Fill((Placed("a", 0, 0, "G", 0.0, 1.0), Placed("b", 0, 0, "G", 1.0, 2.0)), 1, (4.0,)), PAIR, 2.5, "outside gap"),
    (Fill((Placed("a", 0, 0, "G", 0.0, 1.0), Placed("b", 0, 0, TAIL, 4.0, 5.0)), 1, (4.0,)), PAIR, 0.0, "step time"),
    (Fill((Placed("a", 0, 0, "G", 0.0, 1.0),), 1, (4.0,)), PAIR, 0.0, "misses"),
    (Fill((Placed("a", 0, 0, "G", 0.0, 1.0), Placed("b", 0, 0, "G", 1.5, 2.5)), 1, (4.0,)), PAIR, 0.0, "wait"),
])
def test_verify_catches_broken_fills(fill, items, margin, reason):
    good = Fill((Placed("a", 0, 0, "G", 0.0, 1.0), Placed("b", 0, 0, "G", 1.0, 2.0)), 1, (4.0,))
    verify(good, PAIR, GAP, 4.0, 0.0)
    with pytest.raises(AutoparError, match=reason):
        verify(fill, items, GAP, 4.0, margin)


@pytest.mark.parametrize("items, refresh, reason", [
    ([Item("a", 0, 1.0, deps=("z",))], 1, "'a' depends on 'z', which is not an item"),
    ([Item("a", 0, 1.0, deps=("b",)), Item("b", 0, 1.0)], 1, "'a' depends on 'b', which comes later"),
    ([Item("a", 0, 1.0, phase=1)], 1, "'a' is pinned to phase 1"),
    ([Item("a", 0, 1.0, phase=1), Item("b", 0, 1.0, deps=("a",), phase=0)], 2, "'b' is pinned to phase 0"),
])
def test_bad_items_are_refused(items, refresh, reason):
    with pytest.raises(AutoparError, match=reason):
        greedy(items, GAP, 4.0, refresh)
