"""The plan cache: a second autopar.plan of the same step and options loads the plan, anything
that decides the plan keys it, and a bad entry is a miss, never an error."""
import dataclasses
import json

import pytest
import torch

import autopar
from autopar.cli import main as cli
from autopar.ops.kinds import unary
from autopar.ops.table import RULES
from autopar.passes.base import Pass
from autopar.planning import cache as plan_cache
from examples import mlp
from tests.workers import FAST


class Solved(Exception):
    """Raised instead of running the passes: the plan did not come from the cache."""


@pytest.fixture
def model_and_inputs():
    return mlp.make(batch=8, width=64, hidden=256)


@pytest.fixture
def first(model_and_inputs, tmp_path):
    """A plan solved and stored in an empty cache directory."""
    model, inputs = model_and_inputs
    plan = autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path))
    assert [r.name for r in plan.history][-1] != "cache"
    assert len(list(tmp_path.glob("*.json"))) == 1
    return plan


@pytest.fixture
def no_solving(monkeypatch):
    def solve(*args, **kwargs):
        raise Solved

    monkeypatch.setattr(autopar.api, "run", solve)


def test_the_same_plan_again_is_loaded_without_solving(first, model_and_inputs, tmp_path, no_solving):
    model, inputs = model_and_inputs
    again = autopar.plan(model, inputs, mesh={"tp": 2}, hardware=FAST, cache_dir=str(tmp_path))  # same mesh
    assert again.hash == first.hash and again.fingerprint == first.fingerprint
    assert again.history[:-1] == first.history  # the passes that made it, then where it came from
    record = again.history[-1]
    assert record.name == "cache" and str(tmp_path) in record.note
    assert f"plan cache: loaded from {tmp_path}" in again.summary()
    assert again.emit("torch") == first.emit("torch")  # the program does not depend on where the plan came from


@pytest.mark.parametrize("change", [
    {"mesh": "dp=2"},
    {"hardware": dataclasses.replace(FAST, memory_bandwidth=FAST.memory_bandwidth / 2)},  # same name, other spec
    {"pin": {"fc1.weight": "R"}},
    {"memory_budget": "1GiB"},
    {"optimizer": "sgd"},
    {"recompute": "none"},
    {"solver": "cp-sat"},
    {"solver_time_limit_s": 30.0},
    {"cluster_layers": False},
    {"symbolic_dims": {"batch": 0}},
])
def test_anything_that_decides_the_plan_is_a_miss(first, model_and_inputs, tmp_path, no_solving, change):
    model, inputs = model_and_inputs
    options = {"mesh": "tp=2", "hardware": FAST, **change}
    with pytest.raises(Solved):
        autopar.plan(model, inputs, cache_dir=str(tmp_path), **options)


@pytest.mark.parametrize("change", ["eval mode", "frozen parameter", "keyword call"])
def test_what_the_graph_alone_does_not_show_is_a_miss(first, model_and_inputs, tmp_path, no_solving, change):
    """The same ATen graph from another mode (an MLP has no dropout), with a parameter frozen, or
    from another call structure is another plan: a cached one would run in the wrong mode, give a
    frozen parameter a gradient, or take the call apart wrongly."""
    import copy

    model, (x, y) = model_and_inputs
    model = copy.deepcopy(model)
    args, kwargs = (x, y), {}
    if change == "eval mode":
        model.eval()
    elif change == "frozen parameter":
        model.fc2.bias.requires_grad_(False)
    else:
        args, kwargs = (x,), {"y": y}
    with pytest.raises(Solved):
        autopar.plan(model, args, kwargs=kwargs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path))


class _AThenB(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).pow(2).mean()


class _BThenA(torch.nn.Module):
    """_AThenB's graph exactly, its parameters registered and named the other way round."""

    def __init__(self):
        super().__init__()
        self.b, self.a = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.a(torch.relu(self.b(x))).pow(2).mean()


def test_the_same_graph_with_other_parameter_names_is_a_miss(tmp_path, monkeypatch):
    """A cache hit would hand b's weights to the op that reads a's."""
    x = torch.randn(4, 16)
    first = autopar.plan(_AThenB(), (x,), mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path))
    assert sorted(first.graph.params.values()) == ["a.bias", "a.weight", "b.bias", "b.weight"]

    def solve(*args, **kwargs):
        raise Solved

    monkeypatch.setattr(autopar.api, "run", solve)
    with pytest.raises(Solved):
        autopar.plan(_BThenA(), (x,), mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path))


def test_other_autopar_code_is_a_miss(first, model_and_inputs, tmp_path, no_solving, monkeypatch):
    model, inputs = model_and_inputs
    monkeypatch.setattr(plan_cache, "code_version", lambda: "edited")
    with pytest.raises(Solved):
        autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path))


def test_cache_false_neither_reads_nor_writes(first, model_and_inputs, tmp_path, no_solving):
    model, inputs = model_and_inputs
    with pytest.raises(Solved):
        autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path), cache=False)


def test_an_uncached_plan_writes_nothing(model_and_inputs, tmp_path):
    model, inputs = model_and_inputs
    autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path), cache=False)
    autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path), restrict=lambda node, s: True)
    assert list(tmp_path.iterdir()) == []


def test_code_the_key_cannot_see_is_never_cached(monkeypatch):
    class Noop(Pass):
        name = "noop"

        def run(self, program, ctx):
            return ""

    assert plan_cache.cacheable(None, ())
    assert not plan_cache.cacheable(lambda node, strategy: True, ())
    assert not plan_cache.cacheable(None, (Noop(),))
    op = next(iter(RULES))
    monkeypatch.setitem(RULES, op, unary())  # what autopar.register_rule does
    assert not plan_cache.cacheable(None, ())


@pytest.mark.parametrize("entry", ["{not json", "", '{"format_version": 0}', '{"format_version": 1, "mesh": {}}'])
def test_a_corrupt_or_old_entry_is_a_miss_and_is_replaced(first, model_and_inputs, tmp_path, entry):
    model, inputs = model_and_inputs
    (path,) = tmp_path.glob("*.json")
    path.write_text(entry)
    again = autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path))
    assert again.hash == first.hash and again.history[-1].name != "cache"
    assert autopar.Plan.from_json(path.read_text()).hash == first.hash
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_a_cached_plan_that_hit_a_solver_limit_still_warns(first, model_and_inputs, tmp_path, no_solving):
    model, inputs = model_and_inputs
    (path,) = tmp_path.glob("*.json")
    body = json.loads(path.read_text())
    body["solver"].update(status="feasible", gap=0.05)
    path.write_text(json.dumps(body))
    with pytest.warns(UserWarning, match=r"within 5\.0% of optimal"):
        again = autopar.plan(model, inputs, mesh="tp=2", hardware=FAST, cache_dir=str(tmp_path))
    assert again.history[-1].name == "cache"


def test_the_default_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(tmp_path / "plans"))
    assert plan_cache.default_dir() == str(tmp_path / "plans")
    monkeypatch.delenv("AUTOPAR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert plan_cache.default_dir() == str(tmp_path / "autopar" / "plans")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert plan_cache.default_dir() == str(tmp_path / ".cache" / "autopar" / "plans")


def test_cli_cache_dir_and_no_cache(tmp_path, capsys):
    args = ["plan", "examples.mlp:factory", "--mesh", "tp=4", "--quiet", "--cache-dir", str(tmp_path)]
    assert cli(args) == 0
    solved = capsys.readouterr().out
    assert "plan cache" not in solved and len(list(tmp_path.glob("*.json"))) == 1
    assert cli(args) == 0
    assert f"plan cache: loaded from {tmp_path}" in capsys.readouterr().out
    assert cli(args + ["--no-cache"]) == 0
    assert "plan cache" not in capsys.readouterr().out
