"""Run records in Redis, shared by every replica (needs redis-py: the tasks extra).

Keys under ``prefix``: ``run:{id}`` (the record's JSON) and ``out:{id}`` (the linked
output, encrypted under the tasks' key when one is set) expire ``max_age`` seconds
after the run started; ``all`` and ``by:{caller}`` / ``by:{caller}:{flow}`` are sorted
sets of run ids scored by start time. Retention by count pops the oldest ids of
``all`` and deletes their keys; ids left in the per-caller sets by retention are
skipped (and removed) when a page meets them.
"""

from __future__ import annotations

import json
import time
from typing import Any

from chainweaver.mcp.runs.records import (
    RunQuery,
    RunRecord,
    RunStore,
    output_codec,
    parse_cursor,
)


class RedisRunStore(RunStore):
    """:class:`~.records.RunStore` on Redis (see the module)."""

    def __init__(self, url: str, *, max_runs: int = 10_000, max_age: float = 7 * 86400,
                 prefix: str = "chainweaver:runs") -> None:
        from redis.asyncio import Redis  # the tasks extra

        self.max_runs = max_runs
        self.max_age = max_age
        self.prefix = prefix
        self._redis: Any = Redis.from_url(url)
        self._ttl = max(1, int(max_age))

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _indexes(self, record: RunRecord) -> tuple[str, str]:
        return self._key("by", record.caller), self._key("by", record.caller, record.flow)

    async def save(self, record: RunRecord, *, new: bool = False) -> None:
        body = json.dumps(record.to_dict(), separators=(",", ":"))
        key = self._key("run", record.run_id)
        if not new:
            # Keeps the expiry set when the run started (a lost key stays lost).
            await self._redis.set(key, body, keepttl=True)
            return
        score = record.seq
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(key, body, ex=self._ttl)
            for index in (self._key("all"), *self._indexes(record)):
                pipe.zadd(index, {record.run_id: score})
                pipe.expire(index, self._ttl)
            pipe.zremrangebyscore(self._key("all"), "-inf",
                                  f"({int((time.time() - self.max_age) * 1e6)}")
            pipe.zcard(self._key("all"))
            replies = await pipe.execute()
        excess = int(replies[-1]) - self.max_runs
        if excess > 0:
            dropped = await self._redis.zpopmin(self._key("all"), excess)
            names = [member.decode() for member, _ in dropped]
            keys = [self._key(kind, run_id) for run_id in names for kind in ("run", "out")]
            if keys:
                await self._redis.delete(*keys)

    async def get(self, run_id: str) -> RunRecord | None:
        raw = await self._redis.get(self._key("run", run_id))
        return RunRecord.from_dict(json.loads(raw)) if raw is not None else None

    async def delete(self, run_id: str) -> None:
        record = await self.get(run_id)
        keys = [self._key("run", run_id), self._key("out", run_id)]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(*keys)
            pipe.zrem(self._key("all"), run_id)
            if record is not None:
                for index in self._indexes(record):
                    pipe.zrem(index, run_id)
            await pipe.execute()

    async def page(self, query: RunQuery) -> tuple[list[RunRecord], str | None]:
        if query.caller is None:
            index = self._key("all") if query.flow is None else None
        else:
            index = self._key("by", query.caller, *(() if query.flow is None
                                                     else (query.flow,)))
        top: Any = "+inf"
        after: tuple[int, str] | None = None
        if query.cursor is not None:
            after = parse_cursor(query.cursor)
            top = after[0]
        if index is None:  # an operator's filter by flow: every run is scanned
            index = self._key("all")
        now, found = time.time(), list[RunRecord]()
        batch = max(query.limit + 1, 64)
        while len(found) <= query.limit:
            entries = await self._redis.zrange(index, top, "-inf", desc=True, byscore=True,
                                               offset=0, num=batch, withscores=True)
            ids = [(member.decode(), int(score)) for member, score in entries]
            if after is not None:
                # Runs that started in the same microsecond as the cursor's: only those
                # after it (descending id order, as Redis gives them).
                ids = [(run_id, score) for run_id, score in ids
                       if score < after[0] or run_id < after[1]]
            if not ids:
                break
            raws = await self._redis.mget([self._key("run", run_id) for run_id, _ in ids])
            gone = []
            for (run_id, _), raw in zip(ids, raws, strict=True):
                if raw is None:
                    gone.append(run_id)
                    continue
                record = RunRecord.from_dict(json.loads(raw))
                if query.admits(record, now, self.max_age):
                    found.append(record)
                    if len(found) > query.limit:
                        break
            if gone:
                await self._redis.zrem(index, *gone)
            last_id, last_score = ids[-1]
            after, top = (last_score, last_id), last_score
            if len(entries) < batch:
                break
        if len(found) > query.limit:
            return found[:query.limit], found[query.limit - 1].cursor
        return found, None

    async def put_output(self, run_id: str, data: bytes) -> None:
        await self._redis.set(self._key("out", run_id), output_codec().encode(data),
                              ex=self._ttl)

    async def output(self, run_id: str, offset: int = 0, length: int | None = None
                     ) -> bytes | None:
        key = self._key("out", run_id)
        codec = output_codec()
        if codec.encrypts:
            stored = await self._redis.get(key)
            if stored is None:
                return None
            data = codec.decode(stored)
            return data[offset:] if length is None else data[offset:offset + length]
        if length is None:
            stored = await self._redis.get(key)
            return None if stored is None else bytes(stored)[offset:]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.exists(key)
            pipe.getrange(key, offset, offset + length - 1)
            present, data = await pipe.execute()
        return bytes(data) if present else None

    async def close(self) -> None:
        await self._redis.aclose()
