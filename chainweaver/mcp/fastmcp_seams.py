"""The places ChainWeaver reaches past FastMCP's and the MCP SDK's public API (tested in
tests/mcp/test_live.py::test_the_fastmcp_seams_still_exist, which fails loudly when
they move).

FastMCP 4.1 has no public way to serve ``subscriptions/listen`` or
``resources/subscribe``, nor to see a list request's cursor: the MCP SDK derives the
``listChanged``/``subscribe`` capabilities from the low-level server's handlers, so
they are registered there (with the SDK's public ``add_request_handler``), and the
list handlers are wrapped there (``get_request_handler``).

The SDK's ``ServerSession`` (one per request) does not say when its connection
ends, and notifying a closed one silently does nothing: the connection it belongs
to does, through its ``exit_stack``, closed when the connection ends.

The low-level server's ``get_tool_input_schema`` (what the SDK checks ``Mcp-Param-*``
headers against) has no public setter, and the level a 2025-11-25 client set with
``logging/setLevel`` is kept in a private map: a run's log messages honour it.

Background tasks (the ``tasks`` extra): fastmcp-tasks keeps the running Docket on the
server, and a worker enters the server's lifespan without a transport, as
fastmcp-tasks' own worker CLI does (both guarded by
tests/mcp/test_tasks.py::test_the_private_fastmcp_entry_points_used_for_tasks_still_exist).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from fastmcp import FastMCP


def low_level_server(server: FastMCP) -> Any:
    """The MCP SDK server under ``server`` (handlers, capabilities)."""
    return server._mcp_server


def on_connection_close(session: Any, callback: Callable[[], None]) -> bool:
    """Call ``callback`` when ``session``'s connection ends (False: cannot tell)."""
    stack = getattr(getattr(session, "_connection", None), "exit_stack", None)
    if not isinstance(stack, AsyncExitStack):
        return False
    stack.callback(callback)
    return True


def forget_request_handler(server: FastMCP, method: str) -> None:
    """Stop serving ``method`` (the SDK has no public way to remove a handler)."""
    low_level_server(server)._request_handlers.pop(method, None)


def install_input_schema_lookup(server: FastMCP, lookup: Callable[[str], Any]) -> None:
    """Make the SDK read published input schemas through ``lookup``
    (see :func:`chainweaver.mcp.views.input_schema_lookup`)."""
    low_level = low_level_server(server)
    if not hasattr(low_level, "get_tool_input_schema"):
        raise RuntimeError("FastMCP's low-level server no longer has "
                           "get_tool_input_schema: check chainweaver.mcp.fastmcp_seams")
    low_level.get_tool_input_schema = lookup


def session_log_level(ctx: Any) -> str | None:
    """The level the request's 2025-11-25 client set with ``logging/setLevel`` (None:
    it set none)."""
    from fastmcp.server.context import _log_level_session_key

    levels: dict[Any, str] = ctx.fastmcp._client_log_levels
    return levels.get(_log_level_session_key(ctx.session))


def running_docket(server: FastMCP) -> Any:
    """The Docket fastmcp-tasks started for ``server`` (None: not running)."""
    return server._docket


def lifespan_manager(server: FastMCP) -> Any:
    """``server``'s lifespan (Docket and its task worker), entered without a transport."""
    return server._lifespan_manager()
