"""Ranks agree or stop: ranks that run different plans, or a rank that stops running the step,
end in an error on the ranks that can still report, within the collective timeout: never a hang."""
import re

import autopar
from autopar.runtime.local_cluster import get_cluster
from examples import mlp
from tests import workers


def _mlp():
    return mlp.make(batch=8, width=32, hidden=64)


def test_ranks_that_run_different_plans_stop_with_an_error_naming_the_ranks(fast_network):
    model, inputs = _mlp()
    plans = [autopar.plan(model, inputs, mesh=mesh, hardware=fast_network).to_json() for mesh in ("dp=2", "tp=2")]
    hashes = [autopar.Plan.from_json(p).hash for p in plans]
    assert hashes[0] != hashes[1]
    results = get_cluster(2).run(workers.run_the_plan_of_this_rank, plans, inputs)
    for result in results:  # every rank raises, and says which rank runs what
        assert result["error"] == "PlanMismatchError", result
        assert f"rank 0: plan {hashes[0]}" in result["message"] and f"rank 1: plan {hashes[1]}" in result["message"]


def test_a_rank_that_stops_running_the_step_ends_in_a_timeout_naming_the_collective_and_statement(fast_network):
    model, inputs = _mlp()
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network)
    cluster = get_cluster(2)
    try:
        results = cluster.run(workers.stop_early_on_rank_1, plan.to_json(), inputs, 3.0)
    finally:
        cluster.close()  # rank 0's collective never completed: the group is not reused
    waiting = results[0]
    assert waiting["error"] == "CollectiveTimeoutError", waiting
    assert waiting["seconds"] < 3.0 + 20.0
    assert re.search(r"(all_reduce|all_gather|reduce_scatter) over mesh axis 'dp' did not complete within 3 s at "
                     r"<autopar_plan_\w+>:\d+: \w+ = rt\.", waiting["message"]), waiting["message"]
    assert results[1]["error"] is None
