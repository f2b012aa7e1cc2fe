"""Progress of a long plan on a terminal: each pass as it finishes, and a live line for the
work in progress (the solver's objective and bound as they improve).

Passes report through a plain ``progress(message)`` callable; this module turns those
messages into a display. Off a terminal (a log, CI, a pipe) it shows nothing.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console


class TerminalProgress:
    """A callable for ``plan(progress=...)``: finished passes stay on screen, the rest updates
    one spinner line with the elapsed time."""

    def __init__(self, console: Console):
        self.console = console
        self.started = time.perf_counter()
        self.status = console.status("autopar: starting ...", spinner="dots")
        self.status.start()

    def __call__(self, message: str) -> None:
        elapsed = time.perf_counter() - self.started
        if message.startswith("pass ") and " done in " in message:
            self.console.print(f"[green]✓[/green] {message[len('pass '):]}", highlight=False)
        else:
            self.status.update(f"autopar [{elapsed:5.1f} s] {message}")

    def close(self) -> None:
        self.status.stop()


@contextmanager
def terminal_progress(quiet: bool = False, stream=None) -> Iterator[Callable[[str], None] | None]:
    """``with terminal_progress() as progress: plan(..., progress=progress)``: a display on a
    terminal, None (no display) when ``quiet`` or when ``stream`` (default stderr) is not one."""
    stream = stream or sys.stderr
    if quiet or not stream.isatty():
        yield None
        return
    display = TerminalProgress(Console(file=stream))
    try:
        yield display
    finally:
        display.close()
