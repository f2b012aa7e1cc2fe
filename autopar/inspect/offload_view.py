"""An offloading plan as text: the summary's lines, and ``plan.explain("offload")`` (or
``plan.explain("chunk 3")``): why the planner offloads, each chunk's parameters and the
statements during which it is on the device."""
from __future__ import annotations

from autopar.errors import AutoparError
from autopar.inspect.pipeline_view import stage_offload_lines
from autopar.units import human_bytes, human_seconds

_MAX_CHUNKS = 24


def offload_lines(plan) -> list[str]:
    """The summary's lines (none without offload)."""
    o = plan.offload
    if o is None:
        return []
    moved = sum(c.nbytes for c in o.chunks for m in o.moves if m.chunk == c.index and m.kind == "fetch")
    return [
        f"offload: {len(o.params)} parameters in {len(o.chunks)} chunks of {human_bytes(o.chunk_bytes)} in host "
        f"memory ({human_bytes(o.host_bytes)} per device with their gradients and optimizer state), at most "
        f"{o.slots} on the device at once",
        f"  per step: {o.fetches} fetches ({human_bytes(moved)} host -> device), waits {human_seconds(o.exposed_s)}; "
        f"{optimizer_text(o.optimizer)}; plan.explain('offload') for each chunk",
    ]


def optimizer_text(choice) -> str:
    """Where the offloaded state's step runs, and what the other place was priced at."""
    host, device = human_seconds(choice.host_s), human_seconds(choice.device_s)
    if choice.place == "device":
        return f"optimizer step streamed through the device chunk by chunk {device} (on the host: {host})"
    return f"optimizer step on the host {host} (streamed through the device: {device})"


def explain_offload(plan, target: str) -> str:
    """``target``: "offload" (every chunk) or "chunk N"."""
    o = plan.offload
    if o is None and plan.pipeline is not None and plan.pipeline.offload is not None and target == "offload":
        return "\n".join([f"offload in plan {plan.hash}: whole pipeline stages"]
                         + stage_offload_lines(plan.pipeline.offload))
    if o is None:
        raise AutoparError(f"plan {plan.hash} offloads nothing: its parameters and optimizer state fit the device "
                           f"(offload='auto' offloads only where the memory budget needs it)")
    chunks = list(o.chunks)
    if target != "offload":
        index = _chunk_index(target, len(chunks))
        chunks = [o.chunks[index]]
    statements = len(o.device_bytes)
    out = [f"offload in plan {plan.hash}: {o.reason}.",
           f"Time it adds per step: {human_seconds(o.added_s)} = waits for fetches {human_seconds(o.exposed_s)} "
           f"(of {human_seconds(o.transfer_s)} of copies) + the {optimizer_text(o.optimizer)}",
           f"Moves: furthest-next-use eviction over the program's {statements} statements (the fewest fetches); "
           f"a chunk is fetched right after the chunk it replaces was last read.", ""]
    for c in chunks[:_MAX_CHUNKS]:
        spans = ", ".join(f"{a}-{b}" for a, b in o.residence(c.index, statements))
        out.append(f"chunk {c.index}: {c.dtype}, {human_bytes(c.used_bytes)} of {human_bytes(c.nbytes)} used, "
                   f"on the device during statements {spans or 'none'}")
        out.append(f"  {', '.join(c.params)}")
    if len(chunks) > _MAX_CHUNKS:
        out.append(f"... {len(chunks) - _MAX_CHUNKS} more chunks (plan.explain('chunk N') for one)")
    return "\n".join(out)


def _chunk_index(target: str, count: int) -> int:
    words = target.split()
    if len(words) == 2 and words[0] == "chunk" and words[1].isdigit() and int(words[1]) < count:
        return int(words[1])
    raise AutoparError(f"explain target {target!r}: say 'offload' or 'chunk N' with N from 0 to {count - 1}")
