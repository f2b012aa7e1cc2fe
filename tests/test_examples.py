"""The examples run as their docstrings say (under torchrun, on local CPU processes)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from autopar.check import MIXED_TOLERANCE

pytestmark = pytest.mark.slow  # each example starts torchrun and its processes


def _torchrun(script: str, *args: str, processes: int = 4) -> list[str]:
    """The script's output lines. A rank that aborts (a pipeline's rank 0 was seen to, rarely,
    under load: "terminate called without an active exception") prints its Python stack
    (PYTHONFAULTHANDLER), and the failure shows how far the script's output got."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", script, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert done.returncode == 0, f"stdout: {done.stdout[-1500:]}\nstderr: {done.stderr[-6000:]}"
    return done.stdout.splitlines()


def _losses(lines: list[str]) -> list[float]:
    return [float(re.search(r"loss (\S+)", line).group(1)) for line in lines]


@pytest.fixture(scope="module")
def llama_on_one_process(tmp_path_factory) -> list[float]:
    """examples/train_llama.py's first two losses on one process (mesh dp=1: the whole batch,
    no sharding)."""
    lines = _torchrun("examples/train_llama.py", "--mesh", "dp=1", "--steps", "2", "--checkpoint-dir",
                      str(tmp_path_factory.mktemp("one")), processes=1)
    return _losses([line for line in lines if line.startswith("step ")])


@pytest.mark.parametrize("mesh,resume", [("dp=2,tp=2", False), ("pp=2,dp=2", True)])
def test_the_llama_example_trains_as_on_one_process_checkpoints_and_resumes_with_the_same_losses(
        mesh, resume, llama_on_one_process, tmp_path):
    """examples/train_llama.py: a meta-built Llama initialized shard by shard, local batches,
    bf16-mixed, AdamW, accumulation under no_sync, clipping; its losses are those of the same run
    on one process: the meta init, the local batches and the accumulation add up to the same
    steps (in bf16-mixed: at autopar.check's bf16 tolerance). On pp=2,dp=2, where every one of
    these runs through the pipeline's schedule, it checkpoints every 2 steps, and a second run
    with --resume continues from step 2 with the losses of the first (the script's resume is
    the same on every mesh; tests/test_training_state.py resumes dp=2,tp=2 runs bit-equal)."""
    steps = "4" if resume else "2"
    args = ["--mesh", mesh, "--steps", steps, "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path)]
    output = _torchrun("examples/train_llama.py", *args)
    assert "computing in bfloat16" in output[-1] and mesh.replace(",", ", ") in output[-1]
    first = [line for line in output if line.startswith("step ")]
    assert [re.match(r"step (\d+):", line).group(1) for line in first] == [str(i) for i in range(1, int(steps) + 1)]
    assert all(0 < loss < 10 for loss in _losses(first))
    assert len(llama_on_one_process) == 2
    for a, b in zip(_losses(first[:2]), llama_on_one_process):
        assert abs(a - b) <= MIXED_TOLERANCE["bfloat16"][0] * abs(b)
    if resume:
        shutil.rmtree(tmp_path / "step4")
        resumed = [line for line in _torchrun("examples/train_llama.py", *args, "--resume")
                   if line.startswith("step ")]
        assert resumed == first[2:]


def test_the_torchrun_example_pipelines_with_eagers_losses():
    """examples/train_torchrun.py on a pipeline (pp=2 x dp=2): its AdamW steps and its
    evaluation give the losses of the same model trained in this process."""
    import torch

    from examples import gpt2

    lines = _torchrun("examples/train_torchrun.py", "--mesh", "pp=2,dp=2", "--steps", "3")
    pipelined = [float(re.search(r"loss (\S+)", line).group(1)) for line in lines if "loss" in line]
    model, (idx, targets) = gpt2.make("small")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eager = []
    for _ in range(3):
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        eager.append(loss.item())
    with torch.no_grad():
        eager.append(model(idx.roll(1, dims=0), targets.roll(1, dims=0)).item())
    assert pipelined == pytest.approx(eager, abs=2e-4)  # printed to 4 decimals
