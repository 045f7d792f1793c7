"""Run records in Redis, shared by every replica (needs redis-py: the tasks extra).

Keys under ``prefix``: ``run:{id}`` (the record's JSON) and ``out:{id}`` (the linked
output, encrypted under the tasks' key when one is set) expire ``max_age`` seconds
after the run started; ``all``, ``caller:{caller}`` and ``caller:{caller}:flow:{flow}``
are sorted sets of run ids scored by start time. Caller ids and flow names are
percent-encoded (UTF-8; every byte but ``A-Z a-z 0-9 - . _ ~``), so no id can spell
another caller's key; run ids are 24 hex digits (any other id names no run).

Each new run trims the indexes it joins: ids older than ``max_age`` go, and each
caller's indexes keep its newest ``max_runs`` ids; they expire ``max_age`` after that
caller's newest run. Past ``max_runs`` in all, the oldest runs are deleted, and their
ids leave their callers' indexes. Every record read back is checked against the
caller that asked. A Redis failure raises :class:`~.records.RunStoreError` (its
text fixed) and is logged with its detail, any password in the URL masked.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from chainweaver.mcp.runs.records import (
    FINISHED,
    RUN_ID,
    RunQuery,
    RunRecord,
    RunStatus,
    RunStore,
    RunStoreError,
    ended_record,
    output_codec,
    parse_cursor,
)

logger = logging.getLogger("chainweaver.mcp.runs")

# Transactions a cancel tries before leaving the record to its run (saving it meanwhile).
CANCEL_TRIES = 5


def key_part(text: str) -> str:
    """``text`` as one component of a key: percent-encoded, never holding ``:``. A lone
    surrogate (``"\\ud800"`` in a token's JSON) is encoded as its own three bytes, so
    every string has a key of its own and none raises."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def masked(url: str) -> str:
    """``url`` with its password as ``***``: the one before ``@``, and a ``password``
    query parameter (redis-py reads both)."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    if query:
        query = "&".join(f"{name}=***" if unquote(name) == "password" else f"{name}{sep}{value}"
                         for name, sep, value in (pair.partition("=")
                                                  for pair in query.split("&")))
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    # Spelled out: urlunsplit would drop the "//" of unix:///path.
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "") + \
        (f"#{parts.fragment}" if parts.fragment else "")


def _secrets(url: str) -> list[str]:
    """The passwords in ``url`` as the URL spells them and as redis-py sends them."""
    parts = urlsplit(url)
    found = [parts.password or ""]
    found += [value for name, _, value in (pair.partition("=")
                                           for pair in parts.query.split("&"))
              if unquote(name) == "password"]
    return [text for secret in found if secret
            for text in dict.fromkeys((secret, unquote(secret)))]


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
        self._url = masked(url)
        self._secrets = _secrets(url)

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _index(self, caller: str, flow: str | None = None) -> str:
        if flow is None:
            return self._key("caller", key_part(caller))
        return self._key("caller", key_part(caller), "flow", key_part(flow))

    def _indexes(self, record: RunRecord) -> tuple[str, str]:
        return self._index(record.caller), self._index(record.caller, record.flow)

    @contextmanager
    def _failing(self, operation: str) -> Iterator[None]:
        """Turns a failure of Redis into :class:`RunStoreError`, logged with its detail."""
        from redis.exceptions import RedisError

        try:
            yield
        except (RedisError, OSError) as error:
            detail = str(error)
            for secret in self._secrets:
                detail = detail.replace(secret, "***")
            logger.warning("run history at %s: %s failed: %s: %s", self._url, operation,
                           type(error).__name__, detail)
            raise RunStoreError(type(error).__name__, detail) from None

    def _decoded(self, raw: bytes | None, caller: str | None, run_id: str
                 ) -> RunRecord | None:
        """The record ``raw`` (stored as run ``run_id``) holds, if ``caller`` (when
        given) owns it. An entry this process cannot read (damaged, edited by hand, a
        field of the wrong type, a record of another run) is left alone, like a
        missing one."""
        if raw is None:
            return None
        try:
            record = RunRecord.from_dict(json.loads(raw))
        except (ValueError, TypeError, RecursionError) as error:
            logger.warning("run history at %s: the record of run %s cannot be read and "
                           "is skipped (%s)", self._url, run_id, type(error).__name__)
            return None
        if record.run_id != run_id:
            logger.warning("run history at %s: the record stored as run %s names another "
                           "run and is skipped", self._url, run_id)
            return None
        if caller is not None and record.caller != caller:
            return None
        return record

    async def save(self, record: RunRecord, *, new: bool = False) -> None:
        body = json.dumps(record.to_dict(), separators=(",", ":"))
        key = self._key("run", record.run_id)
        with self._failing("save"):
            if not new:
                # Only over the record that is there, keeping the expiry set when the
                # run started: a record retention dropped stays dropped.
                await self._redis.set(key, body, keepttl=True, xx=True)
                return
            await self._file(record, key, body)

    async def _file(self, record: RunRecord, key: str, body: str) -> None:
        """Save a new record, file it in the indexes, and trim them."""
        now = time.time()
        left = int(record.started_at + self.max_age - now)
        if left <= 0:
            return  # older than max_age already: kept no more than in memory
        everyone = self._key("all")
        stale = f"({int((now - self.max_age) * 1e6)}"
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(key, body, ex=min(left, self._ttl))
            for index in (everyone, *self._indexes(record)):
                pipe.zadd(index, {record.run_id: record.seq})
                pipe.zremrangebyscore(index, "-inf", stale)
                # Only members younger than max_age stay: the expiry set here outlives
                # none of them by more than max_age.
                pipe.expire(index, self._ttl)
            for index in self._indexes(record):
                pipe.zremrangebyrank(index, 0, -self.max_runs - 1)
            pipe.zcard(everyone)
            replies = await pipe.execute()
        excess = int(replies[-1]) - self.max_runs
        if excess > 0:
            await self._evict(excess)

    async def _evict(self, count: int) -> None:
        """Delete the ``count`` oldest runs, and their ids from their callers' indexes."""
        dropped = await self._redis.zpopmin(self._key("all"), count)
        names = [run_id for run_id in (_member(member) for member, _ in dropped) if run_id]
        if not names:
            return
        raws = await self._redis.mget([self._key("run", run_id) for run_id in names])
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(*(self._key(kind, run_id) for run_id in names
                          for kind in ("run", "out")))
            for run_id, raw in zip(names, raws, strict=True):
                record = self._decoded(raw, None, run_id)
                if record is not None:
                    for index in self._indexes(record):
                        pipe.zrem(index, run_id)
            await pipe.execute()

    async def get(self, run_id: str, *, caller: str | None = None) -> RunRecord | None:
        if not RUN_ID.fullmatch(run_id):
            return None
        with self._failing("get"):
            raw = await self._redis.get(self._key("run", run_id))
        record = self._decoded(raw, caller, run_id)
        if record is None or record.started_at < time.time() - self.max_age:
            return None
        return record

    async def end(self, run_id: str, ended_at: float, status: RunStatus,
                  error_type: str | None = None) -> RunRecord | None:
        """:meth:`RunStore.end` as one transaction: written only if the record is
        still the one read (its run saving meanwhile starts it again; a run that keeps
        saving has the last word)."""
        from redis.exceptions import WatchError

        if not RUN_ID.fullmatch(run_id):
            return None
        key = self._key("run", run_id)
        with self._failing("cancel"):
            async with self._redis.pipeline(transaction=True) as pipe:
                for _ in range(CANCEL_TRIES):
                    try:
                        await pipe.watch(key)
                        known = self._decoded(await pipe.get(key), None, run_id)
                        if known is None or known.status in FINISHED:
                            return None
                        marked = ended_record(known, ended_at, status, error_type)
                        pipe.multi()
                        pipe.set(key, json.dumps(marked.to_dict(), separators=(",", ":")),
                                 keepttl=True, xx=True)
                        await pipe.execute()
                        return marked
                    except WatchError:
                        continue
        return None

    async def delete(self, run_id: str) -> None:
        if not RUN_ID.fullmatch(run_id):
            return
        record = await self.get(run_id)
        keys = [self._key("run", run_id), self._key("out", run_id)]
        with self._failing("delete"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(*keys)
                pipe.zrem(self._key("all"), run_id)
                if record is not None:
                    for index in self._indexes(record):
                        pipe.zrem(index, run_id)
                await pipe.execute()

    async def page(self, query: RunQuery) -> tuple[list[RunRecord], str | None]:
        if query.caller is None:  # an operator's listing (by flow: every run is scanned)
            index = self._key("all")
        else:
            index = self._index(query.caller, query.flow)
        with self._failing("page"):
            return await self._page(index, query)

    async def _page(self, index: str, query: RunQuery
                    ) -> tuple[list[RunRecord], str | None]:
        top: Any = "+inf"
        after: tuple[int, str] | None = None
        if query.cursor is not None:
            after = parse_cursor(query.cursor)
            top = after[0]
        now, found = time.time(), list[RunRecord]()
        batch = max(query.limit + 1, 64)
        while len(found) <= query.limit:
            entries = await self._redis.zrange(index, top, "-inf", desc=True, byscore=True,
                                               offset=0, num=batch, withscores=True)
            junk = [member for member, score in entries
                    if _member(member) is None or not math.isfinite(score)]
            if junk:
                # Members that name no run (written by hand, damaged): dropped like the
                # ids of runs that are gone, then the page is read again without them.
                if await self._redis.zrem(index, *junk):
                    continue
                entries = [entry for entry in entries if entry[0] not in junk]
            ids = [(_member(member) or "", int(score)) for member, score in entries]
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
                record = self._decoded(raw, None, run_id)
                if record is not None and query.admits(record, now, self.max_age):
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
        if not RUN_ID.fullmatch(run_id):
            return
        stored = output_codec().encode(data)
        with self._failing("put_output"):
            await self._redis.set(self._key("out", run_id), stored, ex=self._ttl)

    async def output(self, run_id: str, offset: int = 0, length: int | None = None, *,
                     caller: str | None = None) -> bytes | None:
        if not RUN_ID.fullmatch(run_id):
            return None
        key = self._key("out", run_id)
        codec = output_codec()
        ranged = length is not None and not codec.encrypts
        with self._failing("output"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(self._key("run", run_id))  # whose run it is
                if ranged:
                    pipe.exists(key)
                    pipe.getrange(key, offset, offset + (length or 0) - 1)
                else:
                    pipe.get(key)
                raw, *read = await pipe.execute()
        if caller is not None and self._decoded(raw, caller, run_id) is None:
            return None  # another caller's run: like one that never existed
        if ranged:
            present, data = read
            return bytes(data) if present else None
        stored = read[0]
        if stored is None:
            return None
        try:
            data = codec.decode(stored)
        except Exception as error:  # e.g. written under another encryption key
            logger.warning("run history at %s: the output of run %s cannot be decrypted "
                           "(%s)", self._url, run_id, type(error).__name__)
            raise RunStoreError(type(error).__name__, "output not decryptable") from None
        return data[offset:] if length is None else data[offset:offset + length]

    async def close(self) -> None:
        await self._redis.aclose()


def _member(member: bytes) -> str | None:
    """The run id an index member names (None: not one, e.g. written by hand)."""
    text = bytes(member).decode("utf-8", "replace")
    return text if RUN_ID.fullmatch(text) else None

