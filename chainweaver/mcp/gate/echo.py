"""Answers never echo more of a request than a client can be sent back.

FastMCP's "not found" answers quote the name or URI the caller sent, whole, in the
message and again in ``data``: a 700 KB URI (a 2025-11-25 body may be 4 MiB) comes back
as an error of 1.4 MB, which no standard HTTP client receives (their limit is 1 MiB a
message). Every error text and error result of the requests that name a component is
bounded here, after FastMCP built it, so a hidden name and one that never existed still
get the same answer: both pass through the same bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types
from fastmcp import FastMCP
from mcp import MCPError

from chainweaver.mcp.fastmcp_seams import low_level_server

# The longest echoed text: the 2026-07-28 transport bounds a name in its ``Mcp-Name``
# header to 16 KiB, so no answer to a name it carries is cut.
MAX_ECHO = 16 * 1024
# Requests whose answers quote the name, URI or reference the caller sent.
NAMING_METHODS = ("tools/call", "resources/read", "prompts/get", "completion/complete")


def bounded(text: str) -> str:
    """``text``, cut to :data:`MAX_ECHO` characters with the length it had."""
    if len(text) <= MAX_ECHO:
        return text
    return f"{text[:MAX_ECHO]}... ({len(text):,} characters in all)"


def _bounded_data(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return bounded(value)
    if depth > 4:
        return value
    if isinstance(value, dict):
        return {key: _bounded_data(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_bounded_data(item, depth + 1) for item in value]
    return value


def _bounded_result(result: Any) -> Any:
    """An error result whose texts are bounded (any other result as it is)."""
    if not isinstance(result, mcp_types.CallToolResult) or not result.is_error:
        return result
    if not any(isinstance(part, mcp_types.TextContent) and len(part.text) > MAX_ECHO
               for part in result.content):
        return result
    content = [part.model_copy(update={"text": bounded(part.text)})
               if isinstance(part, mcp_types.TextContent) else part
               for part in result.content]
    return result.model_copy(update={"content": content})


def bound_answers(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` whose error messages, error data and error results echo at most
    :data:`MAX_ECHO` characters of any text."""

    async def answer(ctx: Any, params: Any) -> Any:
        try:
            result = await handler(ctx, params)
        except MCPError as error:
            message, data = error.error.message, error.error.data
            if len(message) <= MAX_ECHO and data is None:
                raise
            raise MCPError(code=error.error.code, message=bounded(message),
                           data=_bounded_data(data)) from None
        return _bounded_result(result)

    return answer


def install(server: FastMCP) -> None:
    """Bound the answers of every request on ``server`` that names a component."""
    low = low_level_server(server)
    if low is None:
        return  # warned by the seam: answers echo what FastMCP echoes
    for method in NAMING_METHODS:
        entry = low.get_request_handler(method)
        if entry is not None:
            low.add_request_handler(method, entry.params_type, bound_answers(entry.handler))
