"""An audit sink that survives a restart: JSON Lines, append-only, fsynced, rotated.

``SecurityConfig(audit_hook=JsonlAuditLog("audit.jsonl"))`` writes one JSON object per
:class:`~.hooks.AuditEvent` per line. Each line is written with one ``write`` to a
file opened for appending, so lines from concurrent requests never interleave.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .hooks import AuditEvent


class JsonlAuditLog:
    """Append audit events to ``path`` as JSON Lines.

    Durability: the file is flushed after every event and ``fsync``-ed after every
    ``fsync_every`` events or when ``fsync_interval`` seconds have passed since the
    last sync, whichever comes first (``fsync_every=1``: every event is on disk before
    the request goes on). Rotation: when a line would take the file past ``max_bytes``,
    it is renamed ``path.1`` (``path.1`` becomes ``path.2``, ... up to ``backups``;
    the oldest is deleted) and a new file is started. ``max_bytes=None``: no rotation.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync_every: int = 100,
        fsync_interval: float = 1.0,
        max_bytes: int | None = 100 * 1024 * 1024,
        backups: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fsync_every < 1 or fsync_interval <= 0:
            raise ValueError("fsync_every must be >= 1 and fsync_interval > 0")
        if (max_bytes is not None and max_bytes < 1) or backups < 0:
            raise ValueError("max_bytes must be None or >= 1, and backups >= 0")
        self.path = Path(path)
        self.fsync_every = fsync_every
        self.fsync_interval = fsync_interval
        self.max_bytes = max_bytes
        self.backups = backups
        self._clock = clock
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open until close()
        self._size = self._file.tell()
        self._unsynced = 0
        self._synced_at = clock()

    def __call__(self, event: AuditEvent) -> None:
        line = (json.dumps(dataclasses.asdict(event), ensure_ascii=False,
                           separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            if self._file.closed:
                raise ValueError(f"audit log {self.path} is closed")
            if self.max_bytes is not None and self._size and \
                    self._size + len(line) > self.max_bytes:
                self._rotate()
            self._file.write(line)
            self._file.flush()
            self._size += len(line)
            self._unsynced += 1
            now = self._clock()
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
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0
        self._unsynced = 0

    def close(self) -> None:
        """Sync and close the file (later events raise, and the gate logs them)."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
