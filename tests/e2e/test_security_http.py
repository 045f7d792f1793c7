"""The gate, the exposure filter and hostile wire input, over streamable HTTP.

``tests/test_mcp_gate.py`` covers the gate's logic in memory; here the same guarantees
are checked on the wire, against ``tests/servers/hardened_server.py`` subprocesses:
bearer tokens in headers, refusals on all three primitives carrying only a reason
code, every decision in the JSONL audit file, broken hooks that neither crash the
server nor leak, and answers for excluded names identical, byte for byte, to those for
names that never existed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp import MCPError
from mcp.shared.inbound import encode_header_value
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY
from mcp_types.version import LATEST_MODERN_VERSION
from support.catalogue import EXCLUDED, build_catalogue
from support.procs import free_port, stop, wait_until_listening

from chainweaver.mcp import GATE_REFUSED, FlowServer
from chainweaver.mcp.gate.echo import bounded

SERVER_SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "hardened_server.py"
sys.path.insert(0, str(SERVER_SCRIPT.parent))
from hardened_server import SECRET  # noqa: E402

LEGACY = "2025-11-25"
RATE_LIMIT = 5
# Callers of the gated server, one per test so rate budgets never interfere.
CALLERS = ["alice", "carol", "mallory-auto", "mallory-legacy", "erin"] + [
    f"{hook}-{mode}" for hook in ("authenticator", "authorizer", "audit")
    for mode in ("slow", "fail")]
FORBIDDEN = ["mallory-auto", "mallory-legacy"]
EXCLUDED_NAMES = sorted(name for name, why in EXCLUDED.items() if why)
NEVER = "zz_never_existed"
NAME_KEYS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
RESULT_TYPES: dict[str, Any] = {"tools/call": mcp_types.CallToolResult,
                                "prompts/get": mcp_types.GetPromptResult,
                                "resources/read": mcp_types.ReadResourceResult}


def token(caller: str) -> str:
    return f"tok-{caller}-7f3a"


def start(directory: Path, *options: str) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    log = directory / f"server-{port}.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), "--port", str(port), *options],
            stdout=output, stderr=subprocess.STDOUT,
        )
    return process, port, log


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A gated server (tokens, rate limit, authorizer, audit, breakable hooks) and an
    open one, started together."""
    directory = tmp_path_factory.mktemp("security-http")
    audit = directory / "audit.jsonl"
    audit.touch()
    # A window far longer than the run, so no window boundary resets a budget mid-test.
    gated_options = ["--audit", str(audit), "--rate-limit", str(RATE_LIMIT),
                     "--rate-window", "1e9", "--breakable", "--hook-timeout", "0.5"]
    for caller in CALLERS:
        gated_options += ["--token", f"{caller}={token(caller)}"]
    for caller in FORBIDDEN:
        gated_options += ["--forbid", caller]
    started = [start(directory, *gated_options), start(directory)]
    try:
        for process, port, _ in started:
            wait_until_listening(process, port)
        (_, gated, gated_log), (_, open_port, open_log) = started
        yield {"gated": f"http://127.0.0.1:{gated}/mcp", "audit": audit,
               "open": f"http://127.0.0.1:{open_port}/mcp"}
    finally:
        for process, _, _ in started:
            stop(process)
    for _, _, log in started:
        text = log.read_text()
        assert "Traceback" not in text and not re.search(r"\bERROR\b", text), text
        assert SECRET not in text  # hook failures are logged by type only


class AuditTail:
    """The audit events appended since it was created."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size

    def new(self) -> list[dict[str, Any]]:
        with open(self.path, "rb") as sink:
            sink.seek(self.offset)
            return [json.loads(line) for line in sink.read().decode().splitlines()]


def client(url: str, caller: str | None = None, mode: str = "auto",
           **headers: str) -> Client:
    if caller is not None:
        headers["Authorization"] = f"Bearer {token(caller)}"
    return Client(StreamableHttpTransport(url, headers=headers), mode=mode)


async def call_each_kind(c: Client) -> list[Any]:
    """One tools/call, resources/read and prompts/get, each answer or its MCPError."""
    answers = []
    for request in (lambda: c.call_tool("price_quote", {"sku": "SKU-9", "quantity": 3}),
                    lambda: c.read_resource("chainweaver://flows/product_search/schema"),
                    lambda: c.get_prompt("product_search__compare",
                                         {"first": "lamp", "second": "desk"})):
        try:
            answers.append(await request())
        except MCPError as error:
            answers.append(error)
    return answers


KINDS = [("tool", "price_quote"), ("resource", "chainweaver://flows/product_search/schema"),
         ("prompt", "product_search__compare")]


def assert_served(answers: list[Any]) -> None:
    quote, schema, prompt = answers
    assert quote.structured_content == {"sku": "SKU-9", "total_cents": 2997}
    assert json.loads(schema[0].text)["tool_name"] == "product_search"
    assert '<user-data name="first">lamp</user-data>' in prompt.messages[0].content.text


def assert_refused(answers: list[Any], reason: str) -> None:
    for answer in answers:
        assert isinstance(answer, MCPError), answer
        assert answer.error.model_dump() == {"code": GATE_REFUSED,
                                             "message": f"Request refused: {reason}",
                                             "data": {"reason": reason}}
        assert SECRET not in str(answer)


def decisions(events: list[dict[str, Any]], lists: bool = False) -> list[tuple]:
    """The gate's decisions on calls, reads and renders (and on lists, when asked: a
    client lists tools on its own after a call, to check structured output)."""
    return [(e["kind"], e["name"], e["caller_id"], e["decision"], e["reason"])
            for e in events if e["phase"] == "decision" and (lists or e["kind"] != "list")]


# ------------------------------------------------------------------------ gate


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_valid_token_is_served_on_all_three_primitives_and_audited(
    servers: dict, mode: str
) -> None:
    tail = AuditTail(servers["audit"])
    async with client(servers["gated"], "alice" if mode == "auto" else "erin", mode) as c:
        answers = await call_each_kind(c)
    assert_served(answers)
    caller = "alice" if mode == "auto" else "erin"
    events = tail.new()
    assert decisions(events) == [(kind, name, caller, "allowed", "ok") for kind, name in KINDS]
    completed = [(e["kind"], e["outcome"]) for e in events
                 if e["phase"] == "completed" and e["kind"] != "list"]
    assert completed == [("tool", "ok"), ("resource", "ok"), ("prompt", "ok")]
    assert all("lamp" not in json.dumps(e) for e in events)  # content never audited


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"bearer {token('alice')}",
                                           f"Basic {token('alice')}", "Bearer",
                                           f"Bearer {token('alice')}x"])
async def test_unauthenticated_callers_are_refused_on_all_three_primitives(
    servers: dict, mode: str, authorization: str | None
) -> None:
    tail = AuditTail(servers["audit"])
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with client(servers["gated"], mode=mode, **headers) as c:
        assert_refused(await call_each_kind(c), "unauthenticated")
        with pytest.raises(MCPError) as listing:  # lists pass the gate too
            await c.list_tools()
        assert_refused([listing.value], "unauthenticated")
        # A refusal does not end the connection.
        assert_refused(await call_each_kind(c), "unauthenticated")
    assert decisions(tail.new(), lists=True) == [
        (kind, name, None, "denied", "unauthenticated")
        for kind, name in [*KINDS, ("list", "tools/list"), *KINDS]]


@pytest.mark.anyio
@pytest.mark.parametrize("caller,mode", [("mallory-auto", "auto"),
                                         ("mallory-legacy", "legacy")])
async def test_forbidden_callers_are_refused_on_all_three_primitives(
    servers: dict, caller: str, mode: str
) -> None:
    tail = AuditTail(servers["audit"])
    async with client(servers["gated"], caller, mode) as c:
        assert_refused(await call_each_kind(c), "forbidden")
    assert decisions(tail.new()) == [(kind, name, caller, "denied", "forbidden")
                                     for kind, name in KINDS]


@pytest.mark.anyio
async def test_rate_limited_callers_are_refused_on_all_three_primitives(servers: dict) -> None:
    tail = AuditTail(servers["audit"])
    async with client(servers["gated"], "carol") as c:
        assert_served(await call_each_kind(c))
        await call_each_kind(c)
        assert_refused(await call_each_kind(c), "rate_limited")
    events = decisions(tail.new(), lists=True)
    # Every gated request spends the budget of five, the client's own tools/list too;
    # once it is spent, everything is refused.
    assert [e[3:] for e in events] == [("allowed", "ok")] * RATE_LIMIT + [
        ("denied", "rate_limited")] * (len(events) - RATE_LIMIT)
    assert ("list", "tools/list", "carol", "allowed", "ok") in events
    assert {e[2] for e in events} == {"carol"}
    assert [e[0] for e in events[-3:]] == ["tool", "resource", "prompt"]


def test_a_refusal_on_the_wire_is_the_reason_code_and_nothing_else(servers: dict) -> None:
    response = modern_post(servers["gated"], "prompts/get",
                           {"name": "product_search", "arguments": {"query": SECRET}},
                           {"Authorization": "Bearer nope"})
    assert response.json() == {"jsonrpc": "2.0", "id": 1, "error": {
        "code": GATE_REFUSED, "message": "Request refused: unauthenticated",
        "data": {"reason": "unauthenticated"}}}


# ----------------------------------------------------------------- broken hooks


@pytest.mark.anyio
@pytest.mark.parametrize("hook", ["authenticator", "authorizer", "audit"])
@pytest.mark.parametrize("how", ["slow", "fail"])
async def test_a_slow_or_failing_hook_never_crashes_the_server_or_leaks(
    servers: dict, hook: str, how: str
) -> None:
    caller = f"{hook}-{how}"
    tail = AuditTail(servers["audit"])
    async with client(servers["gated"], caller, **{"X-Break": f"{hook}:{how}"}) as c:
        answers = await call_each_kind(c)
    if hook == "audit":
        assert_served(answers)  # auditing failed; the requests did not
        assert tail.new() == []
    else:
        assert_refused(answers, f"{hook}_error")
        expected_caller = None if hook == "authenticator" else caller
        assert decisions(tail.new()) == [(kind, name, expected_caller, "denied",
                                          f"{hook}_error") for kind, name in KINDS]
    # Still serving (the same caller, whose budget this test leaves room in).
    async with client(servers["gated"], caller) as c:
        assert "price_quote" in [t.name for t in await c.list_tools()]


# ------------------------------------------------- excluded == never existed


def modern_post(url: str, method: str, params: dict[str, Any],
                headers: dict[str, str] | None = None) -> httpx2.Response:
    """One self-contained 2026-07-28 request: no handshake, no session."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {
        **params, "_meta": {PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION,
                            CLIENT_CAPABILITIES_META_KEY: {}}}}
    return httpx2.post(url, content=json.dumps(body), headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": LATEST_MODERN_VERSION, "Mcp-Method": method,
        "Mcp-Name": encode_header_value(params[NAME_KEYS[method]]), **(headers or {})})


class LegacySession:
    """A raw 2025-11-25 session: initialize once, then POST with the session id."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx2.Client()
        self.headers = {"Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": LEGACY}
        opened = self.post("initialize", {"protocolVersion": LEGACY, "capabilities": {},
                                          "clientInfo": {"name": "raw", "version": "0"}})
        self.headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        self.http.post(url, headers=self.headers, content=json.dumps(
            {"jsonrpc": "2.0", "method": "notifications/initialized"}))

    def post(self, method: str, params: dict[str, Any]) -> httpx2.Response:
        return self.http.post(self.url, headers=self.headers, content=json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))


def requests_for(name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every way a client can address a flow by name."""
    return [("tools/call", {"name": name, "arguments": {"query": "q"}}),
            ("tools/call", {"name": name, "arguments": {}}),
            ("resources/read", {"uri": f"chainweaver://flows/{name}/schema"}),
            ("prompts/get", {"name": name}),
            ("prompts/get", {"name": name, "arguments": {"query": "q"}}),
            ("prompts/get", {"name": f"{name}__secret"})]


def test_excluded_names_answer_in_memory_exactly_like_names_that_never_existed() -> None:
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True)
    request_type = mcp_types.Request[dict[str, Any], str]

    async def answers(name: str) -> list[str]:
        out = []
        async with Client(server.fastmcp) as c:
            for method, params in requests_for(name):
                try:
                    result = await c.session.send_request(request_type(
                        method=method, params=params), RESULT_TYPES[method])
                    out.append(result.model_dump_json())
                except MCPError as error:
                    out.append(error.error.model_dump_json())
        return out

    never = anyio.run(answers, NEVER)
    assert any(NEVER in answer for answer in never)
    for name in EXCLUDED_NAMES:
        assert [a.replace(name, NEVER) for a in anyio.run(answers, name)] == never


@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_excluded_names_answer_over_http_byte_for_byte_like_names_that_never_existed(
    servers: dict, era: str
) -> None:
    url = servers["open"]
    session = LegacySession(url) if era == "legacy" else None

    def wire(name: str) -> list[tuple[int, str, bytes]]:
        out = []
        for method, params in requests_for(name):
            response = (session.post(method, params) if session
                        else modern_post(url, method, params))
            out.append((response.status_code, response.headers["content-type"],
                        response.content))
        return out

    never = wire(NEVER)
    assert all(NEVER.encode() in body for _, _, body in never)
    for name in EXCLUDED_NAMES:
        answers = [(status, kind, body.replace(name.encode(), NEVER.encode()))
                   for status, kind, body in wire(name)]
        assert answers == never, name


# -------------------------------------------------------------- hostile wire


@pytest.mark.parametrize("body,code", [
    ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"price_quote"', -32700),
    ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\ud800"}}', -32700),
    ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":'
     + "[" * 5_000 + "]" * 5_000 + "}}", -32700),
    ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}', -32602),
    ('{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":null}}', -32602),
    ('{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"chainweaver_guide",'
     '"arguments":{"x":{"y":1}}}}', -32602),
    ('{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":[]}', -32602),
])
def test_malformed_json_rpc_gets_a_well_formed_error(servers: dict, body: str,
                                                     code: int) -> None:
    session = LegacySession(servers["open"])
    response = session.http.post(session.url, headers=session.headers, content=body)
    text = response.text
    answer = json.loads(text[text.index("{"):])  # plain JSON or one SSE "data:" line
    assert answer["error"]["code"] == code
    assert set(answer["error"]) <= {"code", "message", "data"}
    assert session.post("tools/call", {"name": "price_quote", "arguments": {"sku": "S"}}
                        ).status_code == 200


def test_an_oversized_request_head_is_refused_by_http_and_serving_continues(
    servers: dict,
) -> None:
    # Over 2026-07-28 a URI also travels in the Mcp-Name header; uvicorn refuses request
    # heads over 16 KiB with a plain 400 before MCP sees them (the fastmcp client then
    # reports -32603 "Server returned an error response": the server sent no JSON-RPC).
    uri = "chainweaver://flows/" + "a" * 40_000 + "/schema"
    assert modern_post(servers["open"], "resources/read", {"uri": uri}).status_code == 400
    # In the request body (the 2025-11-25 era) the same URI is simply not found, and
    # the answer quotes no more of it than any error echoes (MAX_ECHO).
    session = LegacySession(servers["open"])
    body = session.post("resources/read", {"uri": uri}).text
    error = json.loads(body[body.index("{"):])["error"]
    # Echoed at most MAX_ECHO characters (a longer URI is cut, saying how long it was).
    assert (error["code"], error["data"]) == (-32602, {"uri": bounded(uri)})
    served = modern_post(servers["open"], "tools/call",
                         {"name": "price_quote", "arguments": {"sku": "S"}})
    assert served.json()["result"]["structuredContent"] == {"sku": "S", "total_cents": 999}
