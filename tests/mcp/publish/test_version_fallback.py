"""A refused newest version never falls back to an older one (issue 32, item 3).

FastMCP looks for other versions of a name when its newest is refused: 4.1 when the
newest is disabled, 4.2 also when a lookup answers nothing (it lists the name's
candidates and looks each up at its own version, highest first), for tools, resources
and prompts alike. The suite runs on both lines (the lanes with the tasks extra install
4.1, the newest lane 4.2), and :func:`test_this_fastmcp_line_falls_back_as_expected`
shows which behaviour the line under test has.

Whatever the line, a caller whose governance (the flow's lifecycle, a shared decision)
or view (a ``visible`` rule, by version or by owner) refuses a flow's newest version is
answered exactly like a name that never existed, in every primitive, by name and at
either version, standing alone, behind a ``Namespace`` and mounted, and no version
runs; an older version is served only where it is itself published to that caller.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import fastmcp
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.auth import require_scopes
from fastmcp.server.transforms import Namespace
from fastmcp.utilities.versions import VersionSpec
from pydantic import BaseModel
from support.views import answer, renamed

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
from chainweaver.governance.overlay import GovernanceOverlay
from chainweaver.governance.state import Action, Decision, SharedState
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    visible_claim,
)
from chainweaver.versions import version_key

pytestmark = pytest.mark.anyio
MODES = ["auto", "legacy"]  # 2026-07-28, 2025-11-25
FLOW = "report"
NEVER = "zz_never_existed"
FALLS_BACK_WHEN_REFUSED = version_key(fastmcp.__version__) >= version_key("4.2")
RAN: list[str] = []  # the version of every run


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read"))
def report_v1(text: str) -> Text:
    RAN.append("1.0.0")
    return Text(text=f"v1 {text}")


@tool(safety=ToolSafetyContract("read"))
def report_v2(text: str) -> Text:
    RAN.append("2.0.0")
    return Text(text=f"v2 {text}")


def versions(newest_owner: str = "red",
             newest_lifecycle: FlowLifecycle = FlowLifecycle.ACTIVE) -> FlowExecutor:
    """``report`` at 1.0.0 (red's, active) and 2.0.0, each running its own tool."""
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(report_v1)
    executor.register_tool(report_v2)
    for version, owner, lifecycle in (("1.0.0", "red", FlowLifecycle.ACTIVE),
                                      ("2.0.0", newest_owner, newest_lifecycle)):
        executor.registry.register_flow(Flow(
            FLOW, f"The report, {version}.", [FlowStep(f"report_v{version[0]}")],
            version=version, governance=FlowGovernance(owner=owner, lifecycle=lifecycle)))
    return executor


def shared(action: Action) -> Callable[[FlowExecutor], None]:
    """Apply a shared-governance decision on version 2.0.0, as every replica does."""
    def apply(executor: FlowExecutor) -> None:
        GovernanceOverlay(executor.registry).apply(SharedState(1, {
            FLOW: Decision(versions={"2.0.0": action})}))
    return apply


def hide_version_two(caller: CallerIdentity, flow: Flow) -> bool:
    return flow.version != "2.0.0"


class Refusal:
    """How the newest version is refused to the caller ``red``."""

    def __init__(self, name: str, executor: Callable[[], FlowExecutor],
                 govern: Callable[[FlowExecutor], None] | None = None,
                 visible: Any = None) -> None:
        self.name = name
        self.executor = executor
        self.govern = govern
        self.visible = visible

    def __repr__(self) -> str:
        return self.name

    def server(self, hooks: Hooks) -> FlowServer:
        executor = self.executor()
        if self.govern is not None:
            self.govern(executor)
        return FlowServer(executor, expose_schemas=True, expose_prompts=True,
                          security=hooks.security(self.visible))


REFUSALS = [
    Refusal("archived", lambda: versions(newest_lifecycle=FlowLifecycle.ARCHIVED)),
    Refusal("draft", lambda: versions(newest_lifecycle=FlowLifecycle.DRAFT)),
    Refusal("shared_archived", versions, govern=shared("archived")),
    Refusal("hidden_by_version", versions, visible=hide_version_two),
    Refusal("hidden_by_owner", lambda: versions(newest_owner="blue"),
            visible=visible_claim("teams")),
]


class Hooks:
    """The caller ``red`` (team red), a limiter and an audit that remember."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []
        self.budgets: list[tuple[str, str]] = []

    def authenticate(self, ctx: GateContext) -> CallerIdentity:
        return CallerIdentity("red", {"teams": ["red"]}, subject="red")

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        self.budgets.append((caller.id, name))
        return True

    def security(self, visible: Any = None) -> SecurityConfig:
        return SecurityConfig(authenticator=self.authenticate, rate_limiter=self,
                              authorizer=lambda ctx: True, audit_hook=self.events.append,
                              visible=visible)


def standalone(server: FlowServer) -> tuple[FastMCP, str]:
    return server.fastmcp, ""


def namespaced(server: FlowServer) -> tuple[FastMCP, str]:
    server.fastmcp.add_transform(Namespace("shop"))
    return server.fastmcp, "shop"


def mounted(server: FlowServer) -> tuple[FastMCP, str]:
    parent = FastMCP("gateway")
    server.mount_into(parent, namespace="shop")
    return parent, "shop"


async def primitives(client: Client, name: str, prefix: str,
                     version: str | None) -> dict[str, Any]:
    """A call, a schema read and a render of ``name`` (at ``version``, if given)."""
    session = client.session
    meta = {"fastmcp": {"version": version}} if version is not None else None
    tool_name = f"{prefix}_{name}" if prefix else name
    uri = f"chainweaver://{prefix}/flows/{name}/schema" if prefix \
        else f"chainweaver://flows/{name}/schema"
    return {
        "call": await answer(lambda: session.call_tool(tool_name, {"text": "hi"}, meta=meta)),
        "read": await answer(lambda: session.read_resource(uri, meta=meta)),
        "render": await answer(lambda: session.get_prompt(tool_name, {"text": "hi"},
                                                          meta=meta)),
    }


def shape(event: AuditEvent) -> dict[str, Any]:
    fields = dict(vars(event))
    for varying in ("timestamp", "duration_ms", "result_sha256"):
        fields[varying] = fields[varying] is not None
    return fields


async def observed(client: Client, hooks: Hooks, name: str, prefix: str,
                   version: str | None) -> Any:
    """What the client, the audit and the limiter saw of ``name``'s primitives, as
    they would read about :data:`NEVER`."""
    hooks.events.clear()
    hooks.budgets.clear()
    got = await primitives(client, name, prefix, version)
    seen = json.loads(json.dumps([got, [shape(e) for e in hooks.events], hooks.budgets]))
    return renamed(seen, name, NEVER)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compose", [standalone, namespaced, mounted])
@pytest.mark.parametrize("refusal", REFUSALS, ids=repr)
async def test_a_refused_newest_version_never_falls_back_to_an_older_one(
        mode: str, compose: Callable[[FlowServer], tuple[FastMCP, str]],
        refusal: Refusal) -> None:
    hooks = Hooks()
    target, prefix = compose(refusal.server(hooks))
    RAN.clear()
    async with Client(target, mode=mode) as client:
        listed = [t.name for t in await client.list_tools()]
        never = await observed(client, hooks, NEVER, prefix, None)
        answers = {version: await observed(client, hooks, FLOW, prefix, version)
                   for version in (None, "1.0.0", "2.0.0", "1")}
    assert not any(FLOW in name for name in listed)
    for version, got in answers.items():
        assert got == never, version
    assert "Unknown tool" in json.dumps(never[0]["call"])
    assert RAN == []  # neither version ran


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("action", "served"), [("withdrawn", "1.0.0"),
                                                ("deprecated", "2.0.0"), (None, "2.0.0")])
async def test_only_the_version_published_to_the_caller_is_served(
        mode: str, action: Action | None, served: str) -> None:
    """A withdrawn newest leaves the older version the one published: that one is
    served. A deprecated newest stays published (the older one is never served)."""
    hooks = Hooks()
    executor = versions()
    if action is not None:
        shared(action)(executor)
    server = FlowServer(executor, expose_schemas=True, expose_prompts=True,
                        security=hooks.security())
    other = "1.0.0" if served == "2.0.0" else "2.0.0"
    RAN.clear()
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool(FLOW, {"text": "hi"})
        schema = json.loads((await client.read_resource(
            f"chainweaver://flows/{FLOW}/schema"))[0].text)
        at_other = await answer(lambda: client.session.call_tool(
            FLOW, {"text": "hi"}, meta={"fastmcp": {"version": other}}))
    assert result.structured_content == {"text": f"v{served[0]} hi"}
    assert schema["version"] == served
    assert at_other["result"]["is_error"] is True
    assert at_other["result"]["content"][0]["text"] == f"Unknown tool: {FLOW!r}"
    assert RAN == [served]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("published", [True, False])
async def test_an_older_version_another_server_publishes_is_served_only_where_published(
        mode: str, published: bool) -> None:
    """Two FlowServers in one parent, both naming ``report``: the newest (2.0.0, blue's)
    is outside red's view; the older (1.0.0 on another server) is served to red only
    when that server publishes it to red, and is then admitted by that server alone."""
    newest_hooks, older_hooks = Hooks(), Hooks()
    newest = FlowServer(versions(newest_owner="blue"),
                        security=newest_hooks.security(visible_claim("teams")))
    older_executor = FlowExecutor(FlowRegistry())
    older_executor.register_tool(report_v1)
    older_executor.registry.register_flow(Flow(
        FLOW, "The report, 1.0.0.", [FlowStep("report_v1")], version="1.0.0",
        governance=FlowGovernance(owner="red" if published else "green")))
    older = FlowServer(older_executor, security=older_hooks.security(visible_claim("teams")))
    parent = FastMCP("gateway")
    newest.mount_into(parent)
    older.mount_into(parent)
    RAN.clear()
    async with Client(parent, mode=mode) as client:
        newest_hooks.events.clear()
        older_hooks.events.clear()
        got = await answer(lambda: client.session.call_tool(FLOW, {"text": "hi"}))
    calls = [(e.flow_version, e.decision) for hooks in (newest_hooks, older_hooks)
             for e in hooks.events if e.kind == "tool" and e.phase == "decision"]
    if published:
        assert got["result"]["structured_content"] == {"text": "v1 hi"}
        assert RAN == ["1.0.0"]
        assert [e.flow_version for e in newest_hooks.events if e.kind == "tool"] == []
        assert calls == [("1.0.0", "allowed")]
    else:
        assert got["result"]["is_error"] is True
        assert got["result"]["content"][0]["text"] == f"Unknown tool: {FLOW!r}"
        assert RAN == []


async def test_this_fastmcp_line_falls_back_as_expected() -> None:
    """The machinery the tests above withstand: a plain FastMCP server whose newest
    version of a tool is refused by ``auth`` serves the older one on 4.2, and answers
    "unknown" on 4.1; a disabled newest falls back on both lines."""
    plain = FastMCP("plain")

    @plain.tool(name="t", version="1.0")
    def older() -> str:
        return "older"

    @plain.tool(name="t", version="2.0", auth=require_scopes("beta"))
    def newer() -> str:
        return "newer"

    @plain.tool(name="u", version="1.0")
    def older_u() -> str:
        return "older"

    @plain.tool(name="u", version="2.0")
    def newer_u() -> str:
        return "newer"

    plain.disable(names={"u"}, version=VersionSpec(eq="2.0"))
    async with Client(plain) as client:
        refused = await client.call_tool("t", {}, raise_on_error=False)
        disabled = await client.call_tool("u", {}, raise_on_error=False)
    expected = "older" if FALLS_BACK_WHEN_REFUSED else "Unknown tool: 't'"
    assert refused.content[0].text == expected
    assert disabled.content[0].text == "older"
