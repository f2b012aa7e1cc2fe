"""Plan files are data, never code: every field of a real plan file is replaced, in turn, by
strings meant to break out of the comment, the quotes or the name they land in; each mutated
file is refused naming the field, or loads into a plan whose programs are the original's
(the payload stays a comment or a quoted string), and no payload ever runs. A property-based
fuzz does the same for the files' structure, and the plan cache trusts only the user's own
private entries."""
from __future__ import annotations

import ast
import contextlib
import copy
import json
import os
import re
import stat
import tempfile
import warnings

import pytest

import autopar
from autopar.errors import AutoparError, PlanFormatError
from examples import mlp

MARK = os.path.join(tempfile.gettempdir(), f"autopar-injected-{os.getpid()}")
PAYLOADS = [
    f"x\nopen({MARK!r}, 'w').close()\n#",  # a new line after a comment
    f"x'); open({MARK!r}, 'w').close(); ('",  # out of a single-quoted string
    f'x"); open({MARK!r}, "w").close(); ("',  # out of a double-quoted one
    f"x\u2028open({MARK!r}, 'w').close()",  # a Unicode line separator
    f"x\ropen({MARK!r}, 'w').close()",  # a carriage return
    f"__import__('os').system('touch {MARK}')",  # code where a name goes
    "a" * 100_000,  # a very long string
    "not an identifier!",
]


@pytest.fixture(scope="module")
def planned(fast_network):
    """A real plan file (the MLP on dp=2,tp=2, sharded) that runs equal to eager, and its
    programs' syntax trees (comments are not in them)."""
    model, inputs = mlp.make(batch=8, width=32, hidden=64)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=fast_network, cache=False)
    report = autopar.check(model, inputs, plan=plan)
    assert report.ok, str(report)
    return model, inputs, plan.to_json(), _trees(plan)


def _trees(plan) -> tuple[str, str]:
    return tuple(ast.dump(ast.parse(plan.emit(backend))) for backend in ("torch", "jax"))


def _string_sites(value, path=()):
    """(path, is a mapping key) of every string in a parsed plan file."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,), True
            yield from _string_sites(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _string_sites(item, path + (i,))
    elif isinstance(value, str):
        yield path, False


def _mutated(d: dict, path: tuple, is_key: bool, payload: str) -> dict:
    out = copy.deepcopy(d)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if is_key:
        parent[payload] = parent.pop(last)
    else:
        parent[last] = payload
    return out


def _field(path: tuple) -> str:
    """The path as PlanFormatError names a field: ``graph.nodes[3].target``."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else str(step))
    return text


@pytest.mark.slow  # a sweep: an injection payload in every string field of a plan file
def test_every_string_field_either_loads_as_the_same_programs_or_is_refused_by_name(planned):
    model, inputs, text, trees = planned
    original = json.loads(text)
    sites = list(_string_sites(original))
    refused = loaded = 0
    changed = []
    for path, is_key in sites:
        for payload in PAYLOADS:
            mutated = json.dumps(_mutated(original, path, is_key, payload))
            try:
                plan = autopar.Plan.from_json(mutated)
            except PlanFormatError as exc:
                # the message names the field (for a key, the mapping that holds it)
                assert _field(path[:-1] if is_key else path) in str(exc) or _field(path[:-1]) in str(exc), \
                    (path, str(exc)[:300])
                refused += 1
                continue
            loaded += 1
            if _trees(plan) != trees:
                changed.append((path, payload, plan))
    assert not os.path.exists(MARK)
    assert refused > 0 and loaded > 0
    # a mutation that loads and changes the programs (a name that becomes a variable, the
    # hardware's name in the plan's hash) leaves them equivalent: they run equal to eager, or
    # are refused because the graph is no longer this model's
    assert len(changed) <= 40, sorted({p for p, _, _ in changed})
    fingerprint = autopar.Plan.from_json(text).fingerprint
    for path, _payload, plan in changed:
        try:
            report = autopar.check(model, inputs, plan=plan)
        except autopar.PlanMismatchError:
            assert plan.fingerprint != fingerprint, path
            continue
        assert report.ok, (path, str(report))
    assert not os.path.exists(MARK), "a payload ran"


def test_a_formula_is_read_as_arithmetic_never_evaluated(fast_network):
    model, inputs = mlp.make(batch=8, width=32, hidden=64)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware=fast_network, symbolic_dims={"batch": 0}, cache=False)
    d = json.loads(plan.to_json())
    assert autopar.Plan.from_json(json.dumps(d)).evaluate(batch=16) == pytest.approx(plan.evaluate(batch=16))
    d["formula"]["compute_s"] = f"__import__('os').system('touch {MARK}')"
    with pytest.raises(PlanFormatError, match=r"formula\.compute_s is not a cost formula"):
        autopar.Plan.from_json(json.dumps(d))
    assert not os.path.exists(MARK)


def test_without_the_checks_a_payload_would_run(planned, monkeypatch):
    """The injection test's payloads are real: with the file checks and the printer's guards
    turned off, a newline in a module path ends its comment and the next line runs."""
    from autopar.backends import printer
    from autopar.ir import plan as plan_module

    _, _, text, _ = planned
    d = json.loads(text)
    d["hardware"] = f"h100\nopen({MARK!r}, 'w').close()\n#"  # printed in the program's header comment
    monkeypatch.setattr(plan_module, "check_plan", lambda d: None)
    monkeypatch.setattr(printer, "one_line", lambda text: str(text))
    plan = autopar.Plan.from_json(json.dumps(d))
    try:
        from autopar.runtime.program import load_program

        load_program(plan.emit("torch"), "autopar_injection_probe")  # the module's top level runs
        ran = os.path.exists(MARK)
    finally:
        if os.path.exists(MARK):
            os.remove(MARK)
    assert ran


def test_structure_fuzz_loads_or_is_refused_never_crashes(planned):
    """Whole-file structure (hypothesis): a field dropped, a value of another type, a huge
    number, a deep list. Each file loads or is refused with PlanFormatError; one that loads
    emits a program or an AutoparError, never another exception, and never runs a payload."""
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    _, _, text, _ = planned
    original = json.loads(text)
    sites = _all_sites(original)
    junk = st.recursive(st.none() | st.booleans() | st.integers(min_value=-(1 << 80), max_value=1 << 80)
                        | st.floats(allow_nan=True) | st.text(max_size=30) | st.sampled_from(PAYLOADS),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=4), max_leaves=12)

    # derandomized: CI sees the same 300 files every run (27 random seeds passed when this was set)
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None,
              derandomize=True)
    @given(st.sampled_from(sites), st.sampled_from(["drop", "replace"]), junk)
    def fuzz(path, how, value):
        d = copy.deepcopy(original)
        parent = d
        for step in path[:-1]:
            parent = parent[step]
        if how == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        try:
            plan = autopar.Plan.from_json(json.dumps(d))
        except PlanFormatError:
            return
        for backend in ("torch", "jax"):
            with contextlib.suppress(AutoparError):
                plan.emit(backend)
        assert not os.path.exists(MARK)

    fuzz()
    del hypothesis


def _all_sites(value, path=()) -> list:
    sites = []
    if isinstance(value, dict):
        for key, item in value.items():
            sites.append(path + (key,))
            sites += _all_sites(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value[:3]):  # the first few entries of each list: their shapes repeat
            sites.append(path + (i,))
            sites += _all_sites(item, path + (i,))
    return sites


def test_huge_numbers_and_unknown_fields_are_refused_by_name(planned):
    _, _, text, _ = planned
    d = json.loads(text)
    d["mesh"]["shape"][0] = 10 ** 30
    with pytest.raises(PlanFormatError, match=r"mesh\.shape\[0\] must be an integer"):
        autopar.Plan.from_json(json.dumps(d))
    d = json.loads(text)
    d["graph"]["nodes"][3]["outputs"][0]["shape"] = [2] * 100
    with pytest.raises(PlanFormatError, match=r"graph\.nodes\[3\]\.outputs\[0\]\.shape must hold"):
        autopar.Plan.from_json(json.dumps(d))
    d = json.loads(text)
    d["graph"]["nodes"][3]["extra"] = 1
    with pytest.raises(PlanFormatError, match=r"graph\.nodes\[3\]\.extra is not a field"):
        autopar.Plan.from_json(json.dumps(d))
    d = json.loads(text)
    d["graph"]["nodes"][-2]["args"] = [{"ref": "no_such_node"}]
    with pytest.raises(PlanFormatError, match="no_such_node"):
        autopar.Plan.from_json(json.dumps(d))


def test_a_graph_without_the_loss_it_returns_is_refused_by_name(planned):
    """A training step's graph names its loss (found by the structure fuzz: a null loss loaded,
    and emitting it raised a ValueError); the output tree's loss leaf and the loss agree."""
    _, _, text, _ = planned
    d = json.loads(text)
    d["graph"]["loss"] = None
    with pytest.raises(PlanFormatError, match=r"graph\.loss must name the loss of a training step's graph"):
        autopar.Plan.from_json(json.dumps(d))
    d["graph"]["kind"] = "forward"
    with pytest.raises(PlanFormatError, match=r"graph\.loss is null and the graph returns no values"):
        autopar.Plan.from_json(json.dumps(d))
    d["graph"]["values"] = [d["graph"]["nodes"][-2]["name"]]
    with pytest.raises(PlanFormatError, match=r"graph\.loss must name a node exactly where graph\.output_tree"):
        autopar.Plan.from_json(json.dumps(d))


def test_the_cache_ignores_entries_another_user_could_have_written(planned, tmp_path):
    from autopar.planning import cache

    _, _, text, _ = planned
    plan = autopar.Plan.from_json(text)
    directory = tmp_path / "plans"
    cache.store("k", plan, str(directory))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700  # created private
    assert cache.load("k", str(directory)) is not None
    entry = directory / "k.json"
    os.chmod(entry, 0o666)  # world-writable: anyone could have replaced it
    with pytest.warns(UserWarning, match=r"ignoring the plan cache entry .*writable by its group or by everyone"):
        assert cache.load("k", str(directory)) is None
    os.chmod(entry, 0o600)
    assert cache.load("k", str(directory)) is not None
    os.chmod(directory, 0o777)
    with pytest.warns(UserWarning, match="not caching plans in"):
        cache.store("k2", plan, str(directory))
    assert not (directory / "k2.json").exists()
    os.chmod(directory, 0o700)
    other = os.stat(entry)
    real_stat = os.fstat

    def foreign(fd):  # an entry owned by another user (this test cannot chown: pretend)
        st_ = real_stat(fd)
        return os.stat_result((st_.st_mode, st_.st_ino, st_.st_dev, st_.st_nlink, other.st_uid + 1) + tuple(st_)[5:])

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setattr(os, "fstat", foreign)
        assert cache.load("k", str(directory)) is None
    assert any(re.search(r"belongs to user id \d+, not to this user", str(w.message)) for w in caught)
