"""The two places ChainWeaver reaches past FastMCP's public API (tested in
tests/mcp/test_live.py::test_fastmcp_seams_still_exist, which fails loudly when they move).

- FastMCP 4.1 has no public way to serve ``subscriptions/listen`` or
  ``resources/subscribe``: the MCP SDK derives the ``listChanged``/``subscribe``
  capabilities from the low-level server's handlers, so they are registered there.
- A list request's middleware message carries no cursor; the raw params do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.middleware import MiddlewareContext


def low_level_server(server: FastMCP) -> Any:
    """The MCP SDK server under ``server`` (handlers, capabilities)."""
    return server._mcp_server


def raw_params(context: MiddlewareContext) -> Mapping[str, Any] | None:
    """The params of the request as the client sent them (None outside a request)."""
    fastmcp_context = context.fastmcp_context
    request = fastmcp_context.request_context if fastmcp_context else None
    params = getattr(getattr(request, "_srctx", None), "params", None)
    return params if isinstance(params, Mapping) else None
