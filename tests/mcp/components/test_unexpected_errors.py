"""An exception nothing expected, raised during a flow tool's call, seen by a real
(in-memory) MCP client on both protocol eras: an ``isError`` result naming the flow and
the part that failed, with the exception's type at most (nothing under
``error_detail="generic"``), never its message, a file path or a traceback; the
traceback is in the server's log, and the server goes on serving."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import Any

import mcp_types
import pytest
from fastmcp import Client
from mcp import MCPError
from pydantic import BaseModel

from chainweaver import (
    ExecutionResult,
    Flow,
    FlowExecutor,
    FlowRegistry,
    FlowStep,
    SideEffectLevel,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import ErrorDetail, FlowServer, SecurityConfig
from chainweaver.mcp.runs import reporting as runs

ERAS = ["legacy", "auto"]  # 2025-11-25, 2026-07-28
READ = ToolSafetyContract(SideEffectLevel.READ)
SECRET = "token=s3cr3t"
# What FastMCP 4.2.3 sent a client: the exception's text, a file path in it.
IMPORT_FAILURE = ("cannot import name '_log_level_session_key' from 'fastmcp.server.context' "
                  "(/opt/venv/lib/python3.12/site-packages/fastmcp/server/context.py)")
LEAKS = (SECRET, "/", "\\", "Traceback", "site-packages", "_log_level_session_key",
         "cannot import", ".py")


class Numbers(BaseModel):
    n: int


@tool(safety=READ)
def double(numbers: Numbers) -> Numbers:
    return Numbers(n=numbers.n * 2)


@dataclasses.dataclass
class Unreadable:
    """A value whose field cannot be read: serialising it raises what nobody expects."""

    value: int = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "value":
            raise LookupError(f"/srv/app/vault.py: {SECRET}")
        return object.__getattribute__(self, name)


# A tool without an output model: its dict reaches the tool result as returned.
@tool(safety=READ)
def unreadable(numbers: Numbers) -> dict[str, Any]:
    return {"n": numbers.n, "extra": Unreadable()}


class FailingExecutor(FlowExecutor):
    """An executor (a user's subclass) that raises ``error`` when asked to run
    ``flow_name``, instead of returning a result."""

    def __init__(self, registry: FlowRegistry, flow_name: str, error: Exception) -> None:
        super().__init__(registry)
        self.flow_name = flow_name
        self.error = error

    async def execute_flow_async(self, name: str, input: Mapping[str, Any] | BaseModel,
                                 version: str | None = None, **options: Any
                                 ) -> ExecutionResult:
        if name == self.flow_name:
            raise self.error
        return await super().execute_flow_async(name, input, version, **options)


def build_server(error_detail: ErrorDetail = "full", *,
                 fail: Exception | None = None) -> FlowServer:
    registry = FlowRegistry()
    executor = (FlowExecutor(registry) if fail is None
                else FailingExecutor(registry, "exploding", fail))
    for t in (double, unreadable):
        executor.register_tool(t)
    registry.register_flow(Flow("doubling", "doubles", [FlowStep("double")]))
    registry.register_flow(Flow("unsendable", "returns a value that cannot be serialised",
                                [FlowStep("unreadable")]))
    registry.register_flow(Flow("exploding", "its executor raises", [FlowStep("double")]))
    return FlowServer(executor, security=SecurityConfig(error_detail=error_detail))


def text_of(result: Any) -> str:
    assert result.is_error is True
    assert result.structured_content is None
    return "\n".join(block.text for block in result.content)


def assert_safe(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, f"{leak!r} reached the client: {text!r}"


async def keeps_serving(client: Client) -> None:
    result = await client.call_tool("doubling", {"n": 21})
    assert result.is_error is False
    assert result.structured_content == {"n": 42}


def reference_in(text: str) -> str:
    found = re.search(r"error reference ([0-9a-f]{8})", text)
    assert found is not None, text
    return found.group(1)


# ------------------------------------------------------------------ run reporting


@pytest.fixture
def reporting_fails_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Reporting's first look at the request raises what FastMCP 4.2.3 raised (an
    ImportError whose text names a file); later calls go on as usual."""
    calls: list[int] = []
    original = runs.wants_progress

    def wants_progress(ctx: Any) -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise ImportError(IMPORT_FAILURE)
        return original(ctx)

    monkeypatch.setattr(runs, "wants_progress", wants_progress)
    return calls


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_a_reporting_failure_names_the_flow_and_part_never_the_exception_text(
        mode: str, reporting_fails_once: list[int], all_logs: pytest.LogCaptureFixture
) -> None:
    server = build_server()
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("doubling", {"n": 1}, raise_on_error=False)
        text = text_of(result)
        assert "'doubling'" in text
        assert "run reporting" in text
        assert "(ImportError)" in text
        assert_safe(text)
        await keeps_serving(client)
    assert len(reporting_fails_once) >= 2
    # The operator finds the whole traceback, by the reference the client was given.
    reference = reference_in(text)
    (record,) = [r for r in all_logs.records if reference in r.getMessage()]
    assert record.name.startswith("chainweaver")
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and isinstance(record.exc_info[1], ImportError)
    assert "run reporting" in record.getMessage()


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_generic_error_detail_does_not_even_name_the_type(
        mode: str, reporting_fails_once: list[int]) -> None:
    server = build_server("generic")
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("doubling", {"n": 1}, raise_on_error=False)
        text = text_of(result)
        assert "'doubling'" in text
        assert "run reporting" in text
        assert "ImportError" not in text
        assert "Error" not in text
        assert_safe(text)
        await keeps_serving(client)


@pytest.mark.anyio
async def test_type_only_error_detail_names_the_type() -> None:
    server = build_server("type_only")
    async with Client(server.fastmcp) as client:
        result = await client.call_tool("unsendable", {"n": 1}, raise_on_error=False)
        text = text_of(result)
        assert "'unsendable'" in text
        assert "(LookupError)" in text
        assert_safe(text)


# ------------------------------------------------------------------ the result


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("error_detail", ["full", "generic"])
async def test_an_output_that_fails_to_serialise_is_an_error_result(
        mode: str, error_detail: ErrorDetail, all_logs: pytest.LogCaptureFixture) -> None:
    # No mock: the tool's own value raises while the result is encoded.
    server = build_server(error_detail)
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("unsendable", {"n": 1}, raise_on_error=False)
        text = text_of(result)
        assert "'unsendable'" in text
        assert "serialising the result" in text
        assert ("(LookupError)" in text) is (error_detail != "generic")
        assert_safe(text)
        await keeps_serving(client)
    reference = reference_in(text)
    (record,) = [r for r in all_logs.records if reference in r.getMessage()]
    assert record.exc_info is not None and SECRET in str(record.exc_info[1])


# ------------------------------------------------------------------ the run


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_an_executor_that_raises_is_an_error_result(mode: str) -> None:
    server = build_server(fail=RuntimeError(f"failed reading /etc/app.conf: {SECRET}"))
    async with Client(server.fastmcp, mode=mode) as client:
        result = await client.call_tool("exploding", {"n": 1}, raise_on_error=False)
        text = text_of(result)
        assert "'exploding'" in text
        assert "the run" in text
        assert "(RuntimeError)" in text
        assert_safe(text)
        await keeps_serving(client)


@pytest.mark.anyio
async def test_a_type_named_like_a_path_is_not_shown() -> None:
    odd = type("/srv/app/Secret.py", (RuntimeError,), {})
    server = build_server(fail=odd(SECRET))
    async with Client(server.fastmcp) as client:
        text = text_of(await client.call_tool("exploding", {"n": 1}, raise_on_error=False))
    assert "(Exception)" in text
    assert_safe(text)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ERAS)
async def test_a_protocol_error_goes_through_unchanged(mode: str) -> None:
    # An MCPError is a protocol error, meant as one: the tool does not turn it into a
    # result (FastMCP sends a missing-client-capability error as the error it is).
    code = mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY
    error = MCPError(code=code, message="the client lacks a capability")
    server = build_server(fail=error)
    async with Client(server.fastmcp, mode=mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("exploding", {"n": 1})
        assert caught.value.error.code == code
        assert caught.value.error.message == "the client lacks a capability"
        await keeps_serving(client)

