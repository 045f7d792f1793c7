"""An audit sink that survives a restart: JSON Lines, append-only, fsynced, rotated.

``SecurityConfig(audit_hook=JsonlAuditLog("audit.jsonl"))`` writes one JSON object per
:class:`~.hooks.AuditEvent` per line. Each line is written with one ``write`` to a
file opened for appending, so lines from concurrent requests never interleave.

Refusals are aggregated, so that no flood of refused requests can rotate earlier
records out of the retained files: see :class:`JsonlAuditLog`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chainweaver.mcp.hooks import MAX_AUDIT_EVENT_BYTES, AuditEvent

# A summary line's key when more distinct (caller, kind, reason) keys were refused in
# one window than a summary keeps.
_OTHERS = ("*", "*", "*")


class JsonlAuditLog:
    """Append audit events to ``path`` as JSON Lines.

    Durability: the file is flushed after every event and ``fsync``-ed after every
    ``fsync_every`` events or when ``fsync_interval`` seconds have passed since the
    last sync, whichever comes first (``fsync_every=1``: every event is on disk before
    the request goes on). Rotation: when a line would take the file past ``max_bytes``,
    it is renamed ``path.1`` (``path.1`` becomes ``path.2``, ... up to ``backups``;
    the oldest is deleted) and a new file is started. ``max_bytes=None``: no rotation.

    Refusals (``phase="decision"``, ``decision="denied"``): in each
    ``refusal_window`` seconds the first ``refusals_per_window`` are written as they
    come; the others are counted per (caller, kind, reason) and written, when the
    window is over, as one line each: the last such event, without its ``name``,
    ``flow_name`` and ``flow_version``, with ``"repeated"`` (how many refusals the
    line stands for) and ``"first_timestamp"``. A window keeps at most
    ``refusal_keys`` keys; refusals beyond them count under caller, kind and reason
    ``"*"``. The counted lines are written with the first event after the window,
    or by :meth:`close`. So refused requests add at most
    :attr:`max_refusal_bytes_per_window` bytes per window, however many there are.
    Every other event is one line.

    A file the log creates (the first, and each after a rotation) is readable by its
    owner only (mode 0600: it holds caller ids and what they asked for); a file that
    exists keeps its mode.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync_every: int = 100,
        fsync_interval: float = 1.0,
        max_bytes: int | None = 100 * 1024 * 1024,
        backups: int = 5,
        refusal_window: float = 10.0,
        refusals_per_window: int = 20,
        refusal_keys: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fsync_every < 1 or fsync_interval <= 0:
            raise ValueError("fsync_every must be >= 1 and fsync_interval > 0")
        if refusal_window <= 0 or refusals_per_window < 0 or refusal_keys < 0:
            raise ValueError("refusal_window must be > 0, refusals_per_window and "
                             "refusal_keys >= 0")
        if (max_bytes is not None and max_bytes < 1) or backups < 0:
            raise ValueError("max_bytes must be None or >= 1, and backups >= 0")
        self.path = Path(path)
        self.fsync_every = fsync_every
        self.fsync_interval = fsync_interval
        self.max_bytes = max_bytes
        self.backups = backups
        self.refusal_window = float(refusal_window)
        self.refusals_per_window = refusals_per_window
        self.refusal_keys = refusal_keys
        self._clock = clock
        self._window_start = clock()
        self._refusals_written = 0
        # (caller, kind, reason) -> [count, first timestamp, the last event]
        self._folded: dict[tuple[Any, Any, Any], list[Any]] = {}
        self._lock = threading.Lock()
        self._file = _open_private(self.path)  # held open until close()
        self._size = self._file.tell()
        self._unsynced = 0
        self._synced_at = clock()

    @property
    def max_refusal_bytes_per_window(self) -> int:
        """The most bytes refused requests add to the log in one ``refusal_window``."""
        return (self.refusals_per_window + self.refusal_keys + 1) * MAX_AUDIT_LINE_BYTES

    def __call__(self, event: AuditEvent) -> None:
        record = dataclasses.asdict(event)
        with self._lock:
            if self._file.closed:
                raise ValueError(f"audit log {self.path} is closed")
            now = self._clock()
            if now - self._window_start >= self.refusal_window:
                self._end_window(now)
            if event.phase == "decision" and event.decision == "denied":
                if self._refusals_written >= self.refusals_per_window:
                    self._fold(event, record)
                    return
                self._refusals_written += 1
            self._write(_line(record), now)

    def _fold(self, event: AuditEvent, record: dict[str, Any]) -> None:
        key: tuple[Any, Any, Any] = (event.caller_id, event.kind, event.reason)
        if key not in self._folded and len(self._folded) >= self.refusal_keys:
            key = _OTHERS
        folded = self._folded.get(key)
        if folded is None:
            self._folded[key] = [1, event.timestamp, record]
        else:
            folded[0] += 1
            folded[2] = record

    def _end_window(self, now: float) -> None:
        """Write the window's folded refusals (lock held), and start a new window."""
        folded, self._folded = self._folded, {}
        self._window_start = now
        self._refusals_written = 0
        for key, (count, first, record) in folded.items():
            record = dict(record, name=None, flow_name=None, flow_version=None,
                          repeated=count, first_timestamp=first)
            if key == _OTHERS:
                record.update(caller_id="*", kind="*", reason="*", task_id=None)
            self._write(_line(record), now)

    def _write(self, line: bytes, now: float) -> None:
        if self.max_bytes is not None and self._size and \
                self._size + len(line) > self.max_bytes:
            self._rotate()
        self._file.write(line)
        self._file.flush()
        self._size += len(line)
        self._unsynced += 1
        if self._unsynced >= self.fsync_every or now - self._synced_at >= \
                self.fsync_interval:
            os.fsync(self._file.fileno())
            self._unsynced = 0
            self._synced_at = now

    def _rotate(self) -> None:
        os.fsync(self._file.fileno())
        self._file.close()
        if self.backups == 0:
            self.path.unlink()
        else:
            for number in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{number}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{number + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._file = _open_private(self.path)
        self._size = 0
        self._unsynced = 0

    def close(self) -> None:
        """Write the refusals folded so far, sync and close the file (later events
        raise, and the gate logs them)."""
        with self._lock:
            if not self._file.closed:
                self._end_window(self._clock())
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


def _open_private(path: Path) -> Any:
    """``path`` opened for appending; created readable and writable by its owner only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    return os.fdopen(descriptor, "ab")


# A line's bound: the event's, and a summary line's few more keys.
MAX_AUDIT_LINE_BYTES = MAX_AUDIT_EVENT_BYTES + 128


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":"))
            + "\n").encode("utf-8")
