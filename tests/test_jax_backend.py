"""The JAX backend: the plan emitted as a sharded JAX program (shard_map with explicit lax
collectives), run on CPU devices in a fresh interpreter, against single-process torch eager."""
import os
import subprocess
import sys

import pytest

import autopar
from autopar.errors import AutoparError
from examples import gpt2, mlp
from tests.workers import FAST

MODELS = {"mlp": lambda: mlp.make(batch=16, width=64, hidden=256), "gpt2": lambda: gpt2.make("tiny")}


@pytest.mark.parametrize("mesh", ["dp=8", "dp=2,tp=4", "dp=4,tp=2"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_jax_program_matches_torch_eager(name, mesh):
    model, inputs = MODELS[name]()
    plan = autopar.plan(model, inputs, mesh=mesh, hardware=FAST)
    report = autopar.check(model, inputs, plan=plan, backend="jax")
    assert report.ok, str(report)
    assert len(report.tensors) == 1 + len(list(model.parameters()))  # the loss and every gradient
    if "tp" in mesh:  # the program really is sharded: its collectives are explicit lax calls on the axes
        source = plan.emit("jax")
        assert "jax.shard_map(local_step" in source
        assert any(f"lax.{c}(" in source and "'tp'" in source for c in ("psum", "all_gather", "psum_scatter"))


def test_the_emitted_file_runs_standalone_and_prints_the_loss(tmp_path):
    import numpy as np
    import torch

    model, inputs = MODELS["gpt2"]()
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST)
    source = tmp_path / "gen.py"
    source.write_text(plan.emit("jax"))
    np.savez(tmp_path / "params.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
    np.savez(tmp_path / "batch.npz", **{f"x{i}": x.numpy() for i, x in enumerate(inputs)})
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(source), "--params", str(tmp_path / "params.npz"),
                           "--batch", str(tmp_path / "batch.npz")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = float(done.stdout.split("loss")[-1])
    with torch.no_grad():
        assert printed == pytest.approx(model(*inputs).item(), rel=1e-5)


def test_cli_emits_and_checks_the_jax_program(tmp_path, capsys):
    from autopar.cli import main as cli

    gen = tmp_path / "gen.py"
    assert cli(["plan", "examples.mlp:factory", "--mesh", "dp=2,tp=2", "--emit", f"jax:{gen}", "--quiet"]) == 0
    assert "def local_step(" in gen.read_text()
    assert cli(["check", "examples.mlp:factory", "--mesh", "dp=2,tp=2", "--backend", "jax"]) == 0
    assert "OK" in capsys.readouterr().out


def test_an_op_without_a_translation_is_named(fast_network):
    import torch
    from torch import nn

    class Erf(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return torch.special.erf(self.fc(x)).sum()

    model, inputs = Erf(), (torch.randn(8, 16),)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network)
    with pytest.raises(AutoparError, match=r"no translation of aten\.erf\.default \(node erf"):
        plan.emit("jax")


def test_the_emitted_optimizer_updates_match_torch(tmp_path):
    """sgd_update and adamw_update of the emitted module against torch.optim, two steps."""
    import importlib.util

    import numpy as np
    import torch

    model, inputs = MODELS["mlp"]()
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=FAST)
    (tmp_path / "gen.py").write_text(plan.emit("jax"))
    spec = importlib.util.spec_from_file_location("autopar_generated_step", tmp_path / "gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    torch.manual_seed(0)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = [{n: torch.randn_like(p) for n, p in weights.items()} for _ in range(2)]
    for name, make_torch, update in [
        ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1), lambda p, g, s: (module.sgd_update(p, g, lr=0.1), s)),
        ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
         lambda p, g, s: module.adamw_update(p, g, s, lr=1e-2, weight_decay=0.01)),
    ]:
        tensors = {n: w.clone().requires_grad_() for n, w in weights.items()}
        opt = make_torch(list(tensors.values()))
        params, state = {n: w.numpy() for n, w in weights.items()}, {}
        for g in grads:
            for n, t in tensors.items():
                t.grad = g[n].clone()
            opt.step()
            params, state = update(params, {n: v.numpy() for n, v in g.items()}, state)
        for n, t in tensors.items():
            np.testing.assert_allclose(np.asarray(params[n]), t.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
