"""What a trace file must hold to load in Perfetto (the Trace Event Format's JSON)."""
import json
import math


def valid_chrome_trace(path) -> list[dict]:
    """The trace's complete events, after checking the structure Perfetto's JSON importer reads:
    "X" events with a name, category, non-negative microsecond start and duration and process
    and thread ids (numbers; torch.profiler labels its own span track with strings); autopar's
    own traces also name each process and thread they use ("M" events); torch.profiler's carry
    other phases too ("i" instants, "f"/"s" flows), left as they are."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    complete = [e for e in events if e.get("ph") == "X"]
    assert complete
    for e in complete:
        assert isinstance(e["name"], str) and isinstance(e.get("cat", ""), str)
        assert isinstance(e["pid"], (int, str)) and isinstance(e["tid"], (int, str))
        assert math.isfinite(e["ts"]) and e["ts"] >= 0 and math.isfinite(e["dur"]) and e["dur"] >= 0
    return complete


def named_tracks(path) -> set:
    """(pid, tid) of every thread an autopar trace names, and (pid, None) of every process."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return {(e["pid"], e["tid"] if e["name"] == "thread_name" else None) for e in events if e.get("ph") == "M"}
