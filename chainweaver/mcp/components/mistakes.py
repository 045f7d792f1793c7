"""A caller's mistake answered as one: -32602 (or an ``isError`` result) on the wire,
and no traceback in the server's log.

FastMCP logs an error raised while a resource is read or a prompt is rendered with its
traceback, at the error's ``log_level``; a tool's ``ToolError`` as one line at that
level; anything else as an ERROR with its traceback. A caller's mistake (a malformed
URI, an argument that does not fit, a name that does not exist) is not a fault of the
server: it is raised as FastMCP's client error with a level below DEBUG, so a server
logging even at DEBUG shows no traceback for it. The audit and the request metrics
still record every such request; real faults keep FastMCP's ERROR and traceback.
"""

from __future__ import annotations

from fastmcp.exceptions import DisabledError, NotFoundError, ToolError, ValidationError
from mcp import MCPError
from mcp_types import INVALID_PARAMS

from chainweaver.mcp.hooks import GATE_REFUSED

# Below logging.DEBUG (10): only a handler set to this level or lower sees it.
MISTAKE_LOG_LEVEL = 5


def invalid_request(message: str) -> ValidationError:
    """A caller's mistake in a read or a render: FastMCP answers it -32602 with
    ``message`` and logs it below DEBUG."""
    return ValidationError(message, log_level=MISTAKE_LOG_LEVEL)


def caller_mistake(error: BaseException) -> str | None:
    """What a tool answers for ``error`` when it is the caller's mistake (a name that
    does not exist, a request refused as invalid or by the gate); None: a fault."""
    if isinstance(error, (NotFoundError, DisabledError, ValidationError)):
        return str(error)
    if isinstance(error, MCPError) and error.error.code in (INVALID_PARAMS, GATE_REFUSED):
        return error.error.message
    return None


def mistake_result(message: str) -> ToolError:
    """A caller's mistake in a tool: an ``isError`` result with ``message``, logged
    in one line below DEBUG, never masked by ``error_detail`` (it is the caller's)."""
    return ToolError(message, log_level=MISTAKE_LOG_LEVEL)
