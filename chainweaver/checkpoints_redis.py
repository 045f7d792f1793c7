"""Checkpoints on Redis (``redis`` package): one hash per run, every write one round
trip, values encrypted when a codec is given. Only imported by code that uses it, so
the engine never needs ``redis``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

DEFAULT_PREFIX = "chainweaver:checkpoints:"
DEFAULT_TTL = 7 * 86400.0  # seconds a run's checkpoints outlive its last write


class Codec(Protocol):
    """Turns stored values into what is kept at rest and back (e.g. Fernet)."""

    def encode(self, data: bytes) -> bytes: ...

    def decode(self, stored: bytes) -> bytes: ...


class RedisCheckpointStore:
    """A :class:`~chainweaver.checkpoints.CheckpointStore` on Redis.

    ``redis``: a ``redis.asyncio.Redis`` client, or a callable returning an async
    context manager that yields one (how Docket lends its connection). Each run is the
    hash ``{prefix}{run_id}``, expiring ``ttl`` seconds after its last write. With
    ``codec`` every value is encoded before it is stored (outputs at rest encrypted).
    """

    def __init__(self, redis: Any, *, prefix: str = DEFAULT_PREFIX,
                 ttl: float = DEFAULT_TTL, codec: Codec | None = None) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self._redis = redis
        self.prefix = prefix
        self.ttl = max(1, int(ttl))
        self.codec = codec
        self._kept: dict[str, Mapping[bytes | str, bytes]] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisCheckpointStore:
        """A store on the Redis server at ``url`` (``redis://host:6379/0``)."""
        import redis.asyncio as redis

        return cls(redis.Redis.from_url(url), **options)

    def _client(self) -> AbstractAsyncContextManager[Any]:
        if callable(self._redis) and not hasattr(self._redis, "hgetall"):
            lend: Callable[[], AbstractAsyncContextManager[Any]] = self._redis
            return lend()
        return _Borrowed(self._redis)

    def key(self, run_id: str) -> str:
        """The hash holding ``run_id``'s checkpoints."""
        return self.prefix + run_id

    def keep(self, run_id: str, stored: Mapping[bytes | str, bytes]) -> None:
        """What ``HGETALL`` of :meth:`key` returned, read by the caller in a round trip
        of its own: the next :meth:`load` of ``run_id`` returns it without reading."""
        self._kept[run_id] = stored

    async def load(self, run_id: str) -> Mapping[str, bytes]:
        stored = self._kept.pop(run_id, None)
        if stored is None:
            async with self._client() as redis:
                stored = await redis.hgetall(self.prefix + run_id)
        decode = self.codec.decode if self.codec is not None else _same
        return {_text(name): decode(value) for name, value in stored.items()}

    async def save(self, run_id: str, entries: Mapping[str, bytes]) -> None:
        encode = self.codec.encode if self.codec is not None else _same
        key = self.prefix + run_id
        async with self._client() as redis:
            pipe = redis.pipeline()  # the entry and its expiry, in one round trip
            pipe.hset(key, mapping={name: encode(value) for name, value in entries.items()})
            pipe.expire(key, self.ttl)
            await pipe.execute()

    async def discard(self, run_id: str) -> None:
        async with self._client() as redis:
            await redis.delete(self.prefix + run_id)


class _Borrowed:
    """A client held by the store, used as the lent ones are."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis

    async def __aenter__(self) -> Any:
        return self.redis

    async def __aexit__(self, *exc: object) -> None:
        return None


def _same(data: bytes) -> bytes:
    return data


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name
