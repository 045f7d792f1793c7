"""Run records: what every flow run started through MCP did, never with its values.

A :class:`RunRecord` holds a run's id, flow and version, status, times, steps (id,
status, attempts, duration, error type), the output's size and SHA-256 (the digest the
audit records), the task id, how many times a task was delivered, and the approval
decisions. A :class:`RunStore` keeps records newest first per caller, pages them with a
cursor, and keeps the outputs that travel as resource links; every record it gives back
belongs to the caller that asked (a listing's, or ``caller=`` of a read), and a store
that cannot be reached or read raises :class:`RunStoreError`, whose text is fixed (the
detail is logged). :class:`MemoryRunStore` is the default (bounded by count, with a
per-caller share, age and output bytes); ``redis://`` URLs give
:class:`~.redis_records.RedisRunStore`, which any replica reads. Outputs at rest are
encrypted under the tasks' encryption setting (``FASTMCP_TASKS_ENCRYPTION_KEY`` /
``TaskSettings(encryption_key=...)``).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import re
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

RunStatus = Literal["running", "waiting_approval", "completed", "failed", "cancelled"]
STATUSES: tuple[RunStatus, ...] = ("running", "waiting_approval", "completed", "failed",
                                   "cancelled")
FINISHED = frozenset({"completed", "failed", "cancelled"})
RUN_ID = re.compile(r"[0-9a-f]{24}")
_CURSOR = re.compile(r"([0-9]{1,20})\.([0-9a-f]{24})")
# What a client is told when the store fails: never the store's own text, which names
# its host and port (operators find that in the log).
STORE_UNAVAILABLE = "The run history is unavailable right now; try again later"
# Keeps derived Fernet keys apart from the tasks' own use of the same material.
_OUTPUT_KEY_SALT = "chainweaver-run-output-key"


def new_run_id() -> str:
    return secrets.token_hex(12)


class RunStoreError(Exception):
    """The run store could not be reached or read. Its text is always
    :data:`STORE_UNAVAILABLE`; ``reason`` is the failure's type and ``detail`` what
    failed, for the log (passwords masked)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(STORE_UNAVAILABLE)
        self.reason = reason
        self.detail = detail


@dataclass
class RunRecord:
    """One run, as stored. ``caller`` is the gate's caller id; ``seq`` orders runs
    (microseconds since the epoch at start). Never holds argument or output values."""

    run_id: str
    flow: str
    version: str
    tool: str
    caller: str
    seq: int
    started_at: float
    status: RunStatus = "running"
    ended_at: float | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    error_type: str | None = None
    error_step: str | None = None
    output_size: int | None = None
    output_sha256: str | None = None
    output_mime: str | None = None
    output_stored: bool = False
    task_id: str | None = None
    approvals: list[dict[str, Any]] = field(default_factory=list)
    # Legs that ran the run's steps: 1, more when a task was redelivered after its
    # worker stopped (its completed steps then say "restored": true).
    deliveries: int = 1
    # The sub-flow steps the record names (path -> [sub-flow, index]): a reader who
    # cannot see one of them now reads it unnamed (step_names.masked). Never sent.
    subflows: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def cursor(self) -> str:
        """Where a page that ends with this record continues (older runs)."""
        return f"{self.seq}.{self.run_id}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RunRecord:
        """A record as stored. A record read back from a shared store may be damaged,
        edited by hand or written by another release: ValueError (or TypeError, a
        field missing) when ``data`` is not a record this release can read, checked
        before anything compares, lists or sends it."""
        if not isinstance(data, dict):
            raise ValueError("a run record is a JSON object")
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        record = cls(**known)
        wrong = [name for name, check in _FIELD_CHECKS.items()
                 if not check(getattr(record, name))]
        if wrong:
            raise ValueError(f"run record field(s) {', '.join(wrong)} cannot be read")
        return record

    def document(self, *, error_types: bool = True) -> dict[str, Any]:
        """The record as its caller reads it (error types only when ``error_types``)."""
        data = self.to_dict()
        for name in ("caller", "seq", "output_stored", "subflows"):
            data.pop(name)
        if not error_types:
            data["error_type"] = None
            data["steps"] = [_without_errors(step) for step in self.steps]
        return data


def _without_errors(step: dict[str, Any]) -> dict[str, Any]:
    step = {key: value for key, value in step.items() if key != "error"}
    if isinstance(step.get("steps"), list):
        step["steps"] = [_without_errors(inner) for inner in step["steps"]
                         if isinstance(inner, dict)]
    return step


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _text(value: object) -> bool:
    return isinstance(value, str)


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _objects(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


# What each field of a stored record must hold (RunRecord.from_dict): a run id of this
# server's form, a sequence that makes a cursor, times that are numbers, a known status.
_FIELD_CHECKS: dict[str, Callable[[object], bool]] = {
    "run_id": lambda value: isinstance(value, str) and RUN_ID.fullmatch(value) is not None,
    "flow": _text, "version": _text, "tool": _text, "caller": _text,
    "seq": lambda value: _whole(value) and value < 10**20,  # type: ignore[operator]
    "started_at": _time, "status": lambda value: value in STATUSES,
    "ended_at": _optional(_time), "steps": _objects, "error_type": _optional(_text),
    "error_step": _optional(_text), "output_size": _optional(_whole),
    "output_sha256": _optional(_text), "output_mime": _optional(_text),
    "output_stored": lambda value: isinstance(value, bool), "task_id": _optional(_text),
    "approvals": _objects, "deliveries": _whole,
    "subflows": lambda value: isinstance(value, dict) and all(
        isinstance(entry, list) and len(entry) == 2 and _text(entry[0]) and _whole(entry[1])
        for entry in value.values()),
}


def parse_cursor(cursor: str) -> tuple[int, str]:
    """``(seq, run_id)`` of a page cursor; ValueError when it is not one."""
    match = _CURSOR.fullmatch(cursor)
    if match is None:
        raise ValueError(f"invalid cursor {cursor!r}")
    return int(match.group(1)), match.group(2)


Keep = Callable[[RunRecord], bool]


@dataclass(frozen=True)
class RunQuery:
    """Which runs a page holds: the caller's (None: everybody's, for operators), of one
    flow and one status when given, older than ``cursor``, at most ``limit``; ``keep``
    drops records the reader may not see (a flow outside its view)."""

    caller: str | None = None
    flow: str | None = None
    status: str | None = None
    cursor: str | None = None
    limit: int = 50
    keep: Keep | None = None

    def admits(self, record: RunRecord, now: float, max_age: float) -> bool:
        # The caller is checked on every record, whatever index found it.
        return ((self.caller is None or record.caller == self.caller)
                and (self.status is None or record.status == self.status)
                and (self.flow is None or record.flow == self.flow)
                and record.started_at >= now - max_age
                and (self.keep is None or self.keep(record)))


class RunStore(ABC):
    """Where run records and linked outputs live (async: the Redis store does I/O).

    With ``caller``, a read answers only that caller's run (another caller's reads as
    None, like one that never existed). Every method raises :class:`RunStoreError`
    when the store cannot be reached or read.
    """

    max_runs: int
    max_age: float

    @abstractmethod
    async def save(self, record: RunRecord, *, new: bool = False) -> None:
        """Store ``record`` (``new``: its first save, which files it for listing)."""

    @abstractmethod
    async def get(self, run_id: str, *, caller: str | None = None) -> RunRecord | None:
        """The record of ``run_id`` (None: none, another caller's, or dropped by
        retention)."""

    @abstractmethod
    async def delete(self, run_id: str) -> None:
        """Forget a record (a call that only asked for approval is re-filed)."""

    async def cancel(self, run_id: str, ended_at: float) -> RunRecord | None:
        """Mark the record of ``run_id`` cancelled (see :meth:`end`)."""
        return await self.end(run_id, ended_at, "cancelled")

    async def end(self, run_id: str, ended_at: float, status: RunStatus,
                  error_type: str | None = None) -> RunRecord | None:
        """Mark the record of ``run_id`` ended (``status``: ``cancelled`` or ``failed``,
        with ``error_type``) unless its run finished, with no save of the run's own
        between the read and the write (the run's record, with its steps and where it
        stopped, is never overwritten by an older one). Returns the record marked
        (None: none, or finished). Atomic here for stores whose calls never wait (in
        this process); a shared store overrides it."""
        record = await self.get(run_id)
        if record is None or record.status in FINISHED:
            return None
        marked = ended_record(record, ended_at, status, error_type)
        await self.save(marked)
        return marked

    @abstractmethod
    async def page(self, query: RunQuery) -> tuple[list[RunRecord], str | None]:
        """Records ``query`` selects, newest first, and the cursor of the next page."""

    @abstractmethod
    async def put_output(self, run_id: str, data: bytes) -> None:
        """Keep a run's serialised output (it travels as a resource link)."""

    @abstractmethod
    async def output(self, run_id: str, offset: int = 0, length: int | None = None, *,
                     caller: str | None = None) -> bytes | None:
        """Bytes ``offset`` .. ``offset + length`` of a kept output (None: none kept, or
        another caller's run)."""

    async def close(self) -> None:  # noqa: B027 - a store without connections has none
        """Release connections."""


def ended_record(record: RunRecord, ended_at: float, status: RunStatus,
                 error_type: str | None) -> RunRecord:
    """``record`` ended as :meth:`RunStore.end` marks it."""
    kept = record.error_type if error_type is None else error_type
    return dataclasses.replace(record, status=status, ended_at=ended_at, error_type=kept)


class MemoryRunStore(RunStore):
    """Records in this process, younger than ``max_age`` seconds and at most
    ``max_runs`` of them, shared fairly: past ``max_runs`` the caller holding the most
    runs gives up its oldest (see ``docs/run-history.md``); outputs up to
    ``max_output_bytes`` in total (oldest dropped first)."""

    def __init__(self, max_runs: int = 10_000, max_age: float = 7 * 86400,
                 max_output_bytes: int = 256 * 2**20) -> None:
        self.max_runs = max_runs
        self.max_age = max_age
        self.max_output_bytes = max_output_bytes
        self._records: OrderedDict[str, RunRecord] = OrderedDict()  # oldest first
        self._by: dict[str | tuple[str, str], list[tuple[int, str]]] = {}  # ascending
        # Who gives up a run past max_runs: one entry a caller holding runs, the
        # largest holder first, then the one whose oldest run is older.
        self._holders: list[tuple[int, int, str, str]] = []
        self._outputs: OrderedDict[str, bytes] = OrderedDict()
        self._output_bytes = 0
        self._lock = threading.Lock()

    async def save(self, record: RunRecord, *, new: bool = False) -> None:
        with self._lock:
            known = self._records.get(record.run_id)
            if known is None and not new:
                return  # a record retention dropped stays dropped
            if known is not None and (known.caller, known.flow) != (record.caller,
                                                                     record.flow):
                self._drop(known)  # filed again, under whose and which flow it is now
                known = None
            self._records[record.run_id] = record
            if known is None:
                key = (record.seq, record.run_id)
                self._unrank(record.caller)
                for index in (record.caller, (record.caller, record.flow)):
                    entries = self._by.setdefault(index, [])
                    if entries and entries[-1] > key:
                        bisect.insort(entries, key)  # started on another clock tick
                    else:
                        entries.append(key)
                self._rank(record.caller)
                self._trim(time.time())  # only a new record can pass a bound

    def _holder(self, caller: str) -> tuple[int, int, str, str] | None:
        entries = self._by.get(caller)
        if not entries:
            return None
        seq, run_id = entries[0]
        return -len(entries), seq, run_id, caller

    def _unrank(self, caller: str) -> None:
        holder = self._holder(caller)
        if holder is not None:
            del self._holders[bisect.bisect_left(self._holders, holder)]

    def _rank(self, caller: str) -> None:
        holder = self._holder(caller)
        if holder is not None:
            bisect.insort(self._holders, holder)

    def _trim(self, now: float) -> None:
        records = self._records
        while records:
            oldest = next(iter(records.values()))
            if oldest.started_at >= now - self.max_age:
                break
            self._drop(oldest)
        while len(records) > self.max_runs:
            # The largest holder's oldest run: a caller holding no more than its share
            # (max_runs over the callers holding runs) never loses one to another's.
            self._drop(records[self._holders[0][2]])

    def _drop(self, record: RunRecord) -> None:
        self._records.pop(record.run_id, None)
        key = (record.seq, record.run_id)
        self._unrank(record.caller)
        for index in (record.caller, (record.caller, record.flow)):
            entries = self._by.get(index)
            if not entries:
                continue
            at = bisect.bisect_left(entries, key)
            if at < len(entries) and entries[at] == key:
                del entries[at]
            if not entries:
                del self._by[index]
        self._rank(record.caller)
        data = self._outputs.pop(record.run_id, None)
        if data is not None:
            self._output_bytes -= len(data)

    async def get(self, run_id: str, *, caller: str | None = None) -> RunRecord | None:
        record = self._records.get(run_id)
        if record is None or record.started_at < time.time() - self.max_age \
                or (caller is not None and record.caller != caller):
            return None
        return record

    async def delete(self, run_id: str) -> None:
        with self._lock:
            record = self._records.get(run_id)
            if record is not None:
                self._drop(record)

    async def page(self, query: RunQuery) -> tuple[list[RunRecord], str | None]:
        with self._lock:
            if query.caller is None:
                keys: list[tuple[int, str]] = [(r.seq, r.run_id)
                                               for r in self._records.values()]
                keys.sort()
            else:
                index = query.caller if query.flow is None else (query.caller, query.flow)
                keys = self._by.get(index, [])
            at = len(keys) if query.cursor is None else bisect.bisect_left(
                keys, parse_cursor(query.cursor))
            now, found = time.time(), list[RunRecord]()
            while at > 0 and len(found) <= query.limit:
                at -= 1
                record = self._records.get(keys[at][1])
                if record is not None and query.admits(record, now, self.max_age):
                    found.append(record)
        if len(found) > query.limit:
            return found[:query.limit], found[query.limit - 1].cursor
        return found, None

    async def put_output(self, run_id: str, data: bytes) -> None:
        with self._lock:
            if run_id not in self._records or len(data) > self.max_output_bytes:
                return
            self._outputs[run_id] = data
            self._output_bytes += len(data)
            while self._output_bytes > self.max_output_bytes:
                _, dropped = self._outputs.popitem(last=False)
                self._output_bytes -= len(dropped)

    async def output(self, run_id: str, offset: int = 0, length: int | None = None, *,
                     caller: str | None = None) -> bytes | None:
        data = self._outputs.get(run_id)
        if data is None or (caller is not None and await self.get(run_id, caller=caller)
                            is None):
            return None
        return data[offset:] if length is None else data[offset:offset + length]


# ------------------------------------------------------------------ encryption


class OutputCodec:
    """Encrypts outputs at rest when the tasks' encryption key is set (Fernet, from a
    key derived apart from the tasks' own); plain bytes otherwise."""

    def __init__(self, material: str | None) -> None:
        self._fernet: Any = None
        if material:
            from cryptography.fernet import Fernet
            from fastmcp.server.auth.jwt_issuer import derive_jwt_key

            self._fernet = Fernet(derive_jwt_key(low_entropy_material=material,
                                                 salt=_OUTPUT_KEY_SALT))

    @property
    def encrypts(self) -> bool:
        return self._fernet is not None

    def encode(self, data: bytes) -> bytes:
        return data if self._fernet is None else bytes(self._fernet.encrypt(data))

    def decode(self, stored: bytes) -> bytes:
        return stored if self._fernet is None else bytes(self._fernet.decrypt(stored))


def output_codec() -> OutputCodec:
    """The codec for the tasks' encryption setting as it is now."""
    return _codec(_encryption_material())


@lru_cache(maxsize=4)
def _codec(material: str | None) -> OutputCodec:
    return OutputCodec(material)  # the key derivation takes about a second: once


def _encryption_material() -> str | None:
    try:
        from fastmcp_tasks.settings import tasks_settings
    except ImportError:  # no tasks extra: the environment variable it would read
        return os.environ.get("FASTMCP_TASKS_ENCRYPTION_KEY") or None
    key = tasks_settings.encryption_key
    return key.get_secret_value() if key is not None else None
