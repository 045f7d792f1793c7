"""One request, one admission: each request's flow is resolved once, lists are served by
the page, and what the gate decided is what every later part reads.

Through a real MCP client (in memory), on both protocol eras.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import FlowServer, SecurityConfig, ServingConfig
from chainweaver.mcp.hooks import AuditEvent
from chainweaver.mcp.publish.exposure import Exposure

MODES = ["auto", "legacy"]
MCP_PACKAGE = Path(__file__).resolve().parents[3] / "chainweaver" / "mcp"


class Text(BaseModel):
    text: str


@tool(safety=ToolSafetyContract("read"))
def echo(text: str) -> Text:
    return Text(text=text)


def catalogue(flows: int) -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    for index in range(flows):
        executor.registry.register_flow(
            Flow(f"flow_{index:04d}", f"Flow {index}.", [FlowStep("echo")]))
    return executor


def served(flows: int = 300, **serving: Any) -> FlowServer:
    return FlowServer(catalogue(flows), expose_schemas=True, expose_prompts=True,
                      security=SecurityConfig(audit_hook=lambda event: None),
                      serving=ServingConfig(**serving))


def label(item: Any) -> str:
    """A listed tool's or prompt's name, a resource's URI."""
    uri = getattr(item, "uri", None)
    return str(uri) if uri is not None else item.name


class Lookups:
    """Counts how often a request looks a published name up in the exposure snapshot."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.depth = 0  # a resource or prompt lookup finds its tool: one lookup
        for method in ("tool", "resource", "prompt"):
            original = getattr(Exposure, method)

            def counted(snapshot: Exposure, name: str, _original: Any = original) -> Any:
                self.count += self.depth == 0
                self.depth += 1
                try:
                    return _original(snapshot, name)
                finally:
                    self.depth -= 1

            monkeypatch.setattr(Exposure, method, counted)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_each_call_read_and_render_resolves_its_flow_once(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = served()
    async with Client(server.fastmcp, mode=mode) as client:
        lookups = Lookups(monkeypatch)
        result = await client.call_tool("flow_0007", {"text": "hi"})
        assert result.structured_content == {"text": "hi"}
        assert lookups.count == 1
        read = await client.read_resource("chainweaver://flows/flow_0007/schema")
        assert "flow_0007" in read[0].text
        assert lookups.count == 2
        rendered = await client.get_prompt("flow_0007", {"text": "hi"})
        assert rendered.messages
        assert lookups.count == 3


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_an_unknown_name_builds_nothing_of_the_catalogue(mode: str) -> None:
    """FastMCP lists every tool to look for other versions of a name it did not find;
    during a call only the admitted flow can be that name, so nothing else is built."""
    server = served(500)
    provider = server._provider
    async with Client(server.fastmcp, mode=mode) as client:
        for name in ("no_such_flow", "flow_9999"):
            result = await client.call_tool(name, {}, raise_on_error=False)
            assert result.is_error and result.content[0].text == f"Unknown tool: {name!r}"
        with pytest.raises(MCPError):
            await client.read_resource("chainweaver://flows/no_such_flow/schema")
        with pytest.raises(MCPError):
            await client.get_prompt("no_such_flow", {})
    assert provider.components_built == 0


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("method", "key", "first"), [
    ("list_tools", "tools", "flow_0000"),
    ("list_resources", "resources", "chainweaver://flows"),
    ("list_prompts", "prompts", "chainweaver_guide")])
async def test_a_page_builds_the_page_and_pages_cover_the_list(
        mode: str, method: str, key: str, first: str) -> None:
    server = served(300, page_size=25)
    provider = server._provider
    async with Client(server.fastmcp, mode=mode) as client:
        result = await getattr(client, f"{method}_mcp")()
        page = [label(item) for item in getattr(result, key)]
        assert len(page) == 25 and page[0] == first
        assert provider.components_built <= 25  # the page, not the catalogue
        seen = list(page)
        while result.next_cursor:
            result = await getattr(client, f"{method}_mcp")(cursor=result.next_cursor)
            seen += [label(item) for item in getattr(result, key)]
    unpaged = served(300)
    async with Client(unpaged.fastmcp, mode=mode) as client:
        everything = await getattr(client, method)()
    assert seen == [label(item) for item in everything]
    assert len(seen) == len(set(seen))


@pytest.mark.anyio
@pytest.mark.parametrize("cursor", ["0.25", "zz.1", "abc", "ffff.-1", "ffff.1e3", "ffff.²"])
async def test_a_forged_cursor_is_invalid_params(cursor: str) -> None:
    server = served(30, page_size=10)
    async with Client(server.fastmcp) as client:
        with pytest.raises(MCPError) as raised:
            await client.list_tools_mcp(cursor=cursor)
        assert raised.value.error.code == -32602
        assert len((await client.list_tools_mcp()).tools) == 10  # still serving


@pytest.mark.anyio
async def test_a_page_past_the_end_is_empty_and_final() -> None:
    server = served(30, page_size=10)
    async with Client(server.fastmcp) as client:
        last = None
        result = await client.list_tools_mcp()
        while result.next_cursor:
            last = result.next_cursor
            result = await client.list_tools_mcp(cursor=last)
        assert last is not None
        fingerprint = last.partition(".")[0]
        beyond = await client.list_tools_mcp(cursor=f"{fingerprint}.500")
    assert beyond.tools == [] and beyond.next_cursor is None


@pytest.mark.anyio
async def test_lists_with_other_components_are_paged_by_fastmcp() -> None:
    """A tool of the server's own beside the flows: FastMCP pages the whole list, and
    the cursors still name the caller's list."""
    server = served(12, page_size=5)

    @server.fastmcp.tool
    def ping() -> str:
        return "pong"

    async with Client(server.fastmcp) as client:
        names: list[str] = []
        result = await client.list_tools_mcp()
        names += [t.name for t in result.tools]
        while result.next_cursor:
            result = await client.list_tools_mcp(cursor=result.next_cursor)
            names += [t.name for t in result.tools]
    assert sorted(names) == sorted([*(f"flow_{i:04d}" for i in range(12)), "ping"])


@pytest.mark.anyio
async def test_the_audit_of_a_page_is_one_allowed_list() -> None:
    events: list[AuditEvent] = []
    server = FlowServer(catalogue(40), security=SecurityConfig(audit_hook=events.append),
                        serving=ServingConfig(page_size=10))
    async with Client(server.fastmcp) as client:
        await client.list_tools_mcp()
    assert [(e.kind, e.name, e.phase, e.outcome) for e in events] == [
        ("list", "tools/list", "decision", None), ("list", "tools/list", "completed", "ok")]


def test_one_context_variable_carries_a_request() -> None:
    """The admission is the only per-request state the MCP layer keeps in context."""
    made = []
    for path in sorted(MCP_PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ContextVar":
                made.append(path.relative_to(MCP_PACKAGE).as_posix())
    assert made == ["gate/admission.py"]


def test_the_gate_is_the_servers_one_middleware_layer() -> None:
    """Pinning the snapshot, admitting, counting, capping and spans are the gate's steps:
    every FastMCP middleware layer costs each request, so there is one."""
    from chainweaver.mcp.gate.security import SecurityGate

    (layer,) = served(3).fastmcp.middleware
    assert isinstance(layer, SecurityGate)


def admissions_made_outside(package: Path) -> list[str]:
    """Every ``Admission(...)`` built, and every copy of a held record
    (``dataclasses.replace`` of ``held`` or of ``admission.current()``), outside
    ``gate/admission.py``: its named factories make every record."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where == "gate/admission.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            copied = called == "replace" and node.args and any(
                text in ast.unparse(node.args[0]) for text in ("held", "current()"))
            if called == "Admission" or copied:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node.func)}")
    return found


def private_gate_calls_outside(package: Path) -> list[str]:
    """Every use of a private method of ``SecurityGate`` from outside its class (on
    whatever holds it under a name that says so: ``gate``, ``self.gate``, ...)."""
    gate = ast.parse((package / "gate" / "security.py").read_text())
    private = {item.name for node in gate.body
               if isinstance(node, ast.ClassDef) and node.name == "SecurityGate"
               for item in node.body
               if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
               and item.name.startswith("_") and not item.name.startswith("__")}
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private \
                    and "gate" in ast.unparse(node.value).lower():
                found.append(f"{path.relative_to(package).as_posix()}:{node.lineno}: "
                             f"{ast.unparse(node)}")
    return found


def test_admission_records_are_made_only_in_gate_admission() -> None:
    assert admissions_made_outside(MCP_PACKAGE) == []


def test_no_other_class_calls_a_private_method_of_the_security_gate() -> None:
    assert private_gate_calls_outside(MCP_PACKAGE) == []
