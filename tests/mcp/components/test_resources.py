"""Schema resources (``expose_schemas=True``) through a real MCP client.

What a client lists and reads is checked against what the same server advertises in
``tools/list``; excluded flows and malformed URIs are checked against the answer for a
URI that never existed, field by field.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from fastmcp import Client
from fastmcp.client.transports import PythonStdioTransport, StreamableHttpTransport
from mcp import MCPError
from pydantic import BaseModel, Field
from support.catalogue import EXCLUDED, EXPOSED, build_catalogue
from support.mcp_client import (
    INDEX,
    TEMPLATE,
    as_if_for,
    assert_not_found_like_never,
    complete_template,
    exposing,
    published_meta,
    read_error,
    read_text,
    schema_uri,
)
from support.mcp_client import NEVER_URI as NEVER
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening

from chainweaver import Flow, FlowStep, ToolSafetyContract, tool
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    AuthorizationDecision,
    ExposurePolicy,
    FlowServer,
    GateContext,
    SecurityConfig,
    ServingConfig,
)

EXCLUDED_NAMES = sorted(name for name, why in EXCLUDED.items() if why is not None)
SERVER_SCRIPT = Path(__file__).resolve().parents[2] / "servers" / "catalogue_server.py"














# ------------------------------------------------------------------- flags off


@pytest.mark.anyio
async def test_flag_off_lists_no_resources_or_templates_and_tools_are_unchanged() -> None:
    plain = FlowServer(build_catalogue())
    with_schemas = exposing()
    async with Client(plain.fastmcp) as client:
        assert await client.list_resources() == []
        assert await client.list_resource_templates() == []
        plain_tools = [t.model_dump(exclude={"meta"}) for t in await client.list_tools()]
        # A schema URI that would exist with the flag on is unknown here.
        error = await read_error(client, schema_uri("product_search"))
        never = await read_error(client, NEVER)
        assert error.model_dump() == as_if_for(never, NEVER, schema_uri("product_search"))
        assert (await read_error(client, INDEX)).model_dump() == as_if_for(never, NEVER, INDEX)
    async with Client(with_schemas.fastmcp) as client:
        assert [t.model_dump(exclude={"meta"}) for t in await client.list_tools()] == \
            plain_tools
    assert plain.resource_uris == []


# -------------------------------------------------------------------- listing


@pytest.mark.anyio
async def test_one_resource_per_exposed_flow_plus_the_index() -> None:
    server = exposing()
    async with Client(server.fastmcp) as client:
        resources = {str(r.uri): r for r in await client.list_resources()}
    expected = {INDEX} | {schema_uri(name) for name in EXPOSED}
    assert set(resources) == expected
    assert server.resource_uris == [INDEX, *sorted(expected - {INDEX})]
    for name in EXPOSED:
        resource = resources[schema_uri(name)]
        assert resource.mime_type == "application/json"
        assert resource.name == f"{name}_schema"
        assert resource.title and resource.description and name in resource.description
        assert resource.annotations.audience == ["assistant", "user"]
        assert resource.annotations.priority == 0.7
    index = resources[INDEX]
    assert index.name and index.title and index.description
    assert index.annotations.audience == ["assistant", "user"]
    # The index is what a client should load first.
    assert index.annotations.priority == 0.9
    search = resources[schema_uri("product_search")]
    assert search.title == "Product search schema"
    assert published_meta(search) == {"flow": "product_search", "version": "1.0.0"}


@pytest.mark.anyio
async def test_report_and_resources_use_the_prefixed_tool_names() -> None:
    server = exposing(policy=ExposurePolicy(server_prefix="shop"))
    async with Client(server.fastmcp) as client:
        uris = {str(r.uri) for r in await client.list_resources()}
        assert json.loads(await read_text(client, schema_uri("shop__order_status")))[
            "tool_name"] == "shop__order_status"
        await assert_not_found_like_never(client, schema_uri("order_status"))
    assert uris == {INDEX} | {schema_uri(f"shop__{name}") for name in EXPOSED}
    report = {entry.flow_name: entry for entry in server.exposure_report()}
    for name in EXPOSED:
        assert report[name].resource_uris == (schema_uri(f"shop__{name}"),)
    for name in EXCLUDED_NAMES:
        assert report[name].resource_uris == ()


# ------------------------------------------------------------ schema documents


def canonical(value: Any) -> bytes:
    """JSON bytes independent of key order.

    The MCP SDK writes ``inputSchema`` through per-protocol wire models that move the
    keys they declare to the front (``type`` first on 2026-07-28, ``properties``,
    ``required``, ``type`` first on 2025-11-25), so the order on the wire depends on
    the negotiated version; the schema itself must not.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_schema_documents_equal_the_tool_schemas_byte_for_byte(mode: str) -> None:
    server = exposing(expose_prompts=True)
    async with Client(server.fastmcp, mode=mode) as client:
        tools = {t.name: t for t in await client.list_tools()}
        assert sorted(tools) == sorted(EXPOSED)
        documents = {name: json.loads(await read_text(client, schema_uri(name)))
                     for name in tools}
    for name, listed in tools.items():
        document = documents[name]
        assert canonical(document["input_schema"]) == canonical(listed.input_schema)
        assert canonical(document["output_schema"]) == canonical(listed.output_schema)
        assert document["tool_name"] == name
        assert document["description"] == listed.description
        assert document["title"] == listed.title
        assert document["version"] == listed.meta["chainweaver"]["version"]
        assert document["name"] == listed.meta["chainweaver"]["flow"]
    # failing_flow's last tool returns a bare dict: its output is unknown, so null.
    assert tools["failing_flow"].output_schema is None
    assert documents["failing_flow"]["output_schema"] is None
    assert tools["order_status"].output_schema is not None


@pytest.mark.anyio
async def test_the_schema_document_has_the_documented_shape() -> None:
    async with Client(exposing().fastmcp) as client:
        document = json.loads(await read_text(client, schema_uri("order_status")))
        unknown_output = json.loads(await read_text(client, schema_uri("failing_flow")))
    assert list(document) == ["name", "version", "title", "description", "tool_name",
                              "input_schema", "output_schema"]
    assert document["name"] == "order_status" and document["version"] == "2.1.0"
    assert document["title"] == "Order Status"
    assert document["input_schema"]["required"] == ["order_id"]
    assert document["input_schema"]["properties"]["order_id"]["pattern"] == r"^A-\d+$"
    assert set(document["output_schema"]["properties"]) == {"order_id", "status", "summary"}
    assert unknown_output["output_schema"] is None


class Address(BaseModel):
    city: str = Field(description="City")


class Parcel(BaseModel):
    sender: Address
    recipient: Address


@tool(safety=ToolSafetyContract("none"))
def route_parcel(data: Parcel) -> Parcel:
    """Route a parcel."""
    return data


@pytest.mark.anyio
async def test_nested_models_are_published_without_refs_in_both_places() -> None:
    executor = build_catalogue()
    executor.register_tool(route_parcel)
    executor.registry.register_flow(Flow("route", "Route a parcel.", [FlowStep("route_parcel")]))
    async with Client(FlowServer(executor, expose_schemas=True).fastmcp) as client:
        listed = {t.name: t for t in await client.list_tools()}["route"]
        document = json.loads(await read_text(client, schema_uri("route")))
    assert "$ref" not in json.dumps(document) and "$defs" not in json.dumps(document)
    assert canonical(document["input_schema"]) == canonical(listed.input_schema)
    assert canonical(document["output_schema"]) == canonical(listed.output_schema)
    assert document["input_schema"]["properties"]["sender"]["properties"]["city"] == {
        "description": "City", "title": "City", "type": "string"}


# ----------------------------------------------------------------------- index


@pytest.mark.anyio
async def test_the_index_lists_every_exposed_flow_with_its_schema_and_prompts() -> None:
    async with Client(exposing(expose_prompts=True).fastmcp) as client:
        index = json.loads(await read_text(client, INDEX))
        tools = {t.name: t for t in await client.list_tools()}
    entries = {entry["tool_name"]: entry for entry in index["flows"]}
    assert sorted(entries) == sorted(EXPOSED)
    for name, entry in entries.items():
        assert entry["schema_uri"] == schema_uri(name)
        assert entry["version"] == tools[name].meta["chainweaver"]["version"]
        assert entry["title"] == tools[name].title
        assert entry["description"] == tools[name].description
        assert entry["read_only"] is tools[name].annotations.read_only_hint is True
    assert entries["product_search"]["prompts"] == [
        "product_search", "product_search__compare", "product_search__brief"]
    assert entries["order_status"]["prompts"] == ["order_status"]


@pytest.mark.anyio
async def test_the_index_has_no_prompts_without_expose_prompts() -> None:
    async with Client(exposing().fastmcp) as client:
        index = json.loads(await read_text(client, INDEX))
    assert all(entry["prompts"] == [] for entry in index["flows"])


# -------------------------------------------------------------------- template


@pytest.mark.anyio
async def test_the_template_is_listed_and_reading_by_name_resolves_exposed_flows_only() -> None:
    server = exposing()
    async with Client(server.fastmcp) as client:
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates] == [TEMPLATE]
        template = templates[0]
        assert template.mime_type == "application/json"
        assert template.annotations.audience == ["assistant", "user"]
        # A client that knows only a published name fills in the pattern and reads.
        for name in EXPOSED:
            uri = template.uri_template.replace("{published_name}", name)
            assert json.loads(await read_text(client, uri))["tool_name"] == name
        for name in EXCLUDED_NAMES:
            await assert_not_found_like_never(client, TEMPLATE.replace("{published_name}", name))




@pytest.mark.anyio
async def test_template_completion_offers_exposed_flows_only() -> None:
    async with Client(exposing().fastmcp) as client:
        assert sorted(await complete_template(client, "")) == sorted(EXPOSED)
        assert await complete_template(client, "pr") == ["price_quote", "product_search"]
        for name in EXCLUDED_NAMES:
            assert await complete_template(client, name[:3]) == [
                n for n in sorted(EXPOSED) if n.startswith(name[:3])]
            assert await complete_template(client, name) == []
        assert await complete_template(client, "", argument="other") == []
        assert await complete_template(client, "", uri="chainweaver://other/{x}") == []


# ------------------------------------------------------ exclusions and bad URIs


MALFORMED = [
    "file:///etc/passwd",
    "https://example.com/flows/product_search/schema",
    "CHAINWEAVER://flows/product_search/schema",
    "other://flows/product_search/schema",
    "chainweaver://flows/product_search/../write_flow/schema",
    "chainweaver://flows/../flows/product_search/schema",
    "chainweaver://flows/./product_search/schema",
    "chainweaver://flows/%2e%2e/write_flow/schema",
    "chainweaver://flows/%2E%2E/schema",
    "chainweaver://flows/product_search%2F..%2Fwrite_flow/schema",
    "chainweaver://flows/product_search%2Fschema",
    "chainweaver://flows/product%5Fsearch/schema",
    "chainweaver://flows/product_search/schema/extra",
    "chainweaver://flows/product_search/extra/schema",
    "chainweaver://flows/product_search/schema/",
    "chainweaver://flows/product_search",
    "chainweaver://flows/",
    "chainweaver://flows/product_search/schema?version=1.0.0",
    "chainweaver://flows?x=1",
    "chainweaver://flows/product_search/schema#input",
    "chainweaver://flows/" + "a" * 5000 + "/schema",
    "chainweaver://flows/{published_name}/schema",
    "chainweaver://flows//schema",
    " chainweaver://flows/product_search/schema",
]


@pytest.mark.anyio
async def test_malformed_uris_get_the_not_found_answer() -> None:
    async with Client(exposing().fastmcp) as client:
        for uri in MALFORMED:
            await assert_not_found_like_never(client, uri)
        # Lookups are exact: the real URIs still work after all of that.
        assert json.loads(await read_text(client, schema_uri("product_search")))["name"] == (
            "product_search")


@pytest.mark.anyio
async def test_a_version_other_than_the_exposed_one_is_not_found() -> None:
    uri = schema_uri("order_status")
    async with Client(exposing().fastmcp) as client:
        contents = await client.read_resource(uri, version="2.1.0")
        assert json.loads(contents[0].text)["version"] == "2.1.0"
        with pytest.raises(MCPError) as older:
            await client.read_resource(uri, version="1.9.0")
        with pytest.raises(MCPError) as unknown:
            await client.read_resource(NEVER, version="1.9.0")
    assert older.value.error.model_dump() == as_if_for(unknown.value.error, NEVER, uri)


# ------------------------------------------------------------- gate and audit


@pytest.mark.anyio
async def test_reads_are_audited_with_a_hash_and_length_lists_without() -> None:
    events: list[AuditEvent] = []
    server = exposing(security=SecurityConfig(audit_hook=events.append))
    async with Client(server.fastmcp) as client:
        await client.list_resources()
        await client.list_resource_templates()
        assert [(e.kind, e.name, e.result_sha256) for e in events] == [
            ("list", "resources/list", None), ("list", "resources/list", None),
            ("list", "resources/templates/list", None),
            ("list", "resources/templates/list", None)]
        events.clear()
        texts = {uri: await read_text(client, uri)
                 for uri in (INDEX, schema_uri("order_status"))}
    completed = [e for e in events if e.phase == "completed"]
    assert [e.name for e in completed] == list(texts)
    for event in completed:
        data = texts[event.name].encode("utf-8")
        assert event.kind == "resource" and event.decision == "allowed"
        assert event.outcome == "ok" and event.caller_id == "anonymous"
        assert event.result_sha256 == hashlib.sha256(data).hexdigest()
        assert event.result_length == len(data)
    by_name = {e.name: e for e in completed}
    assert (by_name[INDEX].flow_name, by_name[INDEX].flow_version) == (None, None)
    status = by_name[schema_uri("order_status")]
    assert (status.flow_name, status.flow_version) == ("order_status", "2.1.0")
    decisions = [e for e in events if e.phase == "decision"]
    assert [e.name for e in decisions] == list(texts)
    assert all(e.result_sha256 is None for e in decisions)


@pytest.mark.anyio
async def test_the_gate_refuses_reads_and_hooks_see_kind_resource() -> None:
    events: list[AuditEvent] = []
    seen: list[GateContext] = []

    def authorize(ctx: GateContext) -> AuthorizationDecision:
        seen.append(ctx)
        return AuthorizationDecision(ctx.name == INDEX, "schemas_closed")

    server = exposing(security=SecurityConfig(audit_hook=events.append, authorizer=authorize))
    async with Client(server.fastmcp) as client:
        await read_text(client, INDEX)
        with pytest.raises(MCPError) as caught:
            await client.read_resource(schema_uri("product_search"))
    assert caught.value.error.code == GATE_REFUSED
    assert caught.value.error.message == "Request refused: schemas_closed"
    assert caught.value.error.data == {"reason": "schemas_closed"}
    assert [ctx.kind for ctx in seen] == ["resource", "resource"]
    assert seen[1].flow_name == "product_search" and seen[1].caller.id == "anonymous"
    denied = [e for e in events if e.decision == "denied"]
    assert len(denied) == 1 and denied[0].reason == "schemas_closed"
    assert denied[0].kind == "resource" and denied[0].result_sha256 is None


# -------------------------------------------------------- over real transports


async def until_listening(port: int) -> None:
    """Wait for an in-process server's socket (bounded only to stop a broken test)."""
    with anyio.fail_after(STARTUP_TIMEOUT):
        while True:
            try:
                await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                return
            except OSError:
                await anyio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.anyio
async def test_serve_async_publishes_schemas_over_streamable_http() -> None:
    server = exposing(expose_prompts=True)
    port = free_port()
    async with anyio.create_task_group() as group:
        group.start_soon(functools.partial(server.serve_async, "streamable-http", port=port,
                                           path="/schemas-mcp"))
        try:
            await until_listening(port)
            url = f"http://127.0.0.1:{port}/schemas-mcp"
            async with Client(StreamableHttpTransport(url)) as client:
                uris = {str(r.uri) for r in await client.list_resources()}
                index = json.loads(await read_text(client, INDEX))
                await assert_not_found_like_never(client, schema_uri("write_flow"))
        finally:
            group.cancel_scope.cancel()
    assert uris == set(server.resource_uris)
    assert sorted(entry["tool_name"] for entry in index["flows"]) == sorted(EXPOSED)




async def snapshot(client: Client) -> dict[str, Any]:
    """Everything a client can learn from resources and prompts, as plain data."""
    # The owner mark in _meta is a random id per server process: compared apart.
    resources = [r.model_dump(exclude={"meta"}) for r in await client.list_resources()]
    prompts = await client.list_prompts()
    rendered = {}
    for prompt in prompts:
        arguments = {a.name: f"value-{a.name}" for a in prompt.arguments or () if a.required}
        if prompt.name in ("order_status",):
            arguments = {"order_id": "A-7"}
        rendered[prompt.name] = (await client.get_prompt(prompt.name, arguments)).model_dump()
    search = mcp_types.PromptReference(name="product_search")
    return {
        "resources": resources,
        "texts": {r["uri"]: await read_text(client, str(r["uri"])) for r in resources},
        "templates": [t.model_dump() for t in await client.list_resource_templates()],
        "template_completion": await complete_template(client, "p"),
        "prompts": [p.model_dump(exclude={"meta"}) for p in prompts],
        "meta": [published_meta(c) for c in [*await client.list_resources(), *prompts]
                 if c.meta and "chainweaver" in c.meta],
        "rendered": rendered,
        "completion": (await client.complete(search, {"name": "sort", "value": ""})).values,
        "excluded": [(await read_error(client, schema_uri(n))).model_dump()
                     for n in EXCLUDED_NAMES],
    }


async def in_memory_snapshot() -> dict[str, Any]:
    """The snapshot of the catalogue server's configuration, served in memory."""
    server = FlowServer(build_catalogue(), expose_schemas=True, expose_prompts=True,
                        serving=ServingConfig(name="catalogue"))
    async with Client(server.fastmcp) as client:
        expected = await snapshot(client)
    assert len(expected["texts"]) == len(EXPOSED) + 1
    assert set(expected["rendered"]) >= set(EXPOSED) | {"chainweaver_guide"}
    return expected


@pytest.mark.slow
@pytest.mark.anyio
async def test_stdio_serves_the_same_resources_and_prompts_as_in_memory(tmp_path: Path) -> None:
    transport = PythonStdioTransport(
        str(SERVER_SCRIPT), args=["stdio", "--expose"], python_cmd=sys.executable,
        keep_alive=False, log_file=tmp_path / "stderr.log",
    )
    async with Client(transport) as client:
        over_stdio = await snapshot(client)
    assert over_stdio == await in_memory_snapshot()


@pytest.mark.slow
@pytest.mark.anyio
async def test_streamable_http_serves_the_same_resources_and_prompts_as_in_memory(
    tmp_path: Path,
) -> None:
    port = free_port()
    with open(tmp_path / "server.log", "w") as output:
        process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), "streamable-http", "--port", str(port),
             "--expose"], stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(StreamableHttpTransport(url)) as client:
                over_http = await snapshot(client)
        finally:
            stop(process)
    assert over_http == await in_memory_snapshot()
