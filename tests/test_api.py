"""The one-line API inside a process group, and the CLI."""
import json

import pytest
import torch
import torch.nn.functional as F

import autopar
from autopar.cli import main as cli
from autopar.runtime.local_cluster import get_cluster
from tests import workers


def test_decorated_class_trains_like_eager():
    results = get_cluster(4).run(workers.train_decorated, 3)
    torch.manual_seed(0)
    reference = workers.DecoratedMLP.__mro__[1]()  # the undecorated class, with rank 0's init
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 32, generator=g), torch.randn(8, 32, generator=g)
    expected = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(reference.fc2(F.gelu(reference.fc1(x))), y)
        loss.backward()
        opt.step()
        expected.append(loss.item())
    assert len({r["plan"] for r in results}) == 1  # rank 0 planned, the others received the same plan
    assert results[0]["sharded_params"] > 0
    full_shapes = [tuple(p.shape) for p in reference.parameters()]
    assert results[0]["local_shapes"] != full_shapes  # parameters now hold local blocks
    assert results[0]["global_shapes"] == full_shapes  # as DTensors of the whole shape
    for r in results:
        assert r["losses"] == pytest.approx(expected, rel=1e-5)


def test_decorated_class_accumulates_micro_batches_under_no_sync_like_eager():
    results = get_cluster(4).run(workers.train_decorated_in_micro_batches, 3)
    torch.manual_seed(0)
    reference = workers.DecoratedMLP.__mro__[1]()
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 32, generator=g), torch.randn(8, 32, generator=g)
    expected = []
    for _ in range(3):
        opt.zero_grad()
        losses = [F.mse_loss(reference.fc2(F.gelu(reference.fc1(x[k:k + 4]))), y[k:k + 4]) / 2 for k in (0, 4)]
        for loss in losses:
            loss.backward()
        opt.step()
        expected.append(sum(loss.item() for loss in losses))
    for r in results:
        assert r["losses"] == pytest.approx(expected, rel=1e-5)


def test_mesh_that_does_not_fit_the_world_is_refused_before_planning():
    results = get_cluster(2).run(workers.wrap_instance_with_wrong_mesh)
    for r in results:
        assert r["error"] and "4 devices but the process group has 2 ranks" in r["error"]
        assert r["planned"] is False


def test_cli_plan_writes_plan_and_program(tmp_path, capsys):
    out, gen = tmp_path / "plan.json", tmp_path / "gen.py"
    code = cli(["plan", "examples.mlp:factory", "--mesh", "tp=4", "--out", str(out), "--emit", f"torch:{gen}",
                "--quiet"])
    assert code == 0
    text = capsys.readouterr().out
    assert "fc1.weight" in text and "predicted step time" in text
    plan = autopar.Plan.from_json(out.read_text())
    assert json.loads(out.read_text())["format_version"] == 1
    assert gen.read_text() == plan.emit("torch")


def test_cli_plan_takes_a_memory_budget_and_the_offload_choice(tmp_path, capsys):
    """--offload always offloads every parameter; --offload never under a budget only offload
    meets is refused naming the budget."""
    out = tmp_path / "plan.json"
    assert cli(["plan", "examples.mlp:factory", "--mesh", "dp=2", "--hardware", "a100-sxm-80g", "--offload", "always",
                "--out", str(out), "--quiet"]) == 0
    plan = autopar.Plan.from_json(out.read_text())
    assert plan.offload is not None and len(plan.offload.params) == len(plan.graph.params)
    assert "offload:" in capsys.readouterr().out
    assert cli(["plan", "examples.mlp:factory", "--mesh", "dp=2", "--hardware", "a100-sxm-80g", "--offload", "never",
                "--memory-budget", "1KiB", "--quiet"]) == 2
    assert "fits the memory budget of 1.0 KB" in capsys.readouterr().err


@pytest.mark.slow  # starts a fresh Python process
def test_python_dash_m_autopar_is_the_autopar_command(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "plan.json"
    done = subprocess.run([sys.executable, "-m", "autopar", "plan", "examples.mlp:factory", "--mesh", "tp=2",
                           "--out", str(out), "--quiet", "--no-cache"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert autopar.Plan.from_json(out.read_text()).mesh == autopar.Mesh.parse("tp=2")
    bad = subprocess.run([sys.executable, "-m", "autopar", "plan", "examples.mlp", "--mesh", "tp=2"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "MODULE:FACTORY" in bad.stderr


def test_autopar_plans_and_emits_torch_without_jax_installed():
    """JAX is an optional dependency (the README's demo installs autopar without it)."""
    import subprocess
    import sys

    script = ("import sys; sys.modules['jax'] = None\n"  # as if not installed: importing it fails
              "import autopar\n"
              "from examples import mlp\n"
              "plan = autopar.plan(*mlp.make(batch=8, width=64, hidden=128), mesh='tp=2', cache=False)\n"
              "print('def forward(' in plan.emit('torch'))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_cli_check_runs_and_reports(capsys):
    assert cli(["check", "examples.mlp:factory", "--mesh", "dp=2"]) == 0
    assert "OK" in capsys.readouterr().out


def test_cli_reports_bad_input_clearly(capsys):
    assert cli(["plan", "examples.mlp", "--mesh", "tp=4"]) == 2
    assert "MODULE:FACTORY" in capsys.readouterr().err
    assert cli(["plan", "examples.mlp:factory", "--mesh", "tp"]) == 2
    assert "dp=2,tp=2" in capsys.readouterr().err


def test_an_autoparallelized_model_stays_its_class_and_copies_as_a_plain_model():
    """autoparallelize swaps the instance's class for one routed subclass per class; a deepcopy or
    a saved copy is the plain model (as eager, before any sharding), not a second runner's."""
    import copy
    import io

    from examples import mlp

    model = autopar.autoparallelize(mlp.MLP(8, 16), mesh="dp=2")
    other = autopar.autoparallelize(mlp.MLP(8, 16), mesh="tp=2")
    assert isinstance(model, mlp.MLP) and type(model) is type(other) and type(model) is not mlp.MLP
    assert [n for n, _ in model.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    twin = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    assert type(twin) is mlp.MLP and type(torch.load(buffer, weights_only=False)) is mlp.MLP
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.equal(twin(x, y), mlp.MLP.forward(model, x, y))  # runs eagerly, as the original's forward
    with pytest.raises(autopar.AutoparError, match="autoparallelized already"):
        autopar.autoparallelize(model, mesh="dp=2")


def test_every_option_is_declared_once_and_the_api_and_command_take_it_from_there(capsys):
    import inspect

    from autopar.cli import main
    from autopar.ir.options import OPTIONS, declared

    for function in (autopar.plan, autopar.check, autopar.autoparallelize):
        keywords = [p.name for p in inspect.signature(function).parameters.values()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY]
        assert keywords == [o.name for o in declared(function.__name__)]
    assert inspect.signature(autopar.plan).parameters["mesh"].default is inspect.Parameter.empty  # required
    assert inspect.signature(autopar.plan).parameters["solver_work_limit"].default == 100_000
    with pytest.raises(TypeError, match="unexpected option 'solver_timelimit_s'; did you mean 'solver_time_limit_s'"):
        autopar.plan(torch.nn.Linear(2, 2), (torch.randn(1, 2),), mesh="dp=1", solver_timelimit_s=1)
    with pytest.raises(TypeError, match="plan\\(\\) needs the option 'mesh'"):
        autopar.plan(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    flags = {o.cli_flag for o in OPTIONS if "plan" in o.cli}
    assert {"--work-limit", "--time-limit", "--no-cache", "--offload", "--mesh"} <= flags
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = capsys.readouterr().out
    for option in OPTIONS:
        if "plan" in option.cli:
            assert option.cli_flag in help_text, option.name


def test_verbose_logs_each_stage_of_planning_to_stderr_and_quiet_logs_nothing(capsys, caplog):
    from examples import mlp

    model, inputs = mlp.make(batch=4, width=8, hidden=8)
    options = dict(mesh="dp=2", cache=False)
    autopar.plan(model, inputs, **options)
    assert capsys.readouterr().err == ""
    autopar.plan(model, inputs, **options, verbose=True)
    err = capsys.readouterr().err
    assert "[autopar.api] capturing the training step" in err and "sharding" in err
    with caplog.at_level("INFO", logger="autopar"):  # the caller's own logging configuration
        autopar.plan(model, inputs, **options)
    assert any("capturing the training step" in r.getMessage() for r in caplog.records)
