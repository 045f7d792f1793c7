"""Run records through a real in-memory client on both eras: every result carries its
run id, the record reads back without values, failures reach the server log at warning
and the audit's error type (even under error_detail="generic"), run URIs pass the gate
and answer bad input with -32602, and the stores keep to their bounds."""

from __future__ import annotations

import json
import logging
import time

import mcp_types
import pytest
from fastmcp import Client
from mcp import MCPError
from support.catalogue import build_catalogue

from chainweaver.errors import ExposureConfigError
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    CallerIdentity,
    FlowServer,
    GateContext,
    SecurityConfig,
)
from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.runs.records import MemoryRunStore, RunQuery, RunRecord

MODES = ["auto", "legacy"]
SECRET = "A-987654321"


def serving(events: list[AuditEvent] | None = None, **security: object) -> FlowServer:
    hooks = {"audit_hook": events.append} if events is not None else {}
    return FlowServer(build_catalogue(), security=SecurityConfig(**hooks, **security),
                      run_history=RunHistory())


async def record_of(client: Client, run_id: str) -> dict:
    return json.loads((await client.read_resource(f"chainweaver://runs/{run_id}"))[0].text)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_every_result_carries_a_run_id_and_its_record_holds_no_values(
        mode: str) -> None:
    events: list[AuditEvent] = []
    async with Client(serving(events).fastmcp, mode=mode) as client:
        result = await client.session.call_tool("order_status", {"order_id": SECRET})
        run_id = result.meta["chainweaver"]["run_id"]
        record = await record_of(client, run_id)
        assert record["status"] == "completed" and record["flow"] == "order_status"
        assert [step["id"] for step in record["steps"]] == ["fetch_order", "summarise_order"]
        audited = [e for e in events if e.kind == "tool" and e.phase == "completed"][-1]
        assert record["output_sha256"] == audited.result_sha256
        assert record["output_size"] == audited.result_length
        text = json.dumps(record)
        assert SECRET not in text and "carrier" not in text  # no argument, no output
        invalid = await client.session.call_tool("order_status", {})
        assert invalid.is_error and len(invalid.meta["chainweaver"]["run_id"]) == 24


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_run_is_logged_at_warning_and_audited_with_its_error_type(
        mode: str, caplog: pytest.LogCaptureFixture) -> None:
    events: list[AuditEvent] = []
    caplog.set_level(logging.WARNING, "chainweaver.mcp.runs")
    async with Client(serving(events, error_detail="generic").fastmcp, mode=mode) as client:
        result = await client.session.call_tool("failing_flow", {"query": "x"})
        assert result.is_error and "RuntimeError" not in result.content[0].text
        run_id = result.meta["chainweaver"]["run_id"]
        record = await record_of(client, run_id)
    assert record["status"] == "failed" and record["error_type"] is None  # generic
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"run {run_id} of flow 'failing_flow' version 1.0.0 failed at step " \
           "'explode': RuntimeError" in lines
    audited = [e for e in events if e.kind == "tool" and e.phase == "completed"][-1]
    assert (audited.outcome, audited.error_type) == ("error", "RuntimeError")


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_the_listing_pages_newest_first_and_filters(mode: str) -> None:
    async with Client(serving().fastmcp, mode=mode) as client:
        ids = []
        for index in range(5):
            result = await client.session.call_tool(
                "failing_flow" if index % 2 else "product_search", {"query": "q"})
            ids.append(result.meta["chainweaver"]["run_id"])

        async def page(query: str) -> dict:
            return json.loads((await client.read_resource(f"chainweaver://runs{query}"))[0]
                              .text)

        first = await page("?limit=2")
        assert [r["run_id"] for r in first["runs"]] == ids[:-3:-1]
        rest = await page(f"?limit=10&cursor={first['next_cursor']}")
        assert [r["run_id"] for r in rest["runs"]] == ids[-3::-1]
        assert rest["next_cursor"] is None
        failed = await page("?status=failed")
        assert [r["run_id"] for r in failed["runs"]] == [ids[3], ids[1]]
        searched = await page("?flow=product_search&status=completed")
        assert [r["run_id"] for r in searched["runs"]] == [ids[4], ids[2], ids[0]]
        templates = {t.uri_template for t in await client.list_resource_templates()}
        assert "chainweaver://runs{?flow,status,cursor,limit}" in templates
        done = await client.complete(mcp_ref(), {"name": "status", "value": "c"})
        assert done.values == ["completed", "cancelled"]
        flows = await client.complete(mcp_ref(), {"name": "flow", "value": "pr"})
        assert flows.values == ["price_quote", "product_search"]


def mcp_ref() -> mcp_types.ResourceTemplateReference:
    return mcp_types.ResourceTemplateReference(
        uri="chainweaver://runs{?flow,status,cursor,limit}")


@pytest.mark.anyio
@pytest.mark.parametrize("uri", ["chainweaver://runs?status=done", "chainweaver://runs?limit=0",
                                 "chainweaver://runs?limit=201", "chainweaver://runs?cursor=x",
                                 "chainweaver://runs?colour=red",
                                 "chainweaver://runs/" + "0" * 24 + "?x=1"])
async def test_a_malformed_run_uri_is_invalid_params(uri: str) -> None:
    events: list[AuditEvent] = []
    async with Client(serving(events).fastmcp) as client:
        with pytest.raises(MCPError) as caught:
            await client.read_resource(uri)
    assert caught.value.error.code == -32602
    assert caught.value.error.message.startswith(f"Invalid run resource URI {uri!r}: ")
    assert [(e.kind, e.name, e.phase) for e in events] == [
        ("resource", uri, "decision"), ("resource", uri, "completed")]


@pytest.mark.anyio
@pytest.mark.parametrize("decided_by", ["token", "authenticator"])
async def test_run_reads_pass_the_gate_and_the_authorizer_sees_the_runs_flow(
        decided_by: str) -> None:
    # With an authenticator the caller is known only to the gate: the run a URI names
    # must still be looked up as that caller's, so the authorizer sees its flow.
    seen: list[tuple[str, str | None]] = []

    def authorizer(ctx: GateContext) -> bool:
        seen.append((ctx.name, ctx.flow_name))
        return not (ctx.kind == "resource" and ctx.flow_name == "price_quote")

    hooks: dict[str, object] = {"authorizer": authorizer}
    if decided_by == "authenticator":
        hooks["authenticator"] = lambda ctx: CallerIdentity("alice", subject="alice")
    async with Client(serving(**hooks).fastmcp) as client:
        quoted = await client.session.call_tool("price_quote", {"sku": "SKU-1"})
        searched = await client.session.call_tool("product_search", {"query": "q"})
        quote_uri, search_uri, never = (
            f"chainweaver://runs/{quoted.meta['chainweaver']['run_id']}",
            f"chainweaver://runs/{searched.meta['chainweaver']['run_id']}",
            "chainweaver://runs/" + "0" * 24)
        await client.read_resource(search_uri)
        with pytest.raises(MCPError) as refused:
            await client.read_resource(quote_uri)
        with pytest.raises(MCPError) as missing:
            await client.read_resource(never)
    assert refused.value.error.code == GATE_REFUSED
    assert missing.value.error.message == f"Resource not found: {never!r}"
    assert seen[-3:] == [(search_uri, "product_search"), (quote_uri, "price_quote"),
                         (never, None)]


def record(run_id: str, caller: str = "c", flow: str = "f", seq: int = 0,
           started: float = 1e12) -> RunRecord:
    return RunRecord(run_id, flow, "1.0.0", flow, caller, seq, started)


@pytest.mark.anyio
async def test_the_memory_store_drops_the_oldest_past_its_bounds() -> None:
    store = MemoryRunStore(max_runs=3, max_age=3600, max_output_bytes=10)
    now = time.time()
    for index in range(5):
        await store.save(record(f"{index:024x}", seq=index, started=now), new=True)
    page, cursor = await store.page(RunQuery(caller="c"))
    assert [r.run_id for r in page] == [f"{i:024x}" for i in (4, 3, 2)] and cursor is None
    assert await store.get(f"{0:024x}") is None
    await store.put_output(f"{4:024x}", b"12345678")
    await store.put_output(f"{3:024x}", b"1234")
    assert await store.output(f"{4:024x}") is None  # dropped: over max_output_bytes
    assert await store.output(f"{3:024x}", 1, 2) == b"23"
    await store.save(record("f" * 24, seq=9, started=now - 7200), new=True)
    assert await store.get("f" * 24) is None  # older than max_age


def test_run_history_settings_are_checked() -> None:
    for bad in ({"store": "file:///tmp/x"}, {"max_runs": 0}, {"max_age": -1},
                {"output_limit": 1.5}, {"prefix": ""}):
        with pytest.raises(ExposureConfigError):
            RunHistory(**bad)  # type: ignore[arg-type]
    with pytest.raises(ExposureConfigError, match="run_history must be None or a RunHistory"):
        FlowServer(build_catalogue(), run_history="memory://")  # type: ignore[arg-type]
