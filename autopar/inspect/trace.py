"""A plan's predicted step as a Chrome trace: the JSON that Perfetto (ui.perfetto.dev) and
chrome://tracing load (the Trace Event Format's "X" complete events and "M" names).

A plan without a pipeline runs one program on every rank, so the trace has one process, with
the program's statements in the order they run, each as long as the planner priced it:

- "compute": every op (recomputed ones marked), every collective the program waits for and every
  local redistribution (a slice of a replicated value);
  a wait for an asynchronous collective shows as "wait" where the collective is not done yet;
- "collectives started asynchronously": the gradient syncs and prefetched gathers, each from
  its start (or the end of the one before: one at a time) for its priced seconds;
- "host link": offload's fetches, each from the statement it runs before, for its bytes over
  the hardware's host link.

A pipelined plan has one process per pipeline rank with the schedule's simulated actions (the
plan's ``pipeline.timeline``, which is what its step time was priced from).

The trace renders the planner's per-statement costs in program order; its end can differ from
``plan.predicted.step_time_s``, whose gradient syncs hide under backward by the hardware's
overlap fraction rather than statement by statement: both are in the trace's metadata.
"""
from __future__ import annotations

import json
import os

from autopar.cost_models.hardware import get_hardware
from autopar.errors import AutoparError
from autopar.ir.offload import FETCH
from autopar.ir.redistribute import COMMUNICATING
from autopar.lowering.schedule import schedule

_COMPUTE, _ASYNC, _HOST = 1, 2, 3
_US = 1e6  # trace timestamps are microseconds


def write_trace(plan, path: str | os.PathLike, hardware=None) -> str:
    """Write ``plan``'s predicted step to ``path`` (a .json Perfetto and chrome://tracing open);
    ``hardware`` (a spec or preset name, default the plan's) prices offload's host copies."""
    text = json.dumps(predicted_trace(plan, hardware))
    with open(path, "w") as f:
        f.write(text)
    return os.fspath(path)


def predicted_trace(plan, hardware=None) -> dict:
    """The trace as a dict: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}."""
    events = _pipelined(plan) if plan.pipeline is not None else _flat(plan, hardware)
    end = max((e["ts"] + e["dur"] for e in events if e["ph"] == "X"), default=0.0)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"plan": plan.hash, "mesh": str(plan.device_mesh), "hardware": plan.hardware,
                          "predicted_step_s": plan.predicted.step_time_s, "trace_end_s": end / _US}}


def _flat(plan, hardware) -> list[dict]:
    statements = schedule(plan.graph, plan.strategies, plan.redistributions, plan.mesh, plan.recompute,
                          prefetch=plan.prefetch)
    events = _names(0, "every rank (each runs this program on its blocks)",
                    {_COMPUTE: "compute", _ASYNC: "collectives started asynchronously", _HOST: "host link"})
    axes = plan.mesh.axis_names
    now, async_free, async_end = 0.0, 0.0, {}
    started_at: list[float] = []  # each statement's start on the compute track
    for s in statements:
        started_at.append(now)
        if s.kind == "call":
            seconds = plan.strategies[s.node.name].compute_s
            name = s.node.target + (" (recompute)" if s.recomputed else "")
            events.append(_event(name, "op", now, seconds, 0, _COMPUTE, value=s.defines, phase=s.node.phase))
            now += seconds
        elif s.kind == "move":
            seconds = s.redistribution.step_seconds[s.step]
            events.append(_collective(s, axes, now, seconds, _COMPUTE))
            now += seconds
        elif s.kind == "start":
            begin = max(now, async_free)
            seconds = s.redistribution.step_seconds[s.step]
            events.append(_collective(s, axes, begin, seconds, _ASYNC))
            async_free = async_end[s.defines] = begin + seconds
        elif s.kind == "wait":
            done = async_end.get(s.uses[0], now)
            if done > now:
                events.append(_event("wait", "wait", now, done - now, 0, _COMPUTE, value=s.uses[0]))
                now = done
    if plan.offload is not None:
        events += _host_copies(plan, started_at, now, hardware)
    return events


def _host_copies(plan, started_at: list[float], end: float, hardware) -> list[dict]:
    try:
        link = get_hardware(hardware or plan.hardware).host_link
    except (AutoparError, ValueError) as exc:
        raise AutoparError(f"plan {plan.hash} offloads over the host link of hardware {plan.hardware!r}, which "
                           f"this process does not know: pass hardware= (the spec it was planned on)") from exc
    chunks = {c.index: c for c in plan.offload.chunks}
    out, free = [], 0.0
    for m in sorted(plan.offload.moves, key=lambda m: m.at):
        if m.kind != FETCH:
            continue
        begin = max(started_at[m.at] if m.at < len(started_at) else end, free)
        seconds = link.seconds(chunks[m.chunk].nbytes)
        out.append(_event(f"fetch chunk {m.chunk}", "host copy", begin, seconds, 0, _HOST,
                          bytes=chunks[m.chunk].nbytes, params=list(chunks[m.chunk].params)))
        free = begin + seconds
    o = plan.offload.optimizer
    seconds = o.host_s if o.place == "host" else o.device_s
    out.append(_event(f"optimizer step of the offloaded state ({o.place})", "optimizer", max(end, free), seconds, 0,
                      _HOST))
    return out


def _pipelined(plan) -> list[dict]:
    pl = plan.pipeline
    events = []
    for rank in range(pl.pp):
        events += _names(rank, f"pipeline rank {rank}", {_COMPUTE: "actions", _ASYNC: "once a step, after its actions"})
        end = max(b.end_s for b in pl.timeline if b.rank == rank)
        mine = [st for st in pl.stages if st.rank == rank]
        syncs = sum(st.sync_s for st in mine)
        if syncs:  # from the last micro-batch's backward on; the step hides what backward can
            events.append(_event("gradient syncs", "collective", end, syncs, rank, _ASYNC))
        if pl.offload is not None:
            events.append(_event("host optimizer step", "optimizer", end + syncs, pl.offload.optimizer_s[rank], rank,
                                 _ASYNC))
    for b in pl.timeline:
        stage = pl.stages[b.action.stage]
        events.append(_event(str(b.action), "pipeline action", b.start_s, b.end_s - b.start_s, b.rank, _COMPUTE,
                             stage=stage.index, units=f"{stage.units[0]} .. {stage.units[-1]}",
                             microbatch=b.action.microbatch, kind=str(b.action.kind)))
    return events


def _collective(s, axes, begin: float, seconds: float, track: int) -> dict:
    r = s.redistribution
    step = r.steps[s.step]
    category = "collective" if step.kind in COMMUNICATING else "local redistribution"  # a slice, say
    return _event(f"{step.kind} over {axes[step.axis]}", category, begin, seconds, 0, track, value=r.value,
                  bytes=r.step_bytes[s.step], gradient_sync=r.consumers == ("output",), prefetch=s.prefetch)


def _event(name: str, category: str, begin_s: float, seconds: float, pid: int, tid: int, **args) -> dict:
    return {"name": name, "cat": category, "ph": "X", "ts": begin_s * _US, "dur": seconds * _US, "pid": pid,
            "tid": tid, "args": args}


def _names(pid: int, process: str, threads: dict[int, str]) -> list[dict]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}}] + [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        for tid, name in threads.items()]
