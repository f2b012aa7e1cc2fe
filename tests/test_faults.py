"""Ranks agree or stop: ranks that run different plans, or a rank that stops running the step,
end in an error on the ranks that can still report, within the collective timeout: never a hang."""
import os
import re
import subprocess
import sys
import time

import pytest

import autopar
from autopar.runtime.local_cluster import get_cluster
from examples import mlp
from tests import workers


def _mlp():
    return mlp.make(batch=8, width=32, hidden=64)


def test_ranks_that_run_different_plans_stop_with_an_error_naming_the_ranks(fast_network):
    """Before the state is placed (its collectives would not match, and the unanswered ones would
    leave the process group unusable): ranks on other meshes are stopped by RankMesh, ranks with
    other plans on one mesh by the module. The pool then runs the next job."""
    model, inputs = _mlp()
    on_two_meshes = [autopar.plan(model, inputs, mesh=mesh, hardware=fast_network).to_json()
                     for mesh in ("dp=2", "tp=2")]
    names = [name for name, _ in model.named_parameters()]
    on_one_mesh = [autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network, pin=dict.fromkeys(names, spec))
                   .to_json() for spec in ("R", "S(0)")]  # replicated, and ZeRO-3
    hashes = [autopar.Plan.from_json(p).hash for p in on_one_mesh]
    assert hashes[0] != hashes[1]
    cluster = get_cluster(2)
    for result in cluster.run(workers.run_the_plan_of_this_rank, on_two_meshes, inputs):
        assert result["error"] == "PlanMismatchError", result
        assert "rank 0: (dp=2)" in result["message"] and "rank 1: (tp=2)" in result["message"], result["message"]
    for result in cluster.run(workers.run_the_plan_of_this_rank, on_one_mesh, inputs):  # every rank raises
        assert result["error"] == "PlanMismatchError", result
        assert f"rank 0: plan {hashes[0]}" in result["message"] and f"rank 1: plan {hashes[1]}" in result["message"]
    assert cluster.run(workers.run_the_plan_of_this_rank, on_one_mesh[:1] * 2, inputs) == [{"error": None}] * 2


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


_ORPHANING_PARENT = """
import os, sys
from autopar.runtime.local_cluster import get_cluster

def pid(rank, world_size):
    return os.getpid()

if __name__ == "__main__":
    with open(sys.argv[1], "w") as out:
        print(*get_cluster(2).run(pid), file=out)
    os._exit(0)  # as a test process ending without atexit: the pool is never closed
"""


@pytest.mark.slow  # starts a process that starts a pool
def test_a_pools_workers_end_when_their_parent_dies_without_closing_it(tmp_path):
    script, pids = tmp_path / "orphaning_parent.py", tmp_path / "pids"
    script.write_text(_ORPHANING_PARENT)
    # the workers would hold captured pipes open: their output goes nowhere
    subprocess.run([sys.executable, str(script), str(pids)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    workers = [int(p) for p in pids.read_text().split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.5)
    assert not any(_alive(p) for p in workers)


def _alive(pid: int) -> bool:
    """Running (a zombie no one has reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
