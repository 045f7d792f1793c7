"""Malformed requests the gate refuses itself, naming what is wrong (-32602).

The MCP SDK refuses a ``prompts/get`` whose params do not have the shape MCP requires
with a bare "Invalid request parameters"; the gate sees the raw params first and names
the argument instead, in words that never depend on whether the prompt exists.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastmcp.server.middleware import MiddlewareContext
from mcp import MCPError
from mcp_types import INVALID_PARAMS


def malformed_prompt_request(params: Mapping[str, Any]) -> str | None:
    """Why raw ``prompts/get`` params do not have the shape MCP requires, or None.

    The MCP SDK refuses such requests with a bare "Invalid request parameters"; this
    names the argument instead. The text never depends on whether the prompt exists.
    """
    if "name" not in params:
        return "prompts/get needs a 'name' (a string)"
    name = params["name"]
    if not isinstance(name, str):
        return f"prompts/get 'name' must be a string, got {json_type(name)}"
    arguments = params.get("arguments")
    if arguments is None:
        return None
    if not isinstance(arguments, Mapping):
        return (f"Prompt {name!r}: arguments must be an object of strings, got "
                f"{json_type(arguments)}")
    for argument, value in arguments.items():
        if not isinstance(value, str):
            return (f"Prompt {name!r}: argument {str(argument)!r} must be a string, got "
                    f"{json_type(value)}")
    return None


def json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def refuse_malformed(problem: str) -> Callable[[MiddlewareContext], Awaitable[Any]]:
    async def refuse(context: MiddlewareContext) -> Any:
        raise MCPError(code=INVALID_PARAMS, message=problem)

    return refuse
