"""Views follow what can run: a flow is in a caller's view only when the caller holds the
grant of every step on every path (sub-flows and fallbacks included, delegated steps
aside), and a flow outside the view answers in every primitive exactly like a name that
never existed. Delegation shows in exposure_report() and inspect."""

from __future__ import annotations

from typing import Any

import pytest
from fastmcp import Client, FastMCP
from pydantic import BaseModel
from support.views import NEVER, answer, renamed

from chainweaver import (
    Delegation,
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    Grants,
    ToolSafetyContract,
    tool,
)
from chainweaver.cli.inspect import format_table
from chainweaver.mcp import AuditEvent, CallerIdentity, FlowServer, GateContext, SecurityConfig

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]
READ = ToolSafetyContract("read")
HIDDEN = FlowGovernance(publish=False)


class Query(BaseModel):
    query: str


@tool(safety=READ)
def search(query: str) -> Query:
    return Query(query=query)


@tool(safety=READ, requires=["catalog.admin"])
def reindex(query: str) -> Query:
    return Query(query=query)


@tool(safety=READ)
def failing(query: str) -> Query:
    raise RuntimeError("down")


class Who:
    SCOPES = {"ann": frozenset(), "root": frozenset({"catalog.admin"})}

    def __init__(self) -> None:
        self.who = "ann"

    def __call__(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity(self.who, {"sub": self.who}, subject=self.who,
                              scopes=self.SCOPES[self.who])


# flow name -> whether ann (no scope) may run it to completion
FLOWS = {"plain": True, "direct": False, "nested": False, "fallback": False,
         "delegated": True}


def catalog(**options: Any) -> tuple[FlowServer, Who, list[AuditEvent]]:
    executor = FlowExecutor(FlowRegistry())
    for item in (search, reindex, failing):
        executor.register_tool(item)
    register = executor.registry.register_flow
    register(Flow("plain", "searches", [FlowStep("search")]))
    register(Flow("direct", "reindexes", [FlowStep("search"), FlowStep("reindex")]))
    register(Flow("inner", "reindexes", [FlowStep("reindex")], governance=HIDDEN))
    register(Flow("middle", "runs inner", [FlowStep(flow="inner")], governance=HIDDEN))
    register(Flow("nested", "reindexes two levels down",
                  [FlowStep("search"), FlowStep(flow="middle")]))
    register(Flow("fallback", "falls back to a reindex", [
        FlowStep("failing", on_error="fallback", fallback="reindex")]))
    register(Flow("delegated", "reindexes as the service", [
        FlowStep("search"), FlowStep("reindex")],
        delegations=[Delegation("reindex", "reindexing is a service chore")]))
    events: list[AuditEvent] = []
    who = Who()
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=SecurityConfig(authenticator=who, audit_hook=events.append),
                        **options)
    return server, who, events


async def every_answer(client: Client, name: str) -> dict[str, Any]:
    session = client.session
    return {
        "call": await answer(lambda: session.call_tool(name, {"query": "x"})),
        "read": await answer(lambda: session.read_resource(
            f"chainweaver://flows/{name}/schema")),
        "prompt": await answer(lambda: session.get_prompt(name, {"query": "x"})),
    }


@pytest.mark.parametrize("mode", ERAS)
async def test_each_caller_sees_exactly_the_flows_it_can_run(mode: str) -> None:
    server, who, _ = catalog()
    async with Client(server.fastmcp, mode=mode) as client:
        for caller, runnable in (("ann", {n for n, ok in FLOWS.items() if ok}),
                                 ("root", set(FLOWS))):
            who.who = caller
            assert {t.name for t in await client.list_tools()} == runnable
            assert {p.name for p in await client.list_prompts()} >= runnable
            listed = {str(r.uri) for r in await client.list_resources()}
            assert {u for u in listed if u.endswith("/schema")} == {
                f"chainweaver://flows/{name}/schema" for name in runnable}
            index = await client.read_resource("chainweaver://flows")
            for name in set(FLOWS) - runnable:
                assert f'"{name}"' not in index[0].text
            for name in runnable:  # every flow in the view runs to completion
                if name == "fallback":
                    continue  # needs root; ran below
                result = await client.call_tool(name, {"query": "x"})
                assert not result.is_error


@pytest.mark.parametrize("mode", ERAS)
async def test_a_flow_outside_the_view_answers_like_a_name_that_never_existed(
        mode: str) -> None:
    server, _, events = catalog()
    async with Client(server.fastmcp, mode=mode) as client:
        for name in ("direct", "nested", "fallback"):
            assert renamed(await every_answer(client, name), name, NEVER) == \
                await every_answer(client, NEVER)
    # To the audit (and every hook) too, the flow is no flow at all.
    calls = [e for e in events if e.kind == "tool" and e.name in ("direct", "nested")]
    assert calls and all(e.flow_name is None for e in calls)


@pytest.mark.parametrize("mode", ERAS)
async def test_a_policy_change_between_listing_and_calling(mode: str) -> None:
    server, who, _ = catalog()
    who.who = "root"
    async with Client(server.fastmcp, mode=mode) as client:
        assert "direct" in {t.name for t in await client.list_tools()}
        who.who = "ann"  # the grant goes after the list
        gone = await every_answer(client, "direct")
        assert renamed(gone, "direct", NEVER) == await every_answer(client, NEVER)


async def test_a_new_version_needing_a_grant_leaves_the_view_at_once() -> None:
    server, who, _ = catalog()
    async with Client(server.fastmcp) as client:
        assert "plain" in {t.name for t in await client.list_tools()}
        server.executor.registry.register_flow(Flow(
            "plain", "searches, now reindexing", [FlowStep("search"), FlowStep("reindex")],
            version="2.0.0"))
        # The registry change is applied before register_flow returns: the next request
        # answers from the new snapshot, where ann lacks the new step's grant.
        assert "plain" not in {t.name for t in await client.list_tools()}
        gone = await every_answer(client, "plain")
        assert renamed(gone, "plain", NEVER) == await every_answer(client, NEVER)
        who.who = "root"
        result = await client.call_tool("plain", {"query": "x"})
        assert result.meta["chainweaver"]["version"] == "2.0.0"


def test_exposure_report_and_inspect_show_grants_and_delegations() -> None:
    server, _, _ = catalog()
    report = {e.flow_name: e for e in server.exposure_report()}
    assert report["direct"].requires == Grants(frozenset({"catalog.admin"}))
    assert report["plain"].requires is None and report["plain"].delegations == ()
    assert report["delegated"].requires is None
    assert report["delegated"].delegations == (("reindex", "reindexing is a service chore"),)
    assert report["delegated"].to_dict()["delegations"] == {
        "reindex": "reindexing is a service chore"}
    assert report["nested"].to_dict()["requires"] == {"scopes": ["catalog.admin"],
                                                      "claims": {}}
    table = format_table(server)
    assert "Step grants" in table and "reindexing is a service chore" in table
    assert "scope 'catalog.admin'" in table


@pytest.mark.parametrize("namespace", [None, "cat"])
async def test_mounted_views_follow_step_grants(namespace: str | None) -> None:
    server, who, _ = catalog()
    parent = FastMCP("parent")
    server.mount_into(parent, namespace=namespace)
    prefix = "" if namespace is None else f"{namespace}_"
    async with Client(parent) as client:
        names = {t.name for t in await client.list_tools()}
        assert names == {prefix + n for n, ok in FLOWS.items() if ok}
        who.who = "root"
        assert {t.name for t in await client.list_tools()} == {prefix + n for n in FLOWS}


def test_a_server_without_any_grant_keeps_one_view_for_everybody() -> None:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(search)
    executor.registry.register_flow(Flow("plain", "searches", [FlowStep("search")]))
    server = FlowServer(executor)
    snapshot = server._provider.exposure.current
    assert snapshot.grant_claims is None
    views = server._provider.views
    one = views.of(snapshot, CallerIdentity("a", scopes=frozenset({"x"})))
    assert one is views.of(snapshot, CallerIdentity("b")) and not one.restricted
