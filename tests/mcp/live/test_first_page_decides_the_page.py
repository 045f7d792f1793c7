"""The first tools/list of a large catalogue builds the decisions of its page only.

Which tools a view that narrows nothing lists (and the cursor fingerprint over them)
comes from the governance filter's judgement of every flow; what each listed flow
publishes is built when its page is served. The governance filter holds all the same:
a flow it filters out in the first page's range is not listed, not callable, not
readable; a cursor still covers the caller's whole list, so a change anywhere in it
between pages asks to list again, and a forged or replayed cursor is refused. Through a
real MCP client, on both protocol eras.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import anyio
import pytest
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from mcp import MCPError
from pydantic import BaseModel
from support.generated_flows import tool_executor
from support.views import answer, renamed

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import ExposurePolicy, FlowServer, ServingConfig, schema_uri
from chainweaver.mcp.gate.body_cap import MESSAGE_BUDGET
from chainweaver.mcp.live.cursors import INVALID_CURSOR, LIST_AGAIN
from chainweaver.mcp.publish import exposure as exposure_module

from ..test_lazy_plans import registries

pytestmark = pytest.mark.anyio
MODES = ["legacy", "auto"]
FLOWS = 400  # about 4 KB a tool: the list is cut by its size into two or more pages


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read", idempotent=True))
def shout(data: Text) -> Text:
    return Text(text=data.text.upper())


@tool(safety=ToolSafetyContract("write"))
def scribble(data: Text) -> Text:
    return data


# Flows in the first page's range that governance filters out, each for its own reason.
FILTERED = {
    "flow_0003": {"governance": FlowGovernance(lifecycle="archived")},
    "flow_0005": {"governance": FlowGovernance(lifecycle="draft")},
    "flow_0007": {"governance": FlowGovernance(publish=False)},
    "flow_0009": {"governance": FlowGovernance(owner="elsewhere")},
    "flow_0011": {"steps": [FlowStep("scribble")]},  # writes: not allowed
    "flow_0013": {"governance": FlowGovernance(withheld="shared governance withholds it")},
    "flow_0015": {"steps": [FlowStep("no_such_tool")]},  # cannot run
}


def catalogue(page_size: int | None = None) -> FlowServer:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(shout)
    executor.register_tool(scribble)
    for index in range(FLOWS):
        name = f"flow_{index:04d}"
        special: dict[str, Any] = FILTERED.get(name, {})
        executor.registry.register_flow(Flow(
            name, "Shouts. " * 500, special.get("steps", [FlowStep("shout")]),
            governance=special.get("governance", FlowGovernance(owner="team"))))
    return FlowServer(executor, expose_schemas=True, expose_prompts=True,
                      policy=ExposurePolicy(owners=["team"]),
                      serving=ServingConfig(page_size=page_size))


def counting_decisions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The flows fully decided (what each publishes built) from now on."""
    decided: list[str] = []
    original = exposure_module.decide_flow

    def counted(executor: Any, policy: Any, flow: Flow, **options: Any) -> Any:
        decided.append(flow.name)
        return original(executor, policy, flow, **options)

    monkeypatch.setattr(exposure_module, "decide_flow", counted)
    return decided


async def every_page(client: Client) -> list[list[str]]:
    found, cursor = [], None
    while True:
        page = await client.list_tools_mcp(cursor=cursor)
        assert len(page.model_dump_json(by_alias=True, exclude_none=True)) <= MESSAGE_BUDGET
        found.append([item.name for item in page.tools])
        cursor = page.next_cursor
        if cursor is None:
            return found


def decided_server(registered: list[Flow], policy: dict[str, Any], *, report_first: bool
                   ) -> tuple[FlowServer, list[dict[str, Any]]]:
    """A server over ``registered``; with ``report_first``, every flow decided first."""
    executor = tool_executor()
    for flow in registered:
        executor.registry.register_flow(flow)
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        policy=ExposurePolicy(**policy))
    report = [line.to_dict() for line in server.exposure_report()] if report_first else []
    return server, report


async def requests_about(client: Client, name: str) -> dict[str, Any]:
    """A call, a schema read and a prompt render about ``name``, answered."""
    session = client.session
    return {
        "call": await answer(lambda: session.call_tool(name, {"text": "hi"})),
        "read": await answer(lambda: session.read_resource(schema_uri(name))),
        "prompt": await answer(lambda: session.get_prompt(name, {"text": "hi"})),
    }


async def refusal(client: Client, cursor: str) -> tuple[int, str]:
    with pytest.raises(MCPError) as refused:
        await client.list_tools_mcp(cursor=cursor)
    return refused.value.error.code, refused.value.error.message


@pytest.mark.parametrize("mode", MODES)
async def test_the_first_page_decides_only_its_own_flows(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = catalogue()
    decided = counting_decisions(monkeypatch)
    async with Client(server.fastmcp, mode=mode) as client:
        first = await client.list_tools_mcp()
    assert first.next_cursor is not None and len(first.tools) < FLOWS - len(FILTERED)
    # The page's flows (and the one measured past it that did not fit), not all 400.
    assert len(decided) <= len(first.tools) + 1 + len(FILTERED)
    assert set(decided) >= {tool.name for tool in first.tools}


@pytest.mark.parametrize("mode", MODES)
async def test_a_filtered_flow_in_the_first_pages_range_is_absent_everywhere(
        mode: str) -> None:
    server = catalogue()
    async with Client(server.fastmcp, mode=mode) as client:
        first = await client.list_tools_mcp()
        listed = [tool.name for tool in first.tools]
        assert listed[:3] == ["flow_0000", "flow_0001", "flow_0002"]
        assert listed[-1] > max(FILTERED)  # the filtered flows are in its range
        pages = await every_page(client)
        never = await requests_about(client, "flow_9999")  # never registered
        for name in FILTERED:
            # Answered exactly like a name that never existed.
            assert renamed(await requests_about(client, name), name, "flow_9999") == never
    assert not set(FILTERED) & set(listed)
    everything = [name for page in pages for name in page]
    assert everything == sorted(everything)
    published = [entry.tool_name for entry in server.exposure_report() if entry.exposed]
    assert everything == sorted(published)
    assert len(everything) == FLOWS - len(FILTERED)
    # The report judges every flow exactly as the lists did.
    assert {entry.flow_name for entry in server.exposure_report()
            if not entry.exposed} == set(FILTERED)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("page_size", [None, 50])
@pytest.mark.parametrize("where", ["listed", "beyond the page", "new flow"])
async def test_a_governance_change_anywhere_in_the_list_between_pages_asks_to_list_again(
        mode: str, page_size: int | None, where: str) -> None:
    server = catalogue(page_size)
    registry = server.executor.registry
    async with Client(server.fastmcp, mode=mode) as client:
        first = await client.list_tools_mcp()
        assert first.next_cursor is not None
        if where == "listed":
            registry.set_lifecycle(first.tools[1].name, "archived")
        elif where == "beyond the page":
            registry.set_lifecycle(f"flow_{FLOWS - 1:04d}", "archived")
        else:
            registry.register_flow(Flow("zz_new", "New.", [FlowStep("shout")],
                                        governance=FlowGovernance(owner="team")))
        assert await refusal(client, first.next_cursor) == (-32602, LIST_AGAIN)
        again = [name for page in await every_page(client) for name in page]
    if where == "listed":
        assert first.tools[1].name not in again
    elif where == "beyond the page":
        assert f"flow_{FLOWS - 1:04d}" not in again
    else:
        assert again[-1] == "zz_new"


@pytest.mark.parametrize("mode", MODES)
async def test_a_change_governance_filters_out_leaves_paging_untouched(mode: str) -> None:
    server = catalogue()
    registry = server.executor.registry
    async with Client(server.fastmcp, mode=mode) as client:
        quiet = await every_page(client)
        first = await client.list_tools_mcp()
        # A new version of a filtered flow, still filtered: nothing any caller sees.
        registry.register_flow(Flow("flow_0005", "Still a draft.", [FlowStep("shout")],
                                    version="2.0.0",
                                    governance=FlowGovernance(lifecycle="draft")))
        assert first.next_cursor is not None
        second = await client.list_tools_mcp(cursor=first.next_cursor)
    assert [tool.name for tool in second.tools] == quiet[1]


@pytest.mark.parametrize("mode", MODES)
async def test_hostile_cursors_on_the_first_page_are_refused(mode: str) -> None:
    server = catalogue()
    async with Client(server.fastmcp, mode=mode) as client:
        first = await client.list_tools_mcp()
        assert first.next_cursor is not None
        fingerprint, _, position = first.next_cursor.partition(".")
        other_fingerprint = ("0" if fingerprint[0] != "0" else "1") + fingerprint[1:]
        answers = {cursor: await refusal(client, cursor) for cursor in (
            f"{other_fingerprint}.{position}",  # another list's
            f"{fingerprint}.{FLOWS * 10}",  # past the end
            f"{fingerprint}.-1", f"{fingerprint}.1e3", f"{fingerprint}.{'9' * 40}",
            f"{fingerprint}.{position} ", f"{fingerprint}.", "nonsense", "",
            f"{fingerprint}.{position}.{position}")}
        on_other_lists = []
        for other in (client.list_prompts_mcp, client.list_resources_mcp):
            with pytest.raises(MCPError) as wrong_kind:
                await other(cursor=first.next_cursor)
            on_other_lists.append((wrong_kind.value.error.code,
                                   wrong_kind.value.error.message))
        # The server goes on serving, and the real cursor still works.
        second = await client.list_tools_mcp(cursor=first.next_cursor)
    assert answers[f"{other_fingerprint}.{position}"] == (-32602, LIST_AGAIN)
    assert answers[f"{fingerprint}.{FLOWS * 10}"] == (-32602, LIST_AGAIN)
    for cursor, (code, message) in answers.items():
        assert code == -32602, cursor
        assert message in (LIST_AGAIN, INVALID_CURSOR), cursor
    assert on_other_lists == [(-32602, LIST_AGAIN)] * 2
    assert second.tools and second.tools[0].name > first.tools[-1].name


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(registries())
def test_a_first_list_lists_exactly_what_the_full_decision_publishes(
        case: tuple[list[Flow], dict[str, Any]]) -> None:
    """Over random registries and policies: a first tools/list (every flow judged, only
    the page's built) lists exactly the flows a server that decided every flow first
    publishes, item for item, in the same order."""
    registered, policy = case
    judged_first, _ = decided_server(registered, policy, report_first=False)
    decided_first, report = decided_server(registered, policy, report_first=True)

    async def listed(server: FlowServer) -> list[dict[str, Any]]:
        async with Client(server.fastmcp) as client:
            result = await client.list_tools_mcp()
        assert result.next_cursor is None
        return [renamed(tool.model_dump(exclude_none=True), server._provider.owner, "OWNER")
                for tool in result.tools]

    judged = anyio.run(listed, judged_first)
    assert judged == anyio.run(listed, decided_first)
    assert [tool["name"] for tool in judged] == sorted(
        line["tool_name"] for line in report if line["exposed"])
    # And the report made afterwards is the one made first.
    assert [line.to_dict() for line in judged_first.exposure_report()] == report


@pytest.mark.parametrize("mode", MODES)
async def test_a_listed_snapshot_is_freed_once_a_change_replaces_it(mode: str) -> None:
    """The page's list is kept in the caller's view of its snapshot, and views are
    kept per snapshot only while it lives: the list must not keep its snapshot (and so
    itself, and every decision in it) alive after a change replaces it."""
    server = catalogue()
    registry = server.executor.registry
    live = server._provider.exposure  # which snapshot is current is not public API
    async with Client(server.fastmcp, mode=mode) as client:
        await client.list_tools_mcp()
        listed = weakref.ref(live.latest)
        registry.set_lifecycle("flow_0001", "archived")
        second = await every_page(client)
        assert "flow_0001" not in [name for page in second for name in page]
        assert live.latest is not listed()
        # The change notifier holds the old snapshot while it works out what changed
        # (in its worker thread, while the server runs); once it is done, nothing may.
        for _ in range(100):  # a bound that only stops a hang
            gc.collect()
            if listed() is None:
                break
            await anyio.sleep(0.05)
    assert listed() is None
