"""Attacks on "one request, one admission" (issue 21).

The invariant under attack: a flow that governance or the caller's view hides is
absent from every primitive for that caller (not listed, callable, readable,
renderable or completable), indistinguishable from a name that never existed (same
error, same rate-limit budget, same audit shape), at every instant (while flows change
mid-request and mid-paging), on both protocol eras; and bad input never becomes
-32603. Cursors from other callers, lists or forgeries; the provider's own page cutting
(fast path) against FastMCP's (a transform on the server: slow path); nested requests
(resources_as_tools / prompts_as_tools); versioned requests; interleaved callers on one
session; registry changes between admission and serving; background tasks;
FlowServer.mount_into.

Everything is in memory. Each finding of the first attack round (mounted servers'
gates and views, pages with a mounted server, stale claims, cursors checked outside
the gate) is a test here that failed before its fix.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types
import pytest
from fastmcp import Client, FastMCP
from fastmcp.server.transforms import Namespace
from mcp import MCPError
from pydantic import BaseModel
from support.views import answer, renamed, schema_uri

from chainweaver import (
    Flow,
    FlowExecutor,
    FlowGovernance,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import (
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
    ServingConfig,
    visible_claim,
)
from chainweaver.mcp.live.cursors import LIST_AGAIN

pytestmark = pytest.mark.anyio
MODES = ["auto", "legacy"]  # 2026-07-28, 2025-11-25
NEVER = "zz_never_existed"
HIDDEN = "blue_1"  # a blue flow: outside red's view
VISIBLE = "red_1"
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read"))
def echo(text: str) -> Text:
    return Text(text=text)


@tool(safety=ToolSafetyContract("read"))
def shout(text: str) -> Text:
    return Text(text=text.upper())


def flow(team: str, index: int, *, prefix: str = "", version: str = "1.0.0",
         step: str = "echo") -> Flow:
    return Flow(f"{prefix}{team}_{index}", f"Flow {index} of {team}.", [FlowStep(step)],
                version=version, governance=FlowGovernance(owner=team))


def catalogue(flows: int = 4, *, prefix: str = "") -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    executor.register_tool(shout)
    for team in ("red", "blue"):
        for index in range(flows):
            executor.registry.register_flow(flow(team, index, prefix=prefix))
    return executor


class Callers:
    """The authenticator: the test says who calls; a caller sees its team's flows.
    ``who=None``: nobody is authenticated."""

    def __init__(self, who: str | None = "red") -> None:
        self.who = who

    def __call__(self, ctx: GateContext) -> CallerIdentity | None:
        if self.who is None:
            return None
        return identity(self.who)


def identity(who: str) -> CallerIdentity:
    return CallerIdentity(who, {"teams": [who]}, subject=who)


class Budgets:
    """A rate limiter that allows everything and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        self.asked.append((caller.id, name))
        return True


def served(flows: int = 4, *, page_size: int | None = None, callers: Callers | None = None,
           executor: FlowExecutor | None = None, **security: Any
           ) -> tuple[FlowServer, Callers, list[AuditEvent]]:
    events: list[AuditEvent] = []
    callers = callers or Callers()
    security.setdefault("authenticator", callers)
    security.setdefault("audit_hook", events.append)
    serving = security.pop("serving", {})
    server = FlowServer(executor or catalogue(flows), expose_schemas=True,
                        expose_prompts=True,
                        security=SecurityConfig(visible=visible_claim("teams"), **security),
                        serving=ServingConfig(page_size=page_size, **serving))
    return server, callers, events


def label(item: Any) -> str:
    uri = getattr(item, "uri", None)
    return str(uri) if uri is not None else item.name


def shape(event: AuditEvent) -> dict[str, Any]:
    fields = dict(vars(event))
    for timing in ("timestamp", "duration_ms"):
        fields[timing] = fields[timing] is not None
    fields["result_sha256"] = fields["result_sha256"] is not None
    return fields


async def primitives(client: Client, name: str, *, prefix: str = "",
                     meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A call, a read and a render of ``name``, answered (``prefix``: a Namespace's)."""
    session = client.session
    tool_name = f"{prefix}_{name}" if prefix else name
    uri = (f"chainweaver://{prefix}/flows/{name}/schema" if prefix else schema_uri(name))
    return {
        "call": await answer(lambda: session.call_tool(tool_name, {"text": "hi"}, meta=meta)),
        "read": await answer(lambda: session.read_resource(uri, meta=meta)),
        "render": await answer(lambda: session.get_prompt(tool_name, {"text": "hi"},
                                                          meta=meta)),
    }


async def pages(client: Client, method: str, key: str) -> list[list[str]]:
    """Every page of one list, by label."""
    result = await getattr(client, f"{method}_mcp")()
    seen = [[label(item) for item in getattr(result, key)]]
    while result.next_cursor:
        result = await getattr(client, f"{method}_mcp")(cursor=result.next_cursor)
        seen.append([label(item) for item in getattr(result, key)])
    return seen


async def error_of(request: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    with pytest.raises(MCPError) as raised:
        await request()
    return raised.value.error.model_dump()


LISTS = [("list_tools", "tools"), ("list_resources", "resources"),
         ("list_prompts", "prompts")]


# ----------------------------------------------------------------------- cursors


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("method", "key"), LISTS)
async def test_a_cursor_of_another_callers_view_is_refused_like_a_forged_one(
        mode: str, method: str, key: str) -> None:
    """Red's cursor handed to blue (same page position, same list length): refused
    exactly like a cursor nobody issued, and blue's own pages stay blue."""
    server, callers, _ = served(page_size=2)
    async with Client(server.fastmcp, mode=mode) as client:
        first = await getattr(client, f"{method}_mcp")()
        assert first.next_cursor
        callers.who = "blue"
        replayed = await error_of(
            lambda: getattr(client, f"{method}_mcp")(cursor=first.next_cursor))
        position = first.next_cursor.partition(".")[2]
        forged = await error_of(
            lambda: getattr(client, f"{method}_mcp")(cursor=f"{'ab' * 16}.{position}"))
        blue = [name for page in await pages(client, method, key) for name in page]
    assert replayed == forged == {"code": INVALID_PARAMS, "message": LIST_AGAIN,
                                  "data": None}
    assert blue and not any("red_" in name for name in blue)


@pytest.mark.parametrize("mode", MODES)
async def test_a_cursor_of_one_list_is_refused_on_another(mode: str) -> None:
    server, _, _ = served(page_size=2)
    async with Client(server.fastmcp, mode=mode) as client:
        cursor = (await client.list_tools_mcp()).next_cursor
        assert cursor
        on_prompts = await error_of(lambda: client.list_prompts_mcp(cursor=cursor))
        on_resources = await error_of(lambda: client.list_resources_mcp(cursor=cursor))
        on_templates = await answer(lambda: client.list_resource_templates_mcp(cursor=cursor))
    assert on_prompts == on_resources == {"code": INVALID_PARAMS, "message": LIST_AGAIN,
                                          "data": None}
    assert on_templates["error"]["code"] == INVALID_PARAMS


@pytest.mark.parametrize("position", [
    "999999999999",  # the largest offset accepted: past the end
    "9999999999999",  # one digit more: not a position
    "\u0663", "\uff15", "\u00b2", "1\u0660", "+2", " 2", "2 ", "-0", "0x2", "2.0", "",
    "2\x00", "\udc80",
])
async def test_positions_out_of_range_or_not_ascii_digits_never_break_the_server(
        position: str) -> None:
    server, _, _ = served(page_size=2)
    async with Client(server.fastmcp) as client:
        fingerprint = (await client.list_tools_mcp()).next_cursor.partition(".")[0]
        got = await answer(lambda: client.list_tools_mcp(cursor=f"{fingerprint}.{position}"))
        still = await client.list_tools_mcp()
    if "result" in got:
        # Only the huge ASCII offset and the empty position ("from the start") page.
        assert position in ("999999999999", "")
        expected = [] if position else [label(t) for t in still.tools]
        assert [t["name"] for t in got["result"]["tools"]] == expected
    else:
        assert got["error"]["code"] == INVALID_PARAMS
    assert len(still.tools) == 2


@pytest.mark.parametrize("mode", MODES)
async def test_a_page_builds_nothing_of_another_view(mode: str) -> None:
    """The fast path cuts red's pages from red's list: no component of a blue flow is
    ever built while red pages every list."""
    server, _, _ = served(flows=6, page_size=2)
    async with Client(server.fastmcp, mode=mode) as client:
        listed = {key: [n for page in await pages(client, method, key) for n in page]
                  for method, key in LISTS}
    built = server._provider.components.keys()
    assert built and not any("blue" in name for _, name in built)
    assert not any("blue" in name for names in listed.values() for name in names)
    assert [n for n in listed["tools"]] == [f"red_{i}" for i in range(6)]


@pytest.mark.parametrize("mode", MODES)
async def test_lists_of_two_views_of_one_shape_have_different_fingerprints(
        mode: str) -> None:
    """Red's and blue's lists have the same length and page boundaries; only names
    differ. Their cursors must differ (else red's cursor pages blue's list silently)."""
    server, callers, _ = served(page_size=2)
    async with Client(server.fastmcp, mode=mode) as client:
        red = (await client.list_tools_mcp()).next_cursor
        callers.who = "blue"
        blue = (await client.list_tools_mcp()).next_cursor
    assert red and blue and red != blue
    assert red.partition(".")[2] == blue.partition(".")[2]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("method", "key"), LISTS)
async def test_the_fast_path_lists_exactly_what_fastmcp_lists(
        mode: str, method: str, key: str) -> None:
    """Pages the provider cuts hold exactly the items FastMCP's own handler lists for
    the same caller (same fields, byte for byte)."""
    paged, _, _ = served(page_size=1000)
    whole, _, _ = served()
    async with Client(paged.fastmcp, mode=mode) as client:
        fast = (await getattr(client, f"{method}_mcp")()).model_dump(exclude_none=True)
    async with Client(whole.fastmcp, mode=mode) as client:
        slow = (await getattr(client, f"{method}_mcp")()).model_dump(exclude_none=True)
    # Each server marks its components with its own owner mark; nothing else differs.
    assert renamed(fast, paged._provider.owner, "OWNER") == renamed(
        slow, whole._provider.owner, "OWNER")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("method", "key"), LISTS)
async def test_the_slow_path_pages_only_the_callers_view(
        mode: str, method: str, key: str) -> None:
    """A Namespace on the server: FastMCP pages the whole list. Red's pages are red's,
    and red's cursor is blue's "list again"."""
    server, callers, _ = served(flows=5, page_size=2)
    server.fastmcp.add_transform(Namespace("shop"))
    async with Client(server.fastmcp, mode=mode) as client:
        red = [n for page in await pages(client, method, key) for n in page]
        cursor = (await getattr(client, f"{method}_mcp")()).next_cursor
        callers.who = "blue"
        refused = await error_of(lambda: getattr(client, f"{method}_mcp")(cursor=cursor))
    assert red and not any("blue" in name for name in red)
    assert len(red) == len(set(red))
    assert refused["code"] == INVALID_PARAMS


@pytest.mark.parametrize("inner", [
    "garbage", "\u0663", base64.urlsafe_b64encode(b'{"o": -1}').decode(),
    base64.urlsafe_b64encode(b'{"o": "2"}').decode(),
    base64.urlsafe_b64encode(b'{"o": 1e400}').decode(),
    base64.urlsafe_b64encode(b'{"o": ' + b"9" * 5000 + b"}").decode(),
    base64.urlsafe_b64encode(b'{"o": 100000000000000000000}').decode(),
    base64.urlsafe_b64encode(b"[]").decode(),
])
async def test_a_forged_inner_cursor_on_the_slow_path_is_never_internal(inner: str) -> None:
    server, _, _ = served(flows=5, page_size=2)
    server.fastmcp.add_transform(Namespace("shop"))
    async with Client(server.fastmcp) as client:
        fingerprint = (await client.list_tools_mcp()).next_cursor.partition(".")[0]
        got = await answer(lambda: client.list_tools_mcp(cursor=f"{fingerprint}.{inner}"))
        assert len((await client.list_tools_mcp()).tools) == 2
    if "error" in got:
        assert got["error"]["code"] == INVALID_PARAMS
    else:  # only an offset past the end pages
        assert got["result"]["tools"] == []


@pytest.mark.parametrize("cursor", ["zz.1", "abcd.x"])
async def test_a_malformed_cursor_is_refused_by_the_gate_first(cursor: str) -> None:
    budgets = Budgets()
    server, callers, events = served(page_size=2, rate_limiter=budgets)
    callers.who = None
    async with Client(server.fastmcp) as client:
        refused = await error_of(lambda: client.list_tools_mcp(cursor=cursor))
    assert refused["data"] == {"reason": "unauthenticated"}
    assert [e.reason for e in events] == ["unauthenticated"]


async def test_a_list_refused_for_its_cursor_is_not_audited_ok() -> None:
    server, callers, events = served(page_size=2)
    async with Client(server.fastmcp) as client:
        cursor = (await client.list_tools_mcp()).next_cursor
        callers.who = "blue"
        events.clear()
        await error_of(lambda: client.list_tools_mcp(cursor=cursor))
    completed = [e for e in events if e.phase == "completed"]
    assert completed and all(e.outcome != "ok" for e in completed), completed


# ------------------------------------------------------- hidden == never existed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("page_size", [None, 2])
async def test_a_hidden_flow_answers_like_a_name_that_never_existed(
        mode: str, page_size: int | None) -> None:
    budgets = Budgets()
    server, _, events = served(page_size=page_size, rate_limiter=budgets,
                               authorizer=lambda ctx: True)
    async with Client(server.fastmcp, mode=mode) as client:
        hidden, hidden_events, hidden_budgets = await _observed(
            client, events, budgets, lambda: primitives(client, HIDDEN))
        never, never_events, never_budgets = await _observed(
            client, events, budgets, lambda: primitives(client, NEVER))
        visible = await primitives(client, VISIBLE)
    assert renamed(hidden, HIDDEN, NEVER) == never
    assert renamed(hidden_events, HIDDEN, NEVER) == never_events
    assert hidden_budgets == never_budgets
    assert renamed(visible, VISIBLE, NEVER) != never


async def _observed(client: Client, events: list[AuditEvent], budgets: Budgets,
                    request: Callable[[], Awaitable[Any]]) -> tuple[Any, Any, Any]:
    events.clear()
    budgets.asked.clear()
    got = await request()
    # As plain JSON, so it compares with what renamed() gives.
    return json.loads(json.dumps((got, [shape(e) for e in events], budgets.asked)))


@pytest.mark.parametrize("mode", MODES)
async def test_behind_a_namespace_a_hidden_flow_answers_like_never(mode: str) -> None:
    budgets = Budgets()
    server, _, events = served(rate_limiter=budgets, authorizer=lambda ctx: True)
    server.fastmcp.add_transform(Namespace("shop"))
    async with Client(server.fastmcp, mode=mode) as client:
        hidden, hidden_events, hidden_budgets = await _observed(
            client, events, budgets, lambda: primitives(client, HIDDEN, prefix="shop"))
        never, never_events, never_budgets = await _observed(
            client, events, budgets, lambda: primitives(client, NEVER, prefix="shop"))
        visible = await primitives(client, VISIBLE, prefix="shop")
    assert renamed(hidden, HIDDEN, NEVER) == never
    assert renamed(hidden_events, HIDDEN, NEVER) == never_events
    assert hidden_budgets == never_budgets
    assert "result" in visible["call"] and "result" in visible["read"]


# ------------------------------------------------------------- nested requests


def tool_forms(**security: Any) -> tuple[FlowServer, Callers, list[AuditEvent]]:
    return served(serving={"resources_as_tools": True, "prompts_as_tools": True},
                  **security)


@pytest.mark.parametrize("mode", MODES)
async def test_the_read_resource_tool_reads_a_hidden_schema_like_a_missing_one(
        mode: str) -> None:
    budgets = Budgets()
    server, _, events = tool_forms(rate_limiter=budgets, authorizer=lambda ctx: True)
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session

        def read(name: str) -> Callable[[], Awaitable[Any]]:
            return lambda: session.call_tool("read_resource", {"uri": schema_uri(name)})

        hidden = await _observed(client, events, budgets, lambda: answer(read(HIDDEN)))
        never = await _observed(client, events, budgets, lambda: answer(read(NEVER)))
        visible = await answer(read(VISIBLE))
    assert renamed(hidden, HIDDEN, NEVER) == never
    assert never[0]["result"]["is_error"] is True
    assert visible["result"].get("is_error") is not True
    assert VISIBLE in json.dumps(visible)


@pytest.mark.parametrize("mode", MODES)
async def test_the_get_prompt_tool_renders_a_hidden_prompt_like_a_missing_one(
        mode: str) -> None:
    budgets = Budgets()
    server, _, events = tool_forms(rate_limiter=budgets, authorizer=lambda ctx: True)
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session

        def render(name: str) -> Callable[[], Awaitable[Any]]:
            return lambda: session.call_tool("get_prompt", {"name": name,
                                                            "arguments": {"text": "hi"}})

        hidden = await _observed(client, events, budgets, lambda: answer(render(HIDDEN)))
        never = await _observed(client, events, budgets, lambda: answer(render(NEVER)))
        visible = await answer(render(VISIBLE))
    assert renamed(hidden, HIDDEN, NEVER) == never
    assert never[0]["result"]["is_error"] is True
    assert visible["result"].get("is_error") is not True


@pytest.mark.parametrize("mode", MODES)
async def test_the_list_tools_of_tool_forms_list_only_the_view(mode: str) -> None:
    server, callers, _ = tool_forms()
    async with Client(server.fastmcp, mode=mode) as client:
        resources = await client.call_tool("list_resources", {})
        prompts = await client.call_tool("list_prompts", {})
        tools = [t.name for t in await client.list_tools()]
    text = json.dumps([resources.content[0].text, prompts.content[0].text, tools])
    assert "red_0" in text and "blue" not in text


# -------------------------------------------------------------------- versions


@pytest.mark.parametrize("mode", MODES)
async def test_a_version_that_does_not_match_answers_like_never(mode: str) -> None:
    """A hidden flow asked for at its very version, a visible one at another version,
    and a name that never existed: one answer, one audit shape, one budget."""
    budgets = Budgets()
    server, _, events = served(rate_limiter=budgets, authorizer=lambda ctx: True)
    async with Client(server.fastmcp, mode=mode) as client:
        answers = {}
        for name, version in ((HIDDEN, "1.0.0"), (HIDDEN, "2.0.0"), (NEVER, "1.0.0"),
                              (VISIBLE, "2.0.0")):
            meta = {"fastmcp": {"version": version}}
            got = await _observed(client, events, budgets, lambda n=name, m=meta:
                                  primitives(client, n, meta=m))
            answers[(name, version)] = renamed(got, name, NEVER)
        right = await primitives(client, VISIBLE, meta={"fastmcp": {"version": "1.0"}})
    never = answers[(NEVER, "1.0.0")]
    assert answers[(HIDDEN, "1.0.0")] == answers[(HIDDEN, "2.0.0")] == never
    assert answers[(VISIBLE, "2.0.0")][0] == never[0]  # the answer itself
    assert "result" in right["call"] and not right["call"]["result"].get("is_error")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version", [5, {"eq": "1.0.0"}, ["1.0.0"], "", "\x00", "1" * 5000,
                                     "not a version", ">=1.0.0", "1.0.0\udc80"])
async def test_a_malformed_version_is_never_internal(mode: str, version: Any) -> None:
    server, _, _ = served()
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session
        meta = {"fastmcp": {"version": version}}
        for name in (VISIBLE, HIDDEN, NEVER):
            got = await answer(lambda n=name: session.call_tool(n, {"text": "hi"},
                                                                 meta=meta))
            if "error" in got:
                assert got["error"]["code"] not in (INTERNAL_ERROR,), got
        assert not (await client.call_tool(VISIBLE, {"text": "hi"})).is_error


# ----------------------------------------------------------------- concurrency


class Barrier:
    """Holds each arriving request until ``parties`` have arrived."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.all_here = anyio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self.all_here.set()
        with anyio.fail_after(5):
            await self.all_here.wait()


@pytest.mark.parametrize("mode", MODES)
async def test_interleaved_calls_of_two_callers_on_one_session_keep_their_views(
        mode: str) -> None:
    """Four calls in flight on one session at once, two callers: each call is admitted,
    held in the authorizer until all four are, then served in its own caller's view."""
    who_calls = {"red_0": "red", "blue_0": "red", "blue_2": "blue", "red_2": "blue"}
    barrier = Barrier(len(who_calls))

    def authenticate(ctx: GateContext) -> CallerIdentity:
        return identity(who_calls.get(ctx.name, "red"))  # (the client lists too)

    async def authorize(ctx: GateContext) -> bool:
        await barrier.wait()
        return True

    server, _, _ = served(authenticator=authenticate, authorizer=authorize)
    got: dict[str, Any] = {}
    async with Client(server.fastmcp, mode=mode) as client:
        async def call(name: str) -> None:
            got[name] = await answer(lambda: client.session.call_tool(name, {"text": name}))

        async with anyio.create_task_group() as group:
            for name in who_calls:
                group.start_soon(call, name)
    for name, who in who_calls.items():
        result = got[name]["result"]
        if name.startswith(who):
            assert result.get("is_error") is not True, (name, result)
            assert result["structured_content"] == {"text": name}
        else:
            assert result["is_error"] is True
            assert result["content"][0]["text"] == f"Unknown tool: {name!r}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("page_size", [None, 2])
async def test_interleaved_lists_of_two_callers_never_mix_views(
        mode: str, page_size: int | None) -> None:
    order = ["red", "blue", "red", "blue"]
    barrier = Barrier(len(order))
    arrivals: list[str] = []

    async def authenticate(ctx: GateContext) -> CallerIdentity:
        who = order[len(arrivals)]
        arrivals.append(who)
        await barrier.wait()
        return identity(who)

    server, _, _ = served(authenticator=authenticate, page_size=page_size)
    listed: list[list[str]] = []
    async with Client(server.fastmcp, mode=mode) as client:
        async def list_once() -> None:
            result = await client.list_tools_mcp()
            listed.append([t.name for t in result.tools])

        async with anyio.create_task_group() as group:
            for _ in order:
                group.start_soon(list_once)
    teams = sorted({name.split("_")[0] for name in names} for names in listed)
    assert sorted(map(sorted, teams)) == [["blue"], ["blue"], ["red"], ["red"]]


def _changer(change: Callable[[], None], when: str) -> Callable[[GateContext], bool]:
    """A hook that makes ``change`` to the registry while the gate admits the request
    named ``when`` (once)."""
    done: list[bool] = []

    def hook(ctx: GateContext, *rest: Any) -> bool:
        if ctx.name == when and not done:
            done.append(True)
            change()
        return True

    return hook


class ChangingLimiter:
    def __init__(self, change: Callable[[], None], when: str) -> None:
        self.hook = _changer(change, when)

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        return self.hook(GateContext("tool", name, None, None, {}))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hook", ["authorizer", "rate_limiter"])
@pytest.mark.parametrize("change", ["new_version", "archive", "unregister", "re_owned"])
async def test_a_change_between_admission_and_serving_never_serves_another_version(
        mode: str, hook: str, change: str) -> None:
    """While the gate admits a call of red_0 1.0.0 (echo), the registry changes: a 2.0.0
    that shouts, the flow archived or unregistered, or a 2.0.0 owned by blue. The call
    serves exactly 1.0.0 (the admitted snapshot) or is refused; never 2.0.0, never
    -32603."""
    executor = catalogue()
    registry = executor.registry

    def make_change() -> None:
        if change == "new_version":
            registry.register_flow(flow("red", 0, version="2.0.0", step="shout"))
        elif change == "archive":
            registry.set_lifecycle("red_0", "archived", version="1.0.0")
        elif change == "unregister":
            registry.unregister("red_0")
        else:
            registry.register_flow(Flow("red_0", "Now blue's.", [FlowStep("shout")],
                                        version="2.0.0",
                                        governance=FlowGovernance(owner="blue")))

    hooks: dict[str, Any] = (
        {"authorizer": _changer(make_change, "red_0")} if hook == "authorizer"
        else {"rate_limiter": ChangingLimiter(make_change, "red_0")})
    server, _, _ = served(executor=executor, **hooks)
    async with Client(server.fastmcp, mode=mode) as client:
        got = await answer(lambda: client.session.call_tool("red_0", {"text": "hi"}))
        after = await answer(lambda: client.session.call_tool("red_0", {"text": "hi"}))
    if "error" in got:
        assert got["error"]["code"] != INTERNAL_ERROR, got
    else:
        result = got["result"]
        text = json.dumps(result)
        assert "HI" not in text, result  # never the 2.0.0 that shouts
        if not result.get("is_error"):
            assert result["structured_content"] == {"text": "hi"}
    # The next request sees the change.
    if change == "new_version":
        assert after["result"]["structured_content"] == {"text": "HI"}
    else:
        assert after["result"]["is_error"] is True
        assert after["result"]["content"][0]["text"] == "Unknown tool: 'red_0'"


@pytest.mark.parametrize("mode", MODES)
async def test_a_change_while_a_page_is_admitted_serves_the_pinned_list(mode: str) -> None:
    """A red flow added while the gate admits red's first page: that page is of the
    pinned list (the new flow is not on it), and the next page asks to list again."""
    executor = catalogue()
    registry = executor.registry
    limiter = ChangingLimiter(lambda: registry.register_flow(flow("red", 0, prefix="a")),
                              "tools/list")
    server, _, _ = served(executor=executor, page_size=2, rate_limiter=limiter)
    async with Client(server.fastmcp, mode=mode) as client:
        first = await client.list_tools_mcp()
        assert [t.name for t in first.tools] == ["red_0", "red_1"]
        again = await error_of(lambda: client.list_tools_mcp(cursor=first.next_cursor))
        fresh = [t.name for t in (await client.list_tools_mcp()).tools]
    assert again["message"] == LIST_AGAIN
    assert fresh == ["ared_0", "red_0"]


# ----------------------------------------------------------------- mount_into


def _child(authenticator: Any) -> FlowServer:
    return FlowServer(catalogue(2, prefix="c_"), expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(authenticator=authenticator))


def _nobody(ctx: GateContext) -> None:
    return None


@pytest.mark.parametrize("mode", MODES)
async def test_mount_into_a_hookless_flow_server_keeps_the_childs_authenticator(
        mode: str) -> None:
    child = _child(_nobody)
    parent = FlowServer(catalogue(2, prefix="p_"))
    child.mount_into(parent.fastmcp)
    async with Client(parent.fastmcp, mode=mode) as client:
        call = await answer(lambda: client.session.call_tool("c_red_0", {"text": "hi"}))
        tools = await answer(lambda: client.session.list_tools())
    assert "error" in call and "c_red_0" not in json.dumps(tools), (call, tools)
    assert call["error"]["data"] == {"reason": "unauthenticated"}


@pytest.mark.parametrize("mode", MODES)
async def test_mount_into_a_gated_flow_server_keeps_the_childs_authenticator(
        mode: str) -> None:
    child = _child(_nobody)
    parent = FlowServer(catalogue(2, prefix="p_"),
                        security=SecurityConfig(authenticator=lambda ctx: identity("red")))
    child.mount_into(parent.fastmcp)
    async with Client(parent.fastmcp, mode=mode) as client:
        call = await answer(lambda: client.session.call_tool("c_red_0", {"text": "hi"}))
    assert "error" in call, call  # the child's flow ran for a caller it refuses
    assert call["error"]["data"] == {"reason": "unauthenticated"}


@pytest.mark.parametrize("mode", MODES)
async def test_mount_into_a_plain_parent_keeps_the_childs_authenticator(mode: str) -> None:
    child = _child(_nobody)
    parent = FastMCP("parent")
    child.mount_into(parent, namespace="team")
    async with Client(parent, mode=mode) as client:
        call = await answer(lambda: client.session.call_tool("team_c_red_0", {"text": "hi"}))
        tools = await answer(lambda: client.session.list_tools())
    assert call["error"]["data"] == {"reason": "unauthenticated"}
    assert tools["error"]["data"] == {"reason": "unauthenticated"}


@pytest.mark.parametrize("mode", MODES)
async def test_mounted_hidden_flows_answer_like_never(mode: str) -> None:
    child, _, _ = served()
    parent = FastMCP("parent")
    child.mount_into(parent, namespace="team")
    async with Client(parent, mode=mode) as client:
        hidden = await primitives(client, HIDDEN, prefix="team")
        never = await primitives(client, NEVER, prefix="team")
        tools = [t.name for t in await client.list_tools()]
    assert renamed(hidden, HIDDEN, NEVER) == never
    assert "team_red_0" in tools and not any("blue" in name for name in tools)


@pytest.mark.parametrize("mode", MODES)
async def test_mounted_flows_in_the_callers_view_are_served(mode: str) -> None:
    child, _, events = served()
    parent = FastMCP("parent")
    child.mount_into(parent, namespace="team")
    async with Client(parent, mode=mode) as client:
        tools = [t.name for t in await client.list_tools()]
        visible = await primitives(client, VISIBLE, prefix="team")
    assert f"team_{VISIBLE}" in tools
    assert visible["call"]["result"]["structured_content"] == {"text": "hi"}, visible
    assert "result" in visible["read"] and "result" in visible["render"], visible
    assert [(e.kind, e.flow_name) for e in events if e.phase == "decision"][-3:] == [
        ("tool", VISIBLE), ("resource", VISIBLE), ("prompt", VISIBLE)]


def _not_blue(caller: CallerIdentity, flow: Flow) -> bool:
    return flow.governance.owner not in caller.claims.get("deny", [])


class Refuses:
    """A rate limiter whose budget is spent."""

    def acquire(self, caller: CallerIdentity, name: str) -> bool:
        return False


@pytest.mark.parametrize("mode", MODES)
async def test_mounted_hidden_flows_spend_the_budget_like_never(mode: str) -> None:
    from chainweaver.mcp import Visibility

    events: list[AuditEvent] = []
    child = FlowServer(catalogue(), expose_schemas=True, expose_prompts=True,
                       security=SecurityConfig(
                           authenticator=lambda ctx: CallerIdentity("red", {"deny": ["blue"]}),
                           visible=Visibility(_not_blue, claims=("deny",)),
                           rate_limiter=Refuses(), audit_hook=events.append))
    parent = FastMCP("parent")
    child.mount_into(parent)
    async with Client(parent, mode=mode) as client:
        events.clear()
        hidden = json.loads(json.dumps((await primitives(client, HIDDEN),
                                        [shape(e) for e in events])))
        events.clear()
        never = json.loads(json.dumps((await primitives(client, NEVER),
                                       [shape(e) for e in events])))
    assert renamed(hidden, HIDDEN, NEVER) == never


@pytest.mark.parametrize("mode", MODES)
async def test_a_flow_server_with_pages_lists_a_mounted_flow_server_exactly(
        mode: str) -> None:
    red = Callers("red")
    child = FlowServer(catalogue(3, prefix="c_"),
                       security=SecurityConfig(authenticator=red,
                                               visible=visible_claim("teams")))
    parent = FlowServer(catalogue(5, prefix="p_"),
                        security=SecurityConfig(authenticator=red,
                                                visible=visible_claim("teams")),
                        serving=ServingConfig(page_size=2))
    child.mount_into(parent.fastmcp)
    async with Client(parent.fastmcp, mode=mode) as client:
        listed = await pages(client, "list_tools", "tools")
    names = [name for page in listed for name in page]
    assert all(len(page) <= 2 for page in listed), listed
    assert sorted(names) == sorted([*(f"c_red_{i}" for i in range(3)),
                                    *(f"p_red_{i}" for i in range(5))])


# -------------------------------------------------------------- stale grants


@pytest.mark.parametrize("mode", MODES)
async def test_a_caller_whose_claims_change_sees_its_new_view(mode: str) -> None:
    """A caller's claims cannot change behind its view's back (they are read-only); an
    authenticator that hands out new claims hands out a new caller, and it sees the
    view those claims give."""
    caller = CallerIdentity("pat", {"teams": ["red"]}, subject="pat")
    with pytest.raises(TypeError):
        caller.claims["teams"] = ["blue"]  # type: ignore[index]
    current = {"caller": caller}
    server, _, _ = served(authenticator=lambda ctx: current["caller"])
    async with Client(server.fastmcp, mode=mode) as client:
        before = [t.name for t in await client.list_tools()]
        current["caller"] = CallerIdentity("pat", {"teams": ["blue"]}, subject="pat")
        after = [t.name for t in await client.list_tools()]
        call = await client.call_tool("red_0", {"text": "hi"}, raise_on_error=False)
    assert before == [f"red_{i}" for i in range(4)]
    assert after == [f"blue_{i}" for i in range(4)], after
    assert call.is_error


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", [
    "chainweaver://flows/{}/schema?x=1", "chainweaver://flows/{}/schema#top",
    "CHAINWEAVER://FLOWS/{}/schema", "chainweaver://flows/{}/schema/",
    "chainweaver://flows/./{}/schema", "chainweaver://flows/{}%2Fschema",
    "chainweaver://flows/{}/../{}/schema", "chainweaver://flows/{}/schema\x00",
])
async def test_odd_spellings_of_a_hidden_schema_uri_answer_like_never(
        mode: str, form: str) -> None:
    server, _, _ = served()
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session
        hidden = await answer(lambda: session.read_resource(form.format(HIDDEN, HIDDEN)))
        never = await answer(lambda: session.read_resource(form.format(NEVER, NEVER)))
    assert renamed(hidden, HIDDEN, NEVER) == never
    assert "error" in never and never["error"]["code"] != INTERNAL_ERROR, never


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("suffix", ["", " ", "\x00", "\u200b", "/x", "\u00e9" * 2000])
async def test_odd_names_of_a_hidden_flow_answer_like_never(mode: str, suffix: str) -> None:
    server, _, _ = served()
    async with Client(server.fastmcp, mode=mode) as client:
        hidden = await primitives(client, HIDDEN + suffix)
        never = await primitives(client, NEVER + suffix)
    assert renamed(hidden, HIDDEN, NEVER) == never
    for got in never.values():
        assert "result" in got or got["error"]["code"] != INTERNAL_ERROR, got


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arguments", [{"nope": "x"}, {}, {"text": "\udc80"}])
async def test_a_hidden_prompt_with_bad_arguments_answers_like_never(
        mode: str, arguments: dict[str, Any]) -> None:
    server, _, _ = served()
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session
        hidden = await answer(lambda: session.get_prompt(HIDDEN, arguments))
        never = await answer(lambda: session.get_prompt(NEVER, arguments))
        visible = await answer(lambda: session.get_prompt(VISIBLE, arguments))
    assert renamed(hidden, HIDDEN, NEVER) == never
    for got in (hidden, never, visible):
        assert "result" in got or got["error"]["code"] != INTERNAL_ERROR, got


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("argument", ["text", "", "\udc80", "x" * 10000])
async def test_completing_a_hidden_prompt_answers_like_never(mode: str, argument: str
                                                            ) -> None:
    server, _, _ = served()
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session

        def complete(name: str) -> Callable[[], Awaitable[Any]]:
            return lambda: session.complete(mcp_types.PromptReference(name=name),
                                            {"name": argument, "value": ""})

        hidden = await answer(complete(HIDDEN))
        never = await answer(complete(NEVER))
    assert renamed(hidden, HIDDEN, NEVER) == never
    assert "result" in never or never["error"]["code"] != INTERNAL_ERROR


# ---------------------------------------------------------------------- tasks


def _task_server() -> tuple[FlowServer, Callers]:
    """A task server (tests/mcp/tasks/test_tasks.py's flows) whose view is per subject."""
    from chainweaver.mcp import ExposurePolicy, Visibility

    from ..tasks.test_tasks import executor as task_executor

    callers = Callers("sam")
    sees = {"sam": ["report", "quick"], "olga": ["lookup_order"]}
    rule = Visibility(lambda caller, f: f.name in sees.get(caller.claims.get("sub", ""), []),
                      claims=("sub",))
    server = FlowServer(task_executor(), tasks="memory://",
                        policy=ExposurePolicy(allowed_side_effects=["read", "write"]),
                        security=SecurityConfig(authenticator=lambda ctx: CallerIdentity(
                            callers.who or "", {"sub": callers.who}, subject=callers.who),
                            visible=rule))
    return server, callers


@pytest.mark.tasks
async def test_a_hidden_flow_asked_for_as_a_task_answers_like_never() -> None:
    from fastmcp_tasks import call_tool_task

    server, callers = _task_server()
    callers.who = "olga"
    async with Client(server.fastmcp) as client:
        async def as_task(name: str) -> dict[str, Any]:
            try:
                task = await call_tool_task(client, name, {"n": 1})
                return {"result": (await task.result()).model_dump(exclude_none=True)}
            except MCPError as error:
                return {"error": error.error.model_dump()}
            except Exception as error:  # the client's own "tool failed"
                return {"raised": type(error).__name__, "text": str(error)}

        hidden = await as_task("report")
        never = await as_task(NEVER)
    assert renamed(hidden, "report", NEVER) == never


@pytest.mark.tasks
@pytest.mark.parametrize("mode", MODES)
async def test_the_task_runner_is_a_name_that_never_existed(mode: str) -> None:
    from chainweaver.mcp.tasks.runner import RUNNER_NAME

    server, _ = _task_server()
    async with Client(server.fastmcp, mode=mode) as client:
        session = client.session
        runner = await answer(lambda: session.call_tool(RUNNER_NAME, {"tool": "report"}))
        never = await answer(lambda: session.call_tool(NEVER, {"tool": "report"}))
        tools = [t.name for t in await client.list_tools()]
    assert renamed(runner, RUNNER_NAME, NEVER) == never
    assert RUNNER_NAME not in tools
