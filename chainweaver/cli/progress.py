"""``chainweaver run``'s progress on stderr while the flow runs: each step as it starts
and ends, from the engine's run observer (:class:`~chainweaver.run_events.RunObserver`).

On a terminal the running step is one line rewritten in place (``running``, then how it
ended); anywhere else (a pipe, a file, CI logs) every start and end is a plain line of
its own. Either way each line starts with ``chainweaver:``, apart from the step table
printed when the run is over.
"""

from __future__ import annotations

import threading
from typing import TextIO

from ..results import ErrorInfo, StepRecord, duration
from ..run_events import RunObserver
from .output import PROG

CLEAR_LINE = "\r\x1b[K"  # back to the start of the line, and erase it


class StepProgress(RunObserver):
    """Writes a run's steps to ``stream`` as they start and end; ``live``: rewrite the
    running step's line in place (a terminal)."""

    def __init__(self, stream: TextIO, live: bool) -> None:
        self.stream = stream
        self.live = live
        self.total = 0
        self._open = False  # a live "running" line waits for its end
        self._lock = threading.Lock()  # an observer may be called from a tool's thread

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self.total = total_steps
        self._line(f"running flow {flow_name} {flow_version}: {total_steps} step(s)")

    def step_started(self, record: StepRecord) -> None:
        self._line(f"{self._step(record)} {'running' if self.live else 'started'}",
                   ends=not self.live)

    def step_retrying(self, record: StepRecord, error: ErrorInfo) -> None:
        self._line(f"{self._step(record)} attempt {record.attempts} failed "
                   f"({error.type}); retrying")
        if self.live:
            self._line(f"{self._step(record)} running", ends=False)

    def step_finished(self, record: StepRecord) -> None:
        ended = f"{self._step(record)} {record.status}"
        if record.status != "skipped" or record.duration_ms:
            ended += f" in {duration(record.duration_ms)}"
        if record.error is not None and record.status != "completed":
            ended += f" ({record.error.type})"
        self._line(ended)

    def close(self) -> None:
        """End a live line left open (the run was interrupted while a step ran)."""
        with self._lock:
            if self._open:
                self.stream.write("\n")
                self.stream.flush()
                self._open = False

    def _step(self, record: StepRecord) -> str:
        name = record.step_id or record.tool_name
        return f"step {record.index + 1}/{self.total or '?'} {name}:"

    def _line(self, text: str, ends: bool = True) -> None:
        with self._lock:
            start = CLEAR_LINE if self._open else ""
            self.stream.write(f"{start}{PROG}: {text}{chr(10) if ends else ''}")
            self.stream.flush()
            self._open = not ends


def progress_for(stream: TextIO, quiet_without_terminal: bool) -> StepProgress | None:
    """The progress observer for ``stream``: live on a terminal, plain lines elsewhere
    (None when ``quiet_without_terminal`` and it is not a terminal)."""
    try:
        live = stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real stream
        live = False
    if not live and quiet_without_terminal:
        return None
    return StepProgress(stream, live)
