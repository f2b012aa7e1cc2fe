"""autopar profile: a plan run under torch.profiler on local processes, its measured traces
beside the predicted one, and their times per op class."""
import pytest

import autopar
from autopar.cli import main as cli
from autopar.profile import CLASSES, COLLECTIVES, UNPRICED, op_class, predicted_classes, profile
from autopar.runtime.rank_mesh import WAIT_EVENT
from examples import gpt2
from tests.traces import valid_chrome_trace
from tests.workers import FAST

TINY = gpt2.GPT2Config(vocab=96, seq=16, layers=2, heads=2, width=48, batch=8)


def test_op_classes_name_graph_and_profiler_ops_alike():
    assert op_class("aten.mm.default") == op_class("aten::mm") == "matmul"
    assert op_class("aten.native_layer_norm_backward.default") == "normalization"
    assert op_class("aten::gelu") == op_class("aten.gelu.default") == "other ops"


def test_a_profiled_plan_writes_both_traces_and_compares_every_class(tmp_path):
    model, inputs = gpt2.make(TINY)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST, cache=False)
    report = profile(plan, model, inputs, out_dir=tmp_path, steps=2)
    predicted = valid_chrome_trace(report.predicted_trace)
    assert sum(e["dur"] for e in predicted if e["cat"] == "op") == pytest.approx(
        1e6 * sum(seconds for cls, seconds in predicted_classes(plan).items() if cls != COLLECTIVES))
    assert len(report.measured_traces) == 4
    for path in report.measured_traces:
        names = {e["name"] for e in valid_chrome_trace(path)}
        assert "aten::mm" in names and any(n.startswith("c10d::") for n in names)  # ops and collectives ran
        assert any(n.startswith(WAIT_EVENT) for n in names)  # and the waits for them are named
    rows = {r.name: r for r in report.rows}
    assert list(rows) == list(CLASSES)
    assert rows["matmul"].predicted_s > 0 and rows["matmul"].measured_s > 0
    assert rows[COLLECTIVES].predicted_s > 0 and rows[COLLECTIVES].measured_s > 0
    assert rows[UNPRICED].predicted_s == 0
    assert report.measured_step_s > 0 and report.mape >= 0
    assert "MAPE over the priced classes" in str(report) and "matmul" in str(report)


@pytest.mark.slow  # plans and profiles the CLI demo's model on 2 ranks
def test_the_cli_profiles_a_factory_and_a_pipeline_is_refused(tmp_path, capsys):
    assert cli(["profile", "examples.gpt2:factory", "--mesh", "dp=2", "--hardware", "h100-sxm", "--no-cache",
                "--out", str(tmp_path), "--steps", "1"]) == 0
    assert "measured/predicted" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["measured-rank0.json", "measured-rank1.json",
                                                         "predicted.json"]
    model, inputs = gpt2.make(TINY)
    pipelined = autopar.plan(model, inputs, mesh="pp=2", hardware=FAST, cache=False)
    with pytest.raises(autopar.AutoparError, match="is pipelined"):
        profile(pipelined, model, inputs, out_dir=tmp_path)
