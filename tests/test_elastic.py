"""examples/train_elastic.py: a run that survives losing a rank.

Two torchrun agents (c10d rendezvous, 2 processes each) train on 4 ranks; one agent is killed
with its workers, as a node that goes down; the other re-rendezvouses alone, resumes from the
newest complete checkpoint, replans for 2 ranks and finishes. Its losses are an uninterrupted
2-process run's from the same checkpoint, and the last checkpoint loads into one process.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from examples import mlp, train_elastic

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "examples" / "train_elastic.py")
STEPS = 10
KILL_AFTER = 3  # steps finished on 4 ranks before an agent is lost
STEP_SECONDS = 0.3  # so that the agent is lost mid-run
RTOL = 1e-4  # fp32 losses summed over shards in another order than one process sums them
PARAMETER_ATOL = 1e-4  # the final parameters against one process's (10 AdamW steps: about 5e-6 apart)
# a short last call, dead nodes found within 3 s: the survivors re-rendezvous in seconds
RDZV_CONF = "last_call_timeout=3,join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3"
MODEL = argparse.Namespace(batch=16, width=64, hidden=256, lr=1e-2)  # the example's defaults


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    # each restart's workers on a store of their own (see examples/train_elastic.py)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


def _script_args(checkpoints: Path, log: Path) -> list[str]:
    return [SCRIPT, "--steps", str(STEPS), "--checkpoint-dir", str(checkpoints), "--log-file", str(log),
            "--step-seconds", str(STEP_SECONDS)]


def _read_log(log: Path) -> list[dict]:
    """The log's whole lines (one being written is left for the next read)."""
    return [json.loads(line) for line in log.read_text().split("\n")[:-1]] if log.exists() else []


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (torchrun starts its workers in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL an agent (its process group) and its workers (their own groups), as a lost node."""
    workers = _descendants(proc.pid)
    for pid in [proc.pid, *workers]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _tails(named: dict[str, Path]) -> str:
    return "\n".join(f"--- {name} (last 3000 chars) ---\n{path.read_text()[-3000:] if path.exists() else ''}"
                     for name, path in named.items())


def _eager_run(steps: int) -> tuple[list[float], dict]:
    """One process, no autopar: the losses of every step and the final parameters."""
    model, _ = mlp.make(batch=MODEL.batch, width=MODEL.width, hidden=MODEL.hidden, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=MODEL.lr)
    losses = []
    for step in range(1, steps + 1):
        loss = model(*train_elastic.batch(step, MODEL))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def _start(args: list[str], name: str, tmp_path: Path, outputs: dict, procs: list) -> subprocess.Popen:
    """A torchrun in a session of its own, its output in files named in ``outputs``."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    outputs[f"{name} stdout"], outputs[f"{name} stderr"] = out, err
    with out.open("w") as stdout, err.open("w") as stderr:
        procs.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], cwd=ROOT, env=_env(),
                                      stdout=stdout, stderr=stderr, start_new_session=True))
    return procs[-1]


def _wait(proc: subprocess.Popen, timeout: float, what: str, outputs: dict) -> None:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish within {timeout} s\n" + _tails(outputs))
    assert code == 0, f"{what} failed (exit code {code})\n" + _tails(outputs)


@pytest.mark.slow
def test_losing_an_agent_resumes_on_the_survivors_with_the_uninterrupted_losses(tmp_path):
    checkpoints, log = tmp_path / "checkpoints", tmp_path / "steps.jsonl"
    port, run_id = _free_port(), f"elastic-{uuid.uuid4().hex[:8]}"
    outputs, procs = {}, []
    try:
        agents = []
        for name, is_host in (("A", 1), ("B", 0)):  # A hosts the rendezvous store and survives; B is lost
            agent = ["--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=3", "--monitor-interval=0.2",
                     "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
                     f"--rdzv-conf=is_host={is_host},{RDZV_CONF}"]
            agents.append(_start([*agent, *_script_args(checkpoints, log)], f"agent_{name}", tmp_path, outputs, procs))
        survivor, lost = agents
        deadline = time.monotonic() + 240
        while not any(r["world_size"] == 4 and r["step"] >= KILL_AFTER for r in _read_log(log)):
            assert survivor.poll() is None and lost.poll() is None, "an agent exited early\n" + _tails(outputs)
            assert time.monotonic() < deadline, "no step on 4 ranks within 240 s\n" + _tails(outputs)
            time.sleep(0.1)
        _kill_tree(lost)
        killed_at = time.monotonic()
        _wait(survivor, 300, "the surviving agent", outputs)
        recovered_in = time.monotonic() - killed_at

        records = _read_log(log)
        last_on_four = max(i for i, r in enumerate(records) if r["world_size"] == 4)
        before, after = records[:last_on_four + 1], records[last_on_four + 1:]
        assert after, "nothing logged after the agent was lost\n" + _tails(outputs)
        resumed_from = after[0]["step"] - 1  # step_<n> holds the state after step n
        # the newest complete checkpoint: every step logged on 4 ranks had been renamed step_<n>
        # (rank 0 logs after the rename; where rank 0 was lost, one more rename may have landed)
        assert before[-1]["step"] <= resumed_from <= before[-1]["step"] + 1, (before[-1], after[0])
        assert resumed_from >= KILL_AFTER
        assert [r["step"] for r in after] == list(range(resumed_from + 1, STEPS + 1)), after
        assert all(r["world_size"] == 2 and r["mesh"] == "(dp=2)" and r["restart"] >= 1 for r in after), after
        assert all(r["mesh"] == "(dp=4)" for r in before if r["world_size"] == 4), before

        # an uninterrupted 2-process run from a copy of the checkpoint the survivors resumed from
        reference_checkpoints, reference_log = tmp_path / "reference", tmp_path / "reference.jsonl"
        shutil.copytree(checkpoints / f"step_{resumed_from}", reference_checkpoints / f"step_{resumed_from}")
        standalone = ["--standalone", "--nproc-per-node=2", *_script_args(reference_checkpoints, reference_log)]
        reference_run = _start(standalone, "reference", tmp_path, outputs, procs)
        _wait(reference_run, 300, "the reference run", outputs)
        reference = _read_log(reference_log)
        assert [r["step"] for r in reference] == [r["step"] for r in after]
        assert [r["loss"] for r in after] == pytest.approx([r["loss"] for r in reference], rel=RTOL)

        # and every step's loss (4 ranks, then 2 from a resharded checkpoint) is one process's
        eager, eager_state = _eager_run(STEPS)
        final_losses = {r["step"]: r["loss"] for r in records}  # a step done twice: its last try
        assert [final_losses[s] for s in range(1, STEPS + 1)] == pytest.approx(eager, rel=RTOL)

        # the final checkpoint loads into the plain model in one process, every tensor whole
        final, _ = mlp.make(batch=MODEL.batch, width=MODEL.width, hidden=MODEL.hidden, seed=1)
        state = {"model": {k: torch.full_like(v, float("nan")) for k, v in final.state_dict().items()}}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, checkpoint_id=str(checkpoints / f"step_{STEPS}"), no_dist=True)
        final.load_state_dict(state["model"])
        for name, value in final.state_dict().items():
            assert value.shape == eager_state[name].shape and torch.isfinite(value).all(), name
            torch.testing.assert_close(value, eager_state[name], rtol=0, atol=PARAMETER_ATOL, msg=name)
        print(f"lost an agent after step {before[-1]['step']}; resumed from step_{resumed_from} on 2 ranks; "
              f"{recovered_in:.1f} s from the kill to the survivors' last step")
    finally:
        for proc in procs:
            _kill_tree(proc)


def test_an_interrupted_save_is_never_loaded(tmp_path):
    """A ``step_<n>.partial`` directory newer than the last complete ``step_<n>`` (a save cut off
    before its rename) is skipped; so are other names."""
    assert train_elastic.latest_checkpoint(str(tmp_path / "absent")) == (0, None)
    (tmp_path / "step_2").mkdir()
    (tmp_path / "step_10").mkdir()
    (tmp_path / "step_10" / ".metadata").write_bytes(b"whole")
    (tmp_path / "step_11.partial").mkdir()
    (tmp_path / "step_11.partial" / "__0_0.distcp").write_bytes(b"\x00garbage")
    (tmp_path / "step_12").write_text("a file, not a checkpoint directory")
    (tmp_path / "notes").mkdir()
    assert train_elastic.latest_checkpoint(str(tmp_path)) == (10, str(tmp_path / "step_10"))
