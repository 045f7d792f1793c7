"""Tools-only clients: schema resources and prompts published as tools as well.

FastMCP's ``ResourcesAsTools`` adds ``list_resources`` and ``read_resource`` tools,
``PromptsAsTools`` adds ``list_prompts`` and ``get_prompt``. Both call back into the
server with its middleware, so the security gate and the caller's view apply to what
they list and read. A caller's mistake (an unknown name, a malformed run URI, an
argument that does not fit, a refusal of the gate) becomes an ``isError`` result with
the text the protocol request would answer (FastMCP's own "not found" text, identical
for a flow outside the caller's view and a name that never existed), logged without a
traceback (see :mod:`.mistakes`); a fault of the server stays FastMCP's error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.transforms import GetToolNext, PromptsAsTools, ResourcesAsTools, Transform
from fastmcp.tools.base import Tool, ToolResult
from fastmcp.tools.tool_transform import forward
from fastmcp.utilities.versions import VersionSpec

from chainweaver.errors import ExposureConfigError
from chainweaver.mcp.components.mistakes import caller_mistake, mistake_result
from chainweaver.mcp.gate.body_cap import is_output_uri, sent_size, too_large_to_send
from chainweaver.mcp.gate.malformed import malformed_prompt_request
from chainweaver.mcp.publish.exposure import Exposure

RESOURCE_TOOLS = ("list_resources", "read_resource")
PROMPT_TOOLS = ("list_prompts", "get_prompt")
Guard = Callable[..., Awaitable[ToolResult]]  # runs a tool form (FastMCP's transform_fn)


def tool_form_names(*, resources: bool, prompts: bool) -> tuple[str, ...]:
    """The names of the tools :func:`add_tool_forms` adds."""
    return (RESOURCE_TOOLS if resources else ()) + (PROMPT_TOOLS if prompts else ())


def check_tool_forms(exposure: Exposure, names: tuple[str, ...]) -> None:
    """Raise :class:`ExposureConfigError` when ``exposure`` publishes a flow under one
    of ``names`` (the generated tool would hide it).

    Run on the first snapshot and on every later one, so a flow registered while
    serving cannot take a generated tool's name either.
    """
    taken = [name for name in names if exposure.tool(name) is not None]
    if taken:
        raise ExposureConfigError(
            f"flow tool name(s) {', '.join(taken)} clash with the tools that "
            "resources_as_tools / prompts_as_tools add; set server_prefix")


def add_tool_forms(server: FastMCP, exposure: Exposure, *, resources: bool,
                   prompts: bool) -> None:
    """Add the resource and/or prompt tools to ``server``.

    Raises :class:`ExposureConfigError` when a flow is published under one of their
    names (the generated tool would hide it).
    """
    names = tool_form_names(resources=resources, prompts=prompts)
    check_tool_forms(exposure, names)
    if resources:
        server.add_transform(ResourcesAsTools(server))
    if prompts:
        server.add_transform(PromptsAsTools(server))
    answering = {name: guard for name, guard in _GUARDS.items() if name in names}
    if answering:
        server.add_transform(AnsweringMistakes(answering))


class AnsweringMistakes(Transform):
    """Serves the tools the transforms before it added (``guards``: name -> how it runs)
    so that a caller's mistake is an ``isError`` result, not a tool that crashed."""

    def __init__(self, guards: Mapping[str, Guard]) -> None:
        self.guards = guards

    async def get_tool(self, name: str, call_next: GetToolNext, *,
                       version: VersionSpec | None = None) -> Tool | None:
        tool = await call_next(name, version=version)
        guard = self.guards.get(name)
        if tool is None or guard is None:
            return tool
        return Tool.from_tool(tool, transform_fn=guard)


async def _list_resources(**arguments: Any) -> ToolResult:
    return _fitting("tool result", "list_resources", await forward(**arguments))


async def _list_prompts(**arguments: Any) -> ToolResult:
    return _fitting("tool result", "list_prompts", await forward(**arguments))


async def _read_resource(**arguments: Any) -> ToolResult:
    uri = arguments.get("uri")
    return _fitting("resource", uri if isinstance(uri, str) else "",
                    await _answered(arguments))


async def _get_prompt(**arguments: Any) -> ToolResult:
    # Checked as the gate checks prompts/get: FastMCP would build its request from
    # them and fail (a pydantic error, logged as a crash) on a value that is no string.
    given = arguments.get("arguments")
    problem = malformed_prompt_request(
        {"name": arguments.get("name"), **({"arguments": given} if given else {})})
    if problem is not None:
        raise mistake_result(problem)
    name = arguments.get("name")
    return _fitting("prompt", name if isinstance(name, str) else "",
                    await _answered(arguments))


async def _answered(arguments: dict[str, Any]) -> ToolResult:
    """Run the tool form; a caller's mistake in the read or render it makes raises
    FastMCP's ``ToolError``, which it logs in one line, without a traceback."""
    try:
        return await forward(**arguments)
    except Exception as error:
        answer = caller_mistake(error)
        if answer is None:
            raise
        raise mistake_result(answer) from None


def _fitting(what: str, name: str, result: ToolResult) -> ToolResult:
    """``result``, unless it could not reach a client in one message: a tool form wraps
    what it reads as JSON in its text, escaped again, so a read or a render that fits
    may not fit as a tool's result. Then the caller is told so, as for the read (see
    :mod:`chainweaver.mcp.gate.body_cap`)."""
    texts = [getattr(block, "text", "") for block in result.content]
    size = sent_size(texts * 2 if result.structured_content is not None else texts)
    if size is None:
        return result
    raise mistake_result(too_large_to_send(what, name, size, is_output_uri(name))
                         .error.message)


_GUARDS: dict[str, Guard] = {"list_resources": _list_resources,
                             "read_resource": _read_resource,
                             "list_prompts": _list_prompts, "get_prompt": _get_prompt}
