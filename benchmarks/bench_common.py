"""What the benchmark scripts share."""

from __future__ import annotations


async def ignore_log(message: object) -> None:
    """A client log handler that drops a run's log message.

    The server still sends it, and that cost is measured; FastMCP's default client
    handler would render it with rich, which is the client's cost, not the server's.
    """
