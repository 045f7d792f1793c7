"""The one place ChainWeaver reaches past FastMCP's public API (tested in
tests/mcp/test_live.py::test_the_fastmcp_seam_still_exists, which fails loudly when it
moves).

FastMCP 4.1 has no public way to serve ``subscriptions/listen`` or
``resources/subscribe``, nor to see a list request's cursor: the MCP SDK derives the
``listChanged``/``subscribe`` capabilities from the low-level server's handlers, so
they are registered there (with the SDK's public ``add_request_handler``), and the
list handlers are wrapped there (``get_request_handler``).
"""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP


def low_level_server(server: FastMCP) -> Any:
    """The MCP SDK server under ``server`` (handlers, capabilities)."""
    return server._mcp_server
