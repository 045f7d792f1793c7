"""The shared Redis fixture starts a real server that answers commands."""

from __future__ import annotations

import redis


def test_redis_fixture_is_a_real_server(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("chainweaver:probe", "1")
    assert client.get("chainweaver:probe") == b"1"
    assert client.info("server")["redis_version"]
