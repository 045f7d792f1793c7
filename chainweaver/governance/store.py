"""The shared governance state in Redis (``redis.asyncio``, from the ``tasks`` extra).

Keys, under a prefix (default ``chainweaver:governance``):

- ``{prefix}:decisions`` hash: flow name -> its decision as JSON (``all``, ``versions``)
- ``{prefix}:version`` counter: one more per change; what processes confirm against
- ``{prefix}:changes`` pub/sub channel: ``"<version> <name>"`` after each change
- ``{prefix}:audit`` stream: one entry per change (who, what, when), capped
- ``{prefix}:heartbeats`` hash: process -> what it applied and when (JSON)

A change is one Lua script, so the decision, the counter, the audit entry and the
message happen together or not at all, and concurrent operators never lose a change.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .state import DEFAULT_PREFIX, Action, Decision, SharedState

AUDIT_ENTRIES = 10_000  # the audit stream keeps about this many changes
HEARTBEATS_KEPT = 24 * 3600.0  # status drops processes silent for longer than this

# KEYS: decisions, version, audit, channel. ARGV: name, version ('' = all), action,
# by, reason, audit entries kept. A decision for all versions replaces the
# single-version ones: the last command wins. Returns the new version and the server's time.
_CHANGE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local entry = {versions = {}}
if raw then entry = cjson.decode(raw) end
if type(entry.versions) ~= 'table' then entry.versions = {} end
if ARGV[2] == '' then
  entry = {all = ARGV[3], versions = {}}
else
  entry.versions[ARGV[2]] = ARGV[3]
end
local payload = cjson.encode(entry)
local v = redis.call('INCR', KEYS[2])
local now = redis.call('TIME')
local at = now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
redis.call('HSET', KEYS[1], ARGV[1], payload)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'version', v, 'name', ARGV[1],
           'flow_version', ARGV[2], 'action', ARGV[3], 'by', ARGV[4], 'reason', ARGV[5],
           'at', at)
redis.call('PUBLISH', KEYS[4], v .. ' ' .. ARGV[1])
return {v, at}
"""


@dataclass(frozen=True)
class Change:
    """A change as stored: its shared version and the Redis server's time of it."""

    version: int
    at: float


class GovernanceStore:
    """One connection pool to the shared state (import needs the ``redis`` package)."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, *,
                 timeout: float = 2.0) -> None:
        try:
            from redis.asyncio import Redis
        except ImportError as missing:  # pragma: no cover - depends on the extras
            raise ImportError("shared governance needs the redis package: pip install "
                              f"'chainweaver[mcp,tasks]' ({missing})") from None
        self.redis = Redis.from_url(url, socket_connect_timeout=timeout,
                                    socket_timeout=timeout, decode_responses=True)
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
        """Record an operator's decision; every process applies it."""
        keys = [self.decisions_key, self.version_key, self.audit_key, self.channel]
        result = await self._change(keys=keys, args=[name, version or "", action, by,
                                                     reason, AUDIT_ENTRIES])
        return Change(int(result[0]), float(result[1]))

    async def current_version(self) -> int:
        return int(await self.redis.get(self.version_key) or 0)

    async def read(self) -> SharedState:
        """The decisions and their version, read together (one transaction)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(self.version_key)
            pipe.hgetall(self.decisions_key)
            version, raw = await pipe.execute()
        decisions = {name: Decision.from_json(text) for name, text in raw.items()}
        return SharedState(int(version or 0), MappingProxyType(decisions))

    async def heartbeat(self, process: str, record: Mapping[str, Any]) -> None:
        await self.redis.hset(self.heartbeats_key, process, json.dumps(dict(record)))

    async def heartbeats(self) -> dict[str, dict[str, Any]]:
        """Each process's last heartbeat; those silent for a day are dropped."""
        raw = await self.redis.hgetall(self.heartbeats_key)
        records = {str(process): json.loads(text) for process, text in raw.items()}
        old = [p for p, r in records.items() if time.time() - r.get("seen", 0) > HEARTBEATS_KEPT]
        if old:
            await self.redis.hdel(self.heartbeats_key, *old)
        return {p: r for p, r in sorted(records.items()) if p not in old}

    async def audit(self, count: int = 20) -> list[dict[str, Any]]:
        """The last ``count`` changes, oldest first."""
        entries: list[Any] = await self.redis.xrevrange(self.audit_key, count=count) or []
        return [{"id": entry_id, **fields} for entry_id, fields in reversed(entries)]
