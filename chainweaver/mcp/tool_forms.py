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

from ..errors import ExposureConfigError
from .exposure import Exposure

RESOURCE_TOOLS = ("list_resources", "read_resource")
PROMPT_TOOLS = ("list_prompts", "get_prompt")


def add_tool_forms(server: FastMCP, exposure: Exposure, *, resources: bool,
                   prompts: bool) -> None:
    """Add the resource and/or prompt tools to ``server``.

    Raises :class:`ExposureConfigError` when a flow is published under one of their
    names (the generated tool would hide it).
    """
    names = (RESOURCE_TOOLS if resources else ()) + (PROMPT_TOOLS if prompts else ())
    taken = [name for name in names if exposure.tool(name) is not None]
    if taken:
        raise ExposureConfigError(
            f"flow tool name(s) {', '.join(taken)} clash with the tools that "
            "resources_as_tools / prompts_as_tools add; set server_prefix")
    if resources:
        server.add_transform(ResourcesAsTools(server))
    if prompts:
        server.add_transform(PromptsAsTools(server))
