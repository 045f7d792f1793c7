"""List cursors belong to a caller's view of a snapshot.

Several callers page every list while flows inside and outside their views change
(new versions, archives, new flows). A change outside a caller's view never changes
anything it is told: its paging goes on exactly as if nothing happened. A change inside
its view gives a coherent continuation or -32602 "list again", never a page of a
different list. Through a real MCP client, on both protocol eras.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowLifecycle,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import (
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    ServingConfig,
    visible_claim,
)
from chainweaver.mcp.live.cursors import LIST_AGAIN

TEAMS = ("red", "blue")
LISTS = [("list_tools", "tools"), ("list_resources", "resources"),
         ("list_prompts", "prompts")]


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read"))
def echo(text: str) -> Text:
    return Text(text=text)


class Callers:
    """The authenticator: the test says who is calling; a caller sees its team's flows."""

    def __init__(self) -> None:
        self.who = "red"

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, {"teams": [self.who]}, subject=self.who)


def flow(team: str, index: int, version: str = "1.0.0") -> Flow:
    return Flow(f"{team}_flow_{index}", f"Flow {index} of {team}.", [FlowStep("echo")],
                version=version, governance=FlowGovernance(owner=team))


def served() -> tuple[FlowServer, FlowRegistry, Callers]:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    for team in TEAMS:
        for index in range(4):
            executor.registry.register_flow(flow(team, index))
    callers = Callers()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(authenticator=callers,
                                                visible=visible_claim("teams")),
                        serving=ServingConfig(page_size=2))
    return server, executor.registry, callers


def change(registry: FlowRegistry, team: str, kind: str, step: int) -> None:
    """One governance change among ``team``'s flows."""
    if kind == "new_version":
        registry.register_flow(flow(team, step % 4, version=f"1.{step + 1}.0"))
    elif kind == "archive":
        name = f"{team}_flow_{step % 4}"
        for version in registry.versions(name):
            if registry.get_flow(name, version).governance.lifecycle != FlowLifecycle.ARCHIVED:
                registry.set_lifecycle(name, "archived", version=version)
    else:
        registry.register_flow(flow(team, 100 + step))


async def page(client: Client, method: str, cursor: str | None) -> Any:
    try:
        return await getattr(client, f"{method}_mcp")(cursor=cursor)
    except MCPError as error:
        return (error.error.code, error.error.message)


def flat(answers: list[Any]) -> list[Any]:
    """A listing's items (or its error), whatever their order."""
    return sorted(str(item) for answer in answers
                  for item in (answer if isinstance(answer, list) else [answer]))


def names(result: Any, key: str) -> list[str]:
    return [getattr(item, "name", None) or str(item.uri) for item in getattr(result, key)]


async def paged_through(client: Client, method: str, key: str,
                        between: Any = None) -> list[Any]:
    """Every page of one list, running ``between`` after the first page."""
    answers: list[Any] = []
    result = await page(client, method, None)
    while True:
        if isinstance(result, tuple):
            answers.append(result)
            return answers
        answers.append(names(result, key))
        if between is not None:
            between()
            between = None
        if not result.next_cursor:
            return answers
        result = await page(client, method, result.next_cursor)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize(("method", "key"), LISTS)
async def test_a_change_outside_the_view_leaves_paging_untouched(
        mode: str, method: str, key: str) -> None:
    server, registry, callers = served()
    async with Client(server.fastmcp, mode=mode) as client:
        quiet = await paged_through(client, method, key)
        disturbed = await paged_through(
            client, method, key, between=lambda: change(registry, "blue", "new_version", 0))
        archived = await paged_through(
            client, method, key, between=lambda: change(registry, "blue", "archive", 1))
    assert disturbed == archived == quiet
    assert all("blue" not in name for answer in quiet for name in answer)
    assert len(quiet) > 1  # it really is paged


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize(("method", "key"), LISTS)
async def test_a_change_inside_the_view_asks_to_list_again(
        mode: str, method: str, key: str) -> None:
    server, registry, callers = served()
    async with Client(server.fastmcp, mode=mode) as client:
        answers = await paged_through(
            client, method, key, between=lambda: change(registry, "red", "archive", 0))
    assert answers[-1] == (-32602, LIST_AGAIN)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(TEAMS), st.sampled_from(TEAMS),
                                st.sampled_from(["new_version", "archive", "new_flow"]),
                                st.sampled_from(LISTS)),
                      min_size=1, max_size=6),
       mode=st.sampled_from(["auto", "legacy"]))
def test_no_answer_differs_because_of_a_change_outside_the_callers_view(
        steps: list[tuple[str, str, str, tuple[str, str]]], mode: str) -> None:
    """Each step: a caller pages a list while one change lands after its first page.
    Each team has a twin server that gets only the changes among that team's flows:
    every answer a caller gets from the real server is the one its team's twin gives,
    whatever happened elsewhere (a change inside the view may ask to list again)."""

    async def go() -> None:
        server, registry, callers = served()
        twins = {team: served() for team in TEAMS}
        async with Client(server.fastmcp, mode=mode) as client:
            for number, (who, team, kind, (method, key)) in enumerate(steps):
                callers.who = who
                twin, twin_registry, twin_callers = twins[who]
                twin_callers.who = who

                def both(team: str = team, kind: str = kind, number: int = number) -> None:
                    change(registry, team, kind, number)
                    change(twins[team][1], team, kind, number)

                seen = await paged_through(client, method, key, between=both)
                again = await paged_through(client, method, key)
                async with Client(twin.fastmcp, mode=mode) as twin_client:
                    expected = await paged_through(twin_client, method, key)
                assert again == expected
                if team != who:
                    # Nothing happened in this caller's view: the paging went on, and
                    # it is the same listing again.
                    assert seen == expected

    anyio.run(go)
