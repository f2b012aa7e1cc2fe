"""Part (b) of the benchmarks that set autopar's program beside a hand-written step (moe.py,
long_context.py): the same SGD steps of one model on 4 local CPU processes, in interleaved
rounds, so a slow spell of this shared machine falls on both."""
from __future__ import annotations

import io
import statistics
import time

import torch


def train_autopar(rank: int, world: int, model_bytes: bytes, batch, plan_json: str, steps: int) -> tuple[list, list]:
    """(each SGD step's seconds, each step's loss) under autopar's program of ``plan_json``
    (every rank passes the whole batch)."""
    import autopar

    model = torch.load(io.BytesIO(model_bytes), weights_only=False)
    plan = autopar.Plan.from_json(plan_json)
    autopar.autoparallelize(model, mesh=plan.mesh, plan=plan, example_inputs=batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times, losses = [], []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = model(*batch)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return times, losses


def autopar_against_by_hand(model, batch, plan, train_by_hand, rounds: int, steps: int) -> dict:
    """{"autopar" / "by hand": (the median over rounds of the slowest rank's median step, the
    first step's loss)}. ``train_by_hand(rank, world, model_bytes, batch, steps)`` returns what
    train_autopar does."""
    from autopar.runtime.local_cluster import get_cluster

    buffer = io.BytesIO()
    torch.save(model, buffer)
    cluster = get_cluster(4)
    medians: dict[str, list[float]] = {"autopar": [], "by hand": []}
    first: dict[str, float] = {}
    for _ in range(rounds):
        for name, job, args in (("autopar", train_autopar, (plan.to_json(), steps)),
                                ("by hand", train_by_hand, (steps,))):
            results = cluster.run(job, buffer.getvalue(), batch, *args)
            medians[name].append(max(statistics.median(times[1:]) for times, _ in results))  # the first warms up
            first[name] = results[0][1][0]
    return {name: (statistics.median(medians[name]), first[name]) for name in medians}


def print_ratio(measured: dict) -> float:
    """Prints autopar's and the hand-written step's figures; returns their ratio."""
    (auto, auto_loss), (hand, hand_loss) = measured["autopar"], measured["by hand"]
    print(f"  autopar {auto * 1e3:.1f} ms (first loss {auto_loss:.5f}), by hand {hand * 1e3:.1f} ms "
          f"(first loss {hand_loss:.5f}): ratio {auto / hand:.3f}")
    return auto / hand
