"""plan.trace: the predicted step as a Chrome trace (Trace Event Format, as Perfetto loads it),
checked against the plan it renders."""
import base64
import json
import re

import pytest

import autopar
from autopar.inspect.report_html import render_html
from autopar.inspect.trace import predicted_trace
from autopar.lowering.schedule import schedule
from examples import gpt2
from tests.traces import named_tracks, valid_chrome_trace
from tests.workers import FAST

TINY = gpt2.GPT2Config(vocab=96, seq=16, layers=2, heads=2, width=48, batch=8)
COMPUTE, ASYNC, HOST = 1, 2, 3


def _valid_chrome_trace(path) -> list[dict]:
    """The trace's complete events, each on a process and thread the trace names."""
    with open(path) as f:
        trace = json.load(f)
    assert trace["displayTimeUnit"] in ("ms", "ns")
    events, named = valid_chrome_trace(path), named_tracks(path)
    for e in events:
        assert (e["pid"], None) in named and (e["pid"], e["tid"]) in named, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["args"], dict)
    return events


def test_a_flat_plans_trace_holds_its_ops_and_collectives_as_priced(tmp_path):
    model, inputs = gpt2.make(TINY)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST, cache=False)
    events = _valid_chrome_trace(plan.trace(tmp_path / "step.json"))
    statements = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh, plan.recompute,
                          prefetch=plan.prefetch)
    calls = [s for s in statements if s.kind == "call"]
    ops = [e for e in events if e["cat"] == "op"]
    assert [e["args"]["value"] for e in ops] == [s.defines for s in calls]  # program order
    assert sum(e["dur"] for e in ops) == pytest.approx(1e6 * sum(plan.strategies[s.node.name].compute_s
                                                                 for s in calls))
    collectives = [e for e in events if e["cat"] == "collective"]
    assert len(collectives) == len(plan.collectives())
    assert {e["tid"] for e in collectives} == {COMPUTE, ASYNC}  # blocking ones, and gradient syncs beside compute
    # started ahead of where they are read: gradient syncs, and parameter gathers prefetched a layer ahead
    assert all(e["args"]["gradient_sync"] or e["args"]["prefetch"] for e in collectives if e["tid"] == ASYNC)
    on_compute = sorted((e for e in events if e["tid"] == COMPUTE), key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] * (1 + 1e-9) for a, b in zip(on_compute, on_compute[1:]))
    end = max(e["ts"] + e["dur"] for e in events) / 1e6
    assert end == pytest.approx(plan.predicted.step_time_s, rel=0.05)


def test_a_pipelines_trace_is_its_simulated_schedule_with_offloads_host_step(tmp_path):
    model, inputs = gpt2.make(TINY)
    plan = autopar.plan(model, inputs, mesh="pp=2,dp=2", hardware=FAST, schedule="1F1B", microbatches=4,
                        offload=True, cache=False)
    events = _valid_chrome_trace(plan.trace(tmp_path / "step.json"))
    actions = sorted((e["pid"], e["name"], e["ts"], e["dur"]) for e in events if e["cat"] == "pipeline action")
    blocks = sorted((b.rank, str(b.action), b.start_s * 1e6, (b.end_s - b.start_s) * 1e6)
                    for b in plan.pipeline.timeline)
    assert [a[:2] for a in actions] == [b[:2] for b in blocks]
    assert [a[2:] for a in actions] == [pytest.approx(b[2:]) for b in blocks]
    host_steps = {e["pid"]: e["dur"] / 1e6 for e in events if e["cat"] == "optimizer"}
    assert host_steps == pytest.approx(dict(enumerate(plan.pipeline.offload.optimizer_s)))
    end = max(e["ts"] + e["dur"] for e in events) / 1e6
    assert end <= plan.predicted.step_time_s * (1 + 1e-9)


def test_an_offloading_plans_trace_has_each_fetch_on_the_host_link(tmp_path):
    model, inputs = gpt2.make(TINY)
    plan = autopar.plan(model, inputs, mesh="dp=2", hardware="a100-sxm-80g", offload=True, cache=False)
    events = _valid_chrome_trace(plan.trace(tmp_path / "step.json"))
    fetches = [e for e in events if e["cat"] == "host copy"]
    assert len(fetches) == plan.offload.fetches and {e["tid"] for e in fetches} == {HOST}
    assert all(a["ts"] + a["dur"] <= b["ts"] * (1 + 1e-9) for a, b in zip(fetches, fetches[1:]))  # one link


def test_the_report_links_the_predicted_trace():
    model, inputs = gpt2.make(TINY)
    plan = autopar.plan(model, inputs, mesh="dp=2,tp=2", hardware=FAST, cache=False)
    link = re.search(r'download="[^"]+predicted-trace\.json" href="data:application/json;base64,([^"]+)"',
                     render_html(plan))
    assert json.loads(base64.b64decode(link.group(1))) == predicted_trace(plan)
