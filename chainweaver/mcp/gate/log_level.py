"""The level of log messages a 2025-11-25 client asked for with ``logging/setLevel``.

FastMCP keeps that level where no public API reads it (and moved it between 4.1 and
4.2), so the gate notes it itself: its middleware sees every ``logging/setLevel``
request, and the level goes into the client's session state through FastMCP's public
``Context.set_state``. A run reads it back with ``Context.get_state``. Either step
failing only means no run log messages for that client; a call never fails for it.
"""

from __future__ import annotations

import logging
from typing import get_args

from fastmcp.server.context import Context
from fastmcp.server.middleware import MiddlewareContext
from mcp_types import LoggingLevel

logger = logging.getLogger("chainweaver.mcp.gate.log_level")

STATE_KEY = "chainweaver.client_log_level"
LEVELS: tuple[str, ...] = get_args(LoggingLevel)  # by severity, lowest first


async def remember(context: MiddlewareContext) -> None:
    """Note the level of a ``logging/setLevel`` request the server has just accepted."""
    params = context.message
    level = params.get("level") if isinstance(params, dict) else getattr(params, "level", None)
    ctx = context.fastmcp_context
    if level not in LEVELS or ctx is None:
        return
    try:
        await ctx.set_state(STATE_KEY, level)
    except Exception as error:  # the state store failed: no run log messages, nothing else
        logger.warning("could not keep the client's log level: %s", type(error).__name__)


async def client_log_level(ctx: Context) -> str | None:
    """The level this request's client set with ``logging/setLevel``, else the server's
    ``client_log_level`` (if the operator set one), else None."""
    try:
        level = await ctx.get_state(STATE_KEY)
    except Exception as error:
        logger.debug("could not read the client's log level: %s", type(error).__name__)
        level = None
    if level in LEVELS:
        return str(level)
    default = ctx.fastmcp.client_log_level
    return str(default) if default is not None else None
