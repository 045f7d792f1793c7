"""The shared governance state in Redis (``redis.asyncio``, from the ``tasks`` extra).

Keys, under a prefix (default ``chainweaver:governance``):

- ``{prefix}:decisions`` hash: flow name -> its decision as JSON (``all``, ``versions``)
- ``{prefix}:version`` counter: one more per change; what processes confirm against
- ``{prefix}:changes`` pub/sub channel: ``"<version> <name>"`` after each change
- ``{prefix}:audit`` stream: one entry per change (who, what, when), capped
- ``{prefix}:heartbeats`` hash: process -> what it applied and when (JSON)

A change is one Lua script, so the decision, the counter, the audit entry and the
message happen together or not at all. The new entry is worked out here (versions
normalised: one spelling per version, the latest decision winning) and written only if
the entry is still the one it was worked out from, else worked out again: concurrent
operators never lose a change.

Everything read back may have been written by another release, by hand, or damaged:
an entry this release cannot read becomes a decision that withholds its flow
(:func:`.state.read_entry`), a heartbeat it cannot read is shown as such, and nothing
read here raises for one bad entry.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from chainweaver.errors import ExposureConfigError
from chainweaver.versions import version_key

from .state import (
    DEFAULT_PREFIX,
    Action,
    SharedState,
    UnreadableEntry,
    check_action,
    check_version,
    masked_reason,
    masked_url,
    read_entry,
)

AUDIT_ENTRIES = 10_000  # the audit stream keeps about this many changes
HEARTBEATS_KEPT = 24 * 3600.0  # status drops processes silent for longer than this
# A heartbeat that cannot be read is shown as {UNREADABLE_HEARTBEAT: why}.
UNREADABLE_HEARTBEAT = "heartbeat_unreadable"
CHANGE_ATTEMPTS = 50  # an entry changed by others meanwhile: work the change out again

# KEYS: decisions, version, audit, channel. ARGV: name, the entry the change was worked
# out from ('' when there was none, else '=' and the entry), the new entry, version
# ('' = all), action, by, reason, audit entries kept. Returns the new version and the
# server's time, or -1 when the entry is no longer the one expected.
_CHANGE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if (raw == false and ARGV[2] ~= '') or (raw ~= false and ARGV[2] ~= '=' .. raw) then
  return {-1, ''}
end
local v = redis.call('INCR', KEYS[2])
local now = redis.call('TIME')
local at = now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'version', v, 'name', ARGV[1],
           'flow_version', ARGV[4], 'action', ARGV[5], 'by', ARGV[6], 'reason', ARGV[7],
           'at', at)
redis.call('PUBLISH', KEYS[4], v .. ' ' .. ARGV[1])
return {v, at}
"""


def check_url(url: str) -> None:
    """Refuse, before anything runs, a URL the Redis client cannot read (a port that is
    not a number, a query value it does not know): a process following it could never
    read the state. (Without the client, the ``tasks`` extra, the follower fails closed
    when it runs: it serves no flow, and logs why.)"""
    try:
        from redis.asyncio.connection import parse_url
    except ImportError:  # pragma: no cover - depends on the extras
        return
    try:
        parse_url(url)
    except ValueError as error:
        raise ExposureConfigError(f"governance URL {masked_url(url)} cannot be used: "
                                  f"{masked_reason(error, url)}") from None


class GovernanceStateError(ValueError):
    """The shared state as a whole cannot be read (its version counter is damaged)."""


@dataclass(frozen=True)
class Change:
    """A change as stored: its shared version and the Redis server's time of it.

    ``unreadable``: set when the entry, after this change, still cannot be read by this
    release (a single-version decision keeps what else the entry held): why. Every
    process that cannot read it withholds the flow."""

    version: int
    at: float
    unreadable: str | None = None


class GovernanceStore:
    """One connection pool to the shared state (import needs the ``redis`` package)."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, *,
                 timeout: float = 2.0) -> None:
        try:
            from redis.asyncio import Redis
        except ImportError as missing:  # pragma: no cover - depends on the extras
            raise ImportError("shared governance needs the tasks extra (redis): pip "
                              "install -e '.[mcp,tasks]' in a clone of ChainWeaver "
                              f"({missing})") from None
        # Bytes, decoded here: one value that is not UTF-8 must not fail a whole read.
        self.redis = Redis.from_url(url, socket_connect_timeout=timeout,
                                    socket_timeout=timeout, decode_responses=False)
        self.prefix = prefix
        self.decisions_key = f"{prefix}:decisions"
        self.version_key = f"{prefix}:version"
        self.channel = f"{prefix}:changes"
        self.audit_key = f"{prefix}:audit"
        self.heartbeats_key = f"{prefix}:heartbeats"
        self._change = self.redis.register_script(_CHANGE)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def change(self, name: str, version: str | None, action: Action, *,
                     by: str, reason: str = "") -> Change:
        """Record an operator's decision; every process applies it.

        ``action`` must be one of :data:`.state.ACTIONS` and ``version`` a version
        (ValueError otherwise: nothing is written). A decision for all versions replaces
        the whole entry (an unreadable one too); one for a single version replaces the
        decision for that version whatever its spelling (``1.0`` is ``1.0.0``)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a flow name must be a non-empty string, got {name!r}")
        check_action(action)
        version = check_version(version)
        keys = [self.decisions_key, self.version_key, self.audit_key, self.channel]
        for _ in range(CHANGE_ATTEMPTS):
            raw = _raw(await self.redis.hget(self.decisions_key, name))
            entry = changed_entry(raw, version, action)
            result = await self._change(keys=keys, args=[
                name, b"" if raw is None else b"=" + raw, entry, version or "", action,
                by, reason, AUDIT_ENTRIES])
            if int(result[0]) >= 0:
                return Change(int(result[0]), float(_text(result[1])),
                              read_entry(entry).withheld)
        raise GovernanceStateError(f"the entry for {name!r} kept changing while this "
                                   f"change was made ({CHANGE_ATTEMPTS} attempts)")

    async def current_version(self) -> int:
        return _counter(await self.redis.get(self.version_key))

    async def read(self) -> SharedState:
        """The decisions and their version, read together (one transaction).

        :class:`GovernanceStateError` when the counter is not a number, or when it
        moved but no decision is stored: every change writes one and no command removes
        one, so the decisions were lost (evicted, or not restored with the counter),
        not undone."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(self.version_key)
            pipe.hgetall(self.decisions_key)
            version, raw = await pipe.execute()
        counter = _counter(version)
        if counter > 0 and not raw:
            raise GovernanceStateError(
                f"the shared version counter is at {counter} but no decision is stored "
                f"(evicted, or not restored with the counter)")
        decisions = {_text(name): read_entry(text) for name, text in raw.items()}
        return SharedState(counter, MappingProxyType(dict(sorted(decisions.items()))))

    async def heartbeat(self, process: str, record: Mapping[str, Any]) -> None:
        await self.redis.hset(self.heartbeats_key, process, json.dumps(dict(record)))

    async def heartbeats(self) -> dict[str, dict[str, Any]]:
        """Each process's last heartbeat; those silent for a day are dropped. One that
        cannot be read is ``{UNREADABLE_HEARTBEAT: why}`` (kept: its process may be live)."""
        raw = await self.redis.hgetall(self.heartbeats_key)
        records = {_text(process): _heartbeat(text) for process, text in raw.items()}
        now = time.time()
        old = [p for p, r in records.items() if UNREADABLE_HEARTBEAT not in r
               and now - seen(r) > HEARTBEATS_KEPT]
        if old:
            await self.redis.hdel(self.heartbeats_key, *old)
        return {p: r for p, r in sorted(records.items()) if p not in old}

    async def audit(self, count: int = 20) -> list[dict[str, Any]]:
        """The last ``count`` changes, oldest first (every field as text)."""
        entries: list[Any] = await self.redis.xrevrange(self.audit_key, count=count) or []
        return [{"id": _text(entry_id), **{_text(k): _text(v) for k, v in fields.items()}}
                for entry_id, fields in reversed(entries)]


def changed_entry(raw: bytes | None, version: str | None, action: Action) -> bytes:
    """The entry ``raw`` becomes with ``action`` for ``version`` (None: all versions).

    A single-version decision keeps everything else in the entry as it is (what a newer
    release wrote included) and removes the other spellings of that version; it cannot
    be added to an entry that is not a JSON object (:class:`UnreadableEntry`): decide
    for all versions to replace such an entry."""
    if version is None:
        return json.dumps({"all": action, "versions": {}}).encode()
    data: Any = {}
    if raw is not None:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("versions") or {}, dict):
            why = read_entry(raw).withheld or "not a JSON object"
            raise UnreadableEntry(f"{why}; a decision for all versions (no --version) "
                                  f"replaces it")
    key = version_key(version)
    versions = {given: value for given, value in (data.get("versions") or {}).items()
                if not _same_version(given, key)}
    versions[version] = action
    return json.dumps({**data, "versions": versions}).encode()


def _same_version(given: str, key: tuple[Any, ...]) -> bool:
    try:
        return version_key(given) == key
    except ValueError:  # not a version: kept as it is (the entry stays unreadable)
        return False


def seen(record: Mapping[str, Any]) -> float:
    """When a heartbeat was written (0 when it does not say)."""
    value = record.get("seen")
    return float(value) if isinstance(value, (int, float)) and not isinstance(
        value, bool) else 0.0


def _counter(raw: bytes | str | None) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        raise GovernanceStateError(
            f"the shared version counter holds {_text(raw)[:40]!r}, not a number") from None


def _heartbeat(raw: bytes | str) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError:
        return {UNREADABLE_HEARTBEAT: "not JSON"}
    except RecursionError:
        return {UNREADABLE_HEARTBEAT: "JSON nested too deep"}
    return record if isinstance(record, dict) else {UNREADABLE_HEARTBEAT: "not a JSON object"}


def _raw(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _text(value: bytes | str | None) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)
