"""Tools-only clients: schema resources and prompts published as tools as well.

FastMCP's ``ResourcesAsTools`` adds ``list_resources`` and ``read_resource`` tools,
``PromptsAsTools`` adds ``list_prompts`` and ``get_prompt``. Both call back into the
server with its middleware, so the security gate and the caller's view apply to what
they list and read. Their errors become ``isError`` results, with FastMCP's own "not
found" text, identical for a flow outside the caller's view and a name that never
existed.
"""

from __future__ import annotations

from fastmcp import FastMCP
from fastmcp.server.transforms import PromptsAsTools, ResourcesAsTools

from chainweaver.errors import ExposureConfigError
from chainweaver.mcp.publish.exposure import Exposure

RESOURCE_TOOLS = ("list_resources", "read_resource")
PROMPT_TOOLS = ("list_prompts", "get_prompt")


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
    check_tool_forms(exposure, tool_form_names(resources=resources, prompts=prompts))
    if resources:
        server.add_transform(ResourcesAsTools(server))
    if prompts:
        server.add_transform(PromptsAsTools(server))
