"""Offload (PatrickStar): parameters and optimizer state in host chunks, moved as the plan fixes.

The eviction schedule against brute force, the planner's choices against the cost model (fake
tensors), and offloading plans run on gloo against eager AdamW (losses and parameters), with the
run's device memory against the plan's prediction."""
import copy
import dataclasses
import io
import random

import pytest
import torch

import autopar
from autopar.runtime.local_cluster import get_cluster
from autopar.solvers.chunks import FETCH, fewest_fetches_brute_force, furthest_in_future, pack, stalls
from examples import gpt2
from tests import tiers, workers


def _resident_after_moves(schedule, needs):
    """Replays the moves: the chunks on the device during each statement."""
    on, during = set(), []
    for i in range(len(needs) + 1):
        for at, kind, chunk in schedule.moves:
            if at == i:
                (on.add if kind == FETCH else on.discard)(chunk)
        if i < len(needs):
            during.append(set(on))
    return during, on


def test_furthest_in_future_fetches_as_few_chunks_as_brute_force():
    rng = random.Random(0)
    for _ in range(400):
        chunks, slots = rng.randint(2, 6), rng.randint(1, 3)
        needs = [frozenset(rng.sample(range(chunks), rng.randint(0, min(slots, chunks))))
                 for _ in range(rng.randint(1, 12))]
        schedule = furthest_in_future(needs, slots)
        assert schedule.fetches == fewest_fetches_brute_force(needs, slots), (needs, slots)
        during, left = _resident_after_moves(schedule, needs)
        assert all(need <= on and len(on) <= slots for need, on in zip(needs, during))
        assert not left  # every chunk leaves the device by the end
        assert [len(on) for on in during] == list(schedule.resident)


def test_pack_keeps_order_and_refuses_an_item_larger_than_a_chunk():
    assert pack([3, 3, 2, 5, 1], 6) == [[0, 1], [2], [3, 4]]
    with pytest.raises(ValueError, match="larger than a chunk"):
        pack([7], 6)


def test_copies_hide_under_compute_only_where_they_can_overlap():
    needs = [frozenset(), frozenset(), frozenset({0}), frozenset({1})]
    schedule = furthest_in_future(needs, 2)  # both fetched before statement 0
    waited, busy = stalls([1.0, 1.0, 1.0, 1.0], schedule, needs, 0.5, overlap=True)
    assert (waited, busy) == (0.0, 1.0)  # 1 s of copies under 2 s of compute
    waited, _ = stalls([1.0, 1.0, 1.0, 1.0], schedule, needs, 0.5, overlap=False)
    assert waited == 1.0
    waited, _ = stalls([0.0, 0.0, 0.0, 0.0], schedule, needs, 0.5, overlap=True)
    assert waited == 1.0  # nothing to hide under


@pytest.fixture(scope="module")
def tiny():
    model, inputs = gpt2.make("tiny")
    loose = autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g", offload=False)
    return model, inputs, loose


def test_offload_only_when_the_budget_forces_it(tiny):
    model, inputs, loose = tiny
    assert loose.offload is None
    roomy = autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g")
    assert roomy.offload is None and roomy.hash == loose.hash
    tight = autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g",
                         memory_budget=0.35 * loose.predicted.peak_memory_bytes)
    assert tight.offload is not None
    assert tight.predicted.peak_memory_bytes <= 0.35 * loose.predicted.peak_memory_bytes
    with pytest.raises(autopar.AutoparError, match="no plan"):
        autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g", offload=False,
                     memory_budget=0.35 * loose.predicted.peak_memory_bytes)


# eps well above float32 noise: attention's key bias has a gradient of exactly zero (softmax
# ignores a shift shared by every key), which eager computes as 0 and a sharded sum as ~1e-9;
# Adam's step m / (sqrt(v) + eps) would blow that noise up to a full step of lr
ADAMW = {"lr": 1e-2, "eps": 1e-3}


def _eager_adamw(model, inputs, steps):
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(steps):
        loss = model(*inputs)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, dict(model.named_parameters())


def _run(model, inputs, plan, steps=3):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return get_cluster(plan.mesh.size).run(workers.train_offloaded, buffer.getvalue(), inputs, plan.to_json(),
                                           steps, ADAMW)


# on the A100 preset streaming the offloaded state through the device beats the host's Adam;
# with a host that steps Adam a million times faster, the host does it
HOST_STEPPING = dataclasses.replace(autopar.PRESETS["a100-sxm-80g"], name="a100-fast-host-adam",
                                    host_optimizer_rate=1e15)


@pytest.mark.parametrize("hardware, place", [("a100-sxm-80g", "device"), (HOST_STEPPING, "host")])
def test_an_offloading_plan_trains_as_eager_adamw_within_its_predicted_memory(tiny, hardware, place):
    """A budget only offload meets (35% of the unconstrained peak): the plan runs 3 AdamW steps
    equal to eager's, its state stepped where the plan says, and the step's device memory
    (MemTracker's peak less what lives in host memory) is the predicted peak within 10%."""
    model, inputs, _ = tiny
    loose = autopar.plan(model, inputs, mesh="dp=2", hardware=hardware, offload=False)
    budget = 0.35 * loose.predicted.peak_memory_bytes
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=hardware, memory_budget=budget)
    assert plan.offload is not None and plan.offload.optimizer.place == place
    assert plan.offload.fetches > len(plan.offload.chunks)  # chunks leave and come back within a step
    ranks = _run(model, inputs, plan)
    losses, params = _eager_adamw(model, inputs, 3)
    for got in ranks:
        assert got["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        for name, value in params.items():
            torch.testing.assert_close(got["params"][name], value.detach(), rtol=1e-4, atol=1e-5, msg=name)
        memory = got["memory"]
        assert memory["chunk_peak"] == max(plan.offload.device_bytes)
        assert (memory["device_steps"] == len(plan.offload.chunks)) == (place == "device")  # one step's chunks
        device = memory["tracked_peak"] - memory["host"]
        assert device == pytest.approx(plan.predicted.peak_memory_bytes, rel=0.10), memory


@pytest.mark.slow  # a sweep of hardware, each planned under a budget
def test_sharding_wins_over_a_slow_host_link_and_offload_over_a_slow_network(tiny):
    """The same budget (60% of the unconstrained peak) on two machines: where the network is far
    faster than the host link, parameters are sharded over dp and nothing is offloaded; where
    the host link (and the host's optimizer) is far faster, parameters stay whole and offload."""
    model, inputs, _ = tiny
    base = autopar.PRESETS["a100-sxm-80g"]
    fast_network = dataclasses.replace(base, name="fast-network", intra_node=autopar.Link(1e14, 1e-9),
                                       inter_node=autopar.Link(1e14, 1e-9), host_link=autopar.Link(1e9, 1e-5),
                                       host_optimizer_rate=1e8)
    fast_host = dataclasses.replace(base, name="fast-host", intra_node=autopar.Link(1e9, 1e-5),
                                    inter_node=autopar.Link(1e9, 1e-5), host_link=autopar.Link(1e14, 1e-9),
                                    host_optimizer_rate=1e15)
    chosen = {}
    for hardware in (fast_network, fast_host):
        loose = autopar.plan(model, inputs, mesh="dp=2", hardware=hardware, offload=False)
        budget = 0.6 * loose.predicted.peak_memory_bytes
        plan = autopar.plan(model, inputs, mesh="dp=2", hardware=hardware, memory_budget=budget)
        assert plan.predicted.peak_memory_bytes <= budget
        sharded = [f for f in plan.graph.params.values() if not plan.param_spec(f).is_replicated()]
        chosen[hardware.name] = (plan.offload is not None, len(sharded))
    assert chosen["fast-network"][0] is False and chosen["fast-network"][1] > 0
    assert chosen["fast-host"] == (True, 0)


def test_offload_options_and_targets_are_checked(tiny):
    model, inputs, _ = tiny
    with pytest.raises(autopar.AutoparError, match="offload='yes'"):
        autopar.plan(model, inputs, mesh="dp=2", offload="yes")
    with pytest.raises(autopar.AutoparError, match="offload=True with optimizer='kfac'"):
        autopar.plan(model, inputs, mesh="pp=2", offload=True, optimizer="kfac")
    forced = autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g", offload=True)
    assert len(forced.offload.params) == len(forced.graph.params)  # True: every parameter
    assert "offload=True" in forced.offload.reason
    with pytest.raises(autopar.AutoparError, match="only the torch backend"):
        forced.emit("jax")
    assert autopar.Plan.from_json(forced.to_json()) == forced
    assert "chunk 0:" in forced.explain("offload") and "offload:" in forced.summary()
    with pytest.raises(autopar.AutoparError, match="'chunk N'"):
        forced.explain("chunk 99")


def test_parameters_replaced_after_offloading_are_refused(tiny):
    """load_state_dict(assign=True) swaps the parameters for tensors outside their host chunks,
    which the programs would no longer read: the next call says so instead of computing with
    the old values."""
    model, inputs, loose = tiny
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g",
                        memory_budget=0.35 * loose.predicted.peak_memory_bytes)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    errors = get_cluster(2).run(workers.offloaded_after_assigning_a_state_dict, buffer.getvalue(), inputs,
                                plan.to_json())
    assert all(e is not None and "no longer the block autopar keeps in host memory" in e for e in errors)


# ---- pipelines: whole stages' state in host memory (autopar.ir.pipeline.StageOffload) ----------

PIPELINE = gpt2.GPT2Config(vocab=96, seq=16, layers=2, heads=2, width=48, batch=8)


@pytest.mark.slow  # ten pipeline plans; the inner loop trains an offloaded pipeline below
def test_a_pipeline_offloads_its_stages_when_asked_or_when_nothing_else_fits():
    """offload=True keeps every stage's state in host memory, prices each action's copies and
    the host's optimizer step, and predicts a lower device peak; 'auto' offloads only under a
    budget that no schedule meets with the state on the device, which offload=False refuses."""
    model, inputs = gpt2.make(PIPELINE)
    options = dict(mesh="pp=2,dp=2", hardware=workers.FAST, schedule="1F1B", microbatches=4, cache=False)
    held = autopar.plan(model, inputs, offload=False, **options)
    forced = autopar.plan(model, inputs, offload=True, **options)
    assert held.pipeline.offload is None and forced.pipeline.offload.reason == "offload=True"
    stages, offload, m = forced.pipeline.stages, forced.pipeline.offload, 4
    for rank in range(2):
        mine = [st for st in stages if st.rank == rank]
        params = sum(st.parameter_bytes / 2 for st in mine)
        assert offload.host_bytes[rank] == sum(st.parameter_bytes + st.optimizer_bytes for st in mine)
        assert offload.up_bytes[rank] == 3 * m * params + params  # F, I, W; the gradient sum for the syncs
        assert offload.down_bytes[rank] == m * params
        assert offload.optimizer_s[rank] > 0
    assert max(forced.pipeline.rank_peak_bytes) < max(held.pipeline.rank_peak_bytes)
    assert forced.predicted.memory_bytes["optimizer_state"] == 0
    assert forced.predicted.step_time_s > held.predicted.step_time_s  # the copies and the host's step
    assert autopar.Plan.from_json(forced.to_json()) == forced and forced.hash != held.hash
    assert all("host memory" in text for text in (forced.summary(), forced.explain("pp"), forced.explain("offload")))

    budget = (max(forced.pipeline.rank_peak_bytes) + max(held.pipeline.rank_peak_bytes)) / 2
    with pytest.raises(autopar.AutoparError, match="no pipeline schedule fits"):
        autopar.plan(model, inputs, offload=False, memory_budget=budget, recompute="none", **options)
    auto = autopar.plan(model, inputs, memory_budget=budget, recompute="none", **options)
    assert auto.pipeline.offload is not None and "no schedule fits" in auto.pipeline.offload.reason
    assert autopar.plan(model, inputs, **options).pipeline.offload is None  # the default budget fits
    # a budget the micro-batch's whole program misses with the model's state on the device
    tight = 1.01 * max(forced.pipeline.rank_peak_bytes)
    with pytest.raises(autopar.AutoparError, match="fits the memory budget"):
        autopar.plan(model, inputs, offload=False, memory_budget=tight, **options)
    assert max(autopar.plan(model, inputs, memory_budget=tight, **options).pipeline.rank_peak_bytes) <= tight


@pytest.mark.parametrize("schedule", tiers.sampled(["InterleavedZeroBubble", "1F1B"],
                                                   inner_loop=["InterleavedZeroBubble"]))
def test_an_offloaded_pipeline_trains_as_eager_adamw_and_moves_the_bytes_it_predicts(schedule):
    """pp=2 x dp=2 with every stage's state in host memory: 3 AdamW steps (the optimizer built
    before the first call) equal eager's, and each rank's stages move up and down exactly the
    bytes the plan predicts, holding one stage's parameters and gradients at a time."""
    model, inputs = gpt2.make(PIPELINE)
    plan = autopar.plan(model, inputs, mesh="pp=2,dp=2", hardware=workers.FAST, schedule=schedule, microbatches=4,
                        offload=True, cache=False)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    ranks = get_cluster(4).run(workers.train_offloaded_pipeline, buffer.getvalue(), inputs, plan.to_json(), 3, ADAMW)
    losses, params = _eager_adamw(model, inputs, 3)
    offload, seen = plan.pipeline.offload, set()
    for rank, got in enumerate(ranks):
        assert got["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        for name, value in got["params"].items():
            if name in params:  # a tied weight's copy on a later stage is named as its reader names it
                torch.testing.assert_close(value, params[name].detach(), rtol=1e-4, atol=1e-5, msg=name)
                seen.add(name)
        pp_rank = plan.device_mesh.coords(rank)[0]
        mine = [st for st in plan.pipeline.stages if st.rank == pp_rank]
        assert got["moved"] == {"up": offload.up_bytes[pp_rank], "down": offload.down_bytes[pp_rank],
                                "peak": max(st.parameter_bytes for st in mine)}
    assert seen == set(params)
