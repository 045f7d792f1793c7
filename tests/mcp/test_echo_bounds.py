"""No answer echoes more of a request than MAX_ECHO characters: a very long name or
URI is answered with the same words as a short one, cut, on both eras. (No flow name
is that long, 64 characters at most, so a hidden flow's name is never cut: it answers
like one that never existed, as tests/mcp/test_views.py checks.)"""

from __future__ import annotations

import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer
from chainweaver.mcp.gate.echo import MAX_ECHO, bounded

pytestmark = pytest.mark.anyio
MODES = ["legacy", "auto"]
LONG = 200_000


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read", idempotent=True))
def shout(data: Text) -> Text:
    return Text(text=data.text.upper())


def server() -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(shout)
    executor.registry.register_flow(Flow("shown", "Shouts.", [FlowStep("shout")]))
    return FlowServer(executor, expose_schemas=True, expose_prompts=True,
                      visible=lambda caller, flow: flow.name == "shown")


def test_bounded_keeps_short_text_and_cuts_long_text_saying_how_long() -> None:
    assert bounded("x" * MAX_ECHO) == "x" * MAX_ECHO
    cut = bounded("y" * (MAX_ECHO + 1))
    assert cut == "y" * MAX_ECHO + f"... ({MAX_ECHO + 1:,} characters in all)"


async def answers(client: Client, name: str) -> list[tuple[int, str, object]]:
    """What each request naming ``name`` is answered (code, message, data)."""
    found: list[tuple[int, str, object]] = []
    result = await client.session.call_tool(name, {})
    assert result.is_error
    found.append((0, result.content[0].text, None))  # type: ignore[union-attr]
    for request in (lambda: client.session.read_resource(  # type: ignore[arg-type]
                        f"chainweaver://flows/{name}/schema"),
                    lambda: client.session.get_prompt(name, {})):
        with pytest.raises(MCPError) as refused:
            await request()
        found.append((refused.value.error.code, refused.value.error.message,
                      refused.value.error.data))
    return found


@pytest.mark.parametrize("mode", MODES)
async def test_long_names_are_answered_cut_in_every_primitive(mode: str) -> None:
    async with Client(server().fastmcp, mode=mode) as client:
        for code, message, data in await answers(client, "n" * LONG):
            assert code in (0, -32602)
            assert len(message) < MAX_ECHO + 100 and "characters in all)" in message
            assert data is None or len(str(data)) < MAX_ECHO + 200
