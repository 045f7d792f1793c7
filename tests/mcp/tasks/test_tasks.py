"""Flows as MCP background tasks, in memory (``FlowServer(tasks="memory://")``).

Real fastmcp clients on both protocol eras: 2026-07-28 creates tasks, 2025-11-25 gets
ordinary calls (optional) or a clear refusal (required). The Redis, multi-process and
authenticated cases are in tests/e2e/test_tasks_redis.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_context
from fastmcp_tasks import ToolTask, call_tool_task
from mcp import MCPError
from pydantic import BaseModel
from servers import task_tools
from support import polling
from support.catalogue import build_catalogue

from chainweaver import DefinitionError, ExposureConfigError, Flow, FlowStep, Tool
from chainweaver.errors import FlowFileError
from chainweaver.executor import FlowExecutor
from chainweaver.files import find_flow_files, flow_from_data, load_flows
from chainweaver.flow_format import flow_file_schema
from chainweaver.mcp import (
    GATE_REFUSED,
    AuditEvent,
    ExposurePolicy,
    FlowServer,
    SecurityConfig,
    TaskSettings,
)
from chainweaver.mcp.components.provider import FlowProvider
from chainweaver.mcp.fastmcp_seams import lifespan_manager, running_docket
from chainweaver.mcp.tasks.runner import RUNNER_NAME, effective_idempotent
from chainweaver.registry import FlowRegistry

FLOWS = Path(__file__).resolve().parents[2] / "servers" / "task_flows"
TOOLS = (task_tools.fetch, task_tools.enrich, task_tools.finish, task_tools.charge,
         task_tools.lookup, task_tools.refund)
LIMIT = 10.0  # seconds: only to stop a hang


def executor() -> FlowExecutor:
    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    for tool in TOOLS:
        executor.register_tool(tool)
    for flow in load_flows(find_flow_files([FLOWS]), tools=executor.tools):
        registry.register_flow(flow)
    return executor


def server(tasks: str | TaskSettings | None = "memory://",
           audit: list[AuditEvent] | None = None, **options: Any) -> FlowServer:
    return FlowServer(executor(), tasks=tasks,
                      policy=ExposurePolicy(allowed_side_effects=["read", "write"]),
                      security=SecurityConfig(audit_hook=audit.append
                                              if audit is not None else None),
                      **options)


def provider_of(flow_server: FlowServer) -> FlowProvider:
    (provider,) = [p for p in flow_server.fastmcp.providers if isinstance(p, FlowProvider)]
    return provider


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    task_tools.COUNTS.clear()
    task_tools.HOLD = None
    yield
    task_tools.HOLD = None


until = partial(polling.until, limit=LIMIT)


# ------------------------------------------------------------------ advertising


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_each_tool_advertises_its_effective_task_mode(mode: str) -> None:
    async with Client(server().fastmcp, mode=mode) as client:  # type: ignore[arg-type]
        tools = {tool.name: tool for tool in await client.list_tools()}
    modes = {name: tool.meta["chainweaver"]["task_mode"] for name, tool in tools.items()}
    assert modes == {"report": "optional", "charge_order": "required",
                     "lookup_order": "required", "quick": "forbidden"}
    if mode == "legacy":  # 2025-11-25 has a field for it too
        support = {name: tool.execution.task_support if tool.execution else None
                   for name, tool in tools.items()}
        assert support == {"report": "optional", "charge_order": "required",
                           "lookup_order": "required", "quick": None}


def test_the_server_default_applies_to_flows_that_set_none() -> None:
    names = provider_of(server(TaskSettings(mode="required"))).task_tool_names()
    assert names == ["charge_order", "lookup_order", "report"]
    assert provider_of(server(TaskSettings(mode="forbidden"))).task_tool_names() == [
        "charge_order", "lookup_order"]


def test_without_a_backend_no_flow_is_a_task_and_required_flows_are_excluded() -> None:
    plain = server(tasks=None)
    assert provider_of(plain).task_tool_names() == []
    reasons = {entry.flow_name: entry.reason for entry in plain.exposure_report()}
    assert reasons["charge_order"] == ("it runs only as a background task, and the "
                                       "server has no task backend")
    assert reasons["report"] is None


# ------------------------------------------------------------ 2026-07-28 tasks


@pytest.mark.anyio
async def test_a_task_reports_the_current_step_and_inlines_the_result() -> None:
    task_tools.HOLD = asyncio.Event()
    async with Client(server().fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        assert len(task.task_id) >= 40  # 32 random bytes, URL-safe: unguessable

        async def at_enrich() -> Any:
            status = await task.status()
            return status if status.status_message == "step 2/3 enrich" else None

        status = await until(at_enrich, "the status of step 2")
        assert status.status == "working"
        task_tools.HOLD.set()
        result = await asyncio.wait_for(task.result(), LIMIT)
        plain = await client.call_tool("quick", {"n": 1})
    assert result.structured_content == {"n": 21}
    assert result.meta["chainweaver"]["flow"] == "report"
    assert plain.structured_content == {"n": 2}


@pytest.mark.anyio
async def test_a_task_and_a_plain_call_give_the_same_result() -> None:
    flow_server = server(TaskSettings(mode="forbidden"))  # report runs inline here
    async with Client(flow_server.fastmcp) as client:
        inline = await client.call_tool("report", {"n": 4})
    async with Client(server().fastmcp) as client:
        tasked = await asyncio.wait_for(
            (await call_tool_task(client, "report", {"n": 4})).result(), LIMIT)
    assert tasked.content == inline.content
    assert tasked.structured_content == inline.structured_content


@pytest.mark.anyio
async def test_a_forbidden_flow_never_becomes_a_task() -> None:
    async with Client(server().fastmcp) as client:
        with pytest.raises(ToolError):
            await call_tool_task(client, "quick", {"n": 1})
        assert (await client.call_tool("quick", {"n": 1})).structured_content == {"n": 2}


@pytest.mark.anyio
async def test_a_cancelled_task_stops_and_reports_cancelled() -> None:
    task_tools.HOLD = asyncio.Event()
    audit: list[AuditEvent] = []
    async with Client(server(audit=audit).fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})

        async def enriching() -> bool:
            return task_tools.COUNTS["enrich"] == 1

        await until(enriching, "the enrich step")
        await task.cancel()
        await task.cancel()  # a second cancel changes nothing, and is not audited again
        assert (await task.status()).status == "cancelled"

        async def stopped() -> bool:  # the cancellation reached the running step
            return task_tools.COUNTS["enrich-cancelled"] == 1

        await until(stopped, "the run to stop")
        task_tools.HOLD.set()
        await asyncio.sleep(0.1)
    assert task_tools.COUNTS["finish"] == 0
    assert [e.task_status for e in audit if e.task_status == "cancelled"] == ["cancelled"]


@pytest.mark.anyio
async def test_bad_arguments_complete_the_task_with_an_error_result() -> None:
    async with Client(server().fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": "many"}, raise_on_error=False)
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert result.is_error
    assert "Invalid arguments for 'report'" in result.content[0].text


@pytest.mark.anyio
async def test_arguments_json_cannot_carry_are_invalid_params_and_create_no_task() -> None:
    # Only an in-memory client can send a number past Python's 4,300-digit limit; the
    # task's payload is stored as JSON, so the call is refused before a task exists.
    audit: list[AuditEvent] = []
    async with Client(server(audit=audit).fastmcp) as client:
        with pytest.raises(MCPError) as caught:
            await call_tool_task(client, "report", {"n": 10**5000})
        assert caught.value.error.code == -32602
        assert caught.value.error.message == (
            "Invalid arguments for 'report': a value cannot be stored as JSON")
        task = await call_tool_task(client, "report", {"n": 2})  # still serving
        assert not (await asyncio.wait_for(task.result(), LIMIT)).is_error
    assert len({e.task_id for e in audit if e.task_id}) == 1  # the second call's


# ----------------------------------------------------------- governance, ids


async def _call_error(client: Client, name: str) -> tuple[type, str]:
    try:
        await call_tool_task(client, name, {"n": 1})
    except Exception as error:  # noqa: BLE001 - the type and text are what is compared
        return type(error), str(error).replace(name, "NAME")
    raise AssertionError(f"{name} was accepted")


@pytest.mark.anyio
async def test_a_task_for_a_hidden_flow_is_refused_like_an_unknown_tool() -> None:
    flow_server = FlowServer(executor(), tasks="memory://")  # write flows: not exposed
    assert "charge_order" not in flow_server.registered_tool_names
    async with Client(flow_server.fastmcp) as client:
        hidden = await _call_error(client, "charge_order")
        unknown = await _call_error(client, "never_existed")
    assert hidden == unknown


@pytest.mark.anyio
async def test_the_gate_refuses_a_task_exactly_as_it_refuses_the_call() -> None:
    audit: list[AuditEvent] = []
    security = SecurityConfig(authorizer=lambda gate: gate.flow_name != "report",
                              audit_hook=audit.append)
    flow_server = FlowServer(executor(), tasks="memory://", security=security)
    async with Client(flow_server.fastmcp) as client:
        with pytest.raises(MCPError) as as_task:
            await call_tool_task(client, "report", {"n": 1})
        with pytest.raises(MCPError) as as_call:
            await client.call_tool("report", {"n": 1})
    assert as_task.value.error == as_call.value.error
    assert as_task.value.error.code == GATE_REFUSED
    assert task_tools.COUNTS["enrich"] == 0
    assert not [event for event in audit if event.kind == "task"]


@pytest.mark.anyio
async def test_steps_in_worker_threads_report_their_status_too() -> None:
    release = threading.Event()

    def wait(data: task_tools.Number) -> task_tools.Number:
        release.wait(LIMIT)
        return data

    tools = executor()
    tools.register_tool(Tool("wait", "Wait in a thread.", task_tools.Number, task_tools.Number,
                             wait, task_tools.READ))
    tools.registry.register_flow(Flow("threaded", "Sync steps.", [
        FlowStep("fetch"), FlowStep("wait", id="blocked")]))
    async with Client(FlowServer(tools, tasks="memory://").fastmcp) as client:
        task = await call_tool_task(client, "threaded", {"n": 1})

        async def blocked() -> bool:
            return (await task.status()).status_message == "step 2/2 blocked"

        await until(blocked, "the status of the threaded step")
        release.set()
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert result.structured_content == {"n": 2}


class TaskId(BaseModel):
    task_id: str | None


@pytest.mark.anyio
async def test_the_run_has_the_tasks_context_like_a_call_has_the_requests() -> None:
    # FlowTool.run and its steps can use FastMCP's get_context() inside a worker too
    # (progress and logging during a run rely on it).
    async def whoami(data: task_tools.Number) -> TaskId:
        return TaskId(task_id=get_context().task_id)

    tools = executor()
    tools.register_tool(Tool("whoami", "The task id.", task_tools.Number, TaskId, whoami,
                             task_tools.READ))
    tools.registry.register_flow(Flow("whoami", "Who runs me?", [FlowStep("whoami")]))
    async with Client(FlowServer(tools, tasks="memory://").fastmcp) as client:
        task = await call_tool_task(client, "whoami", {"n": 1})
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert result.structured_content == {"task_id": task.task_id}


@pytest.mark.anyio
async def test_an_unknown_task_id_is_not_found() -> None:
    async with Client(server().fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        await asyncio.wait_for(task.result(), LIMIT)
        with pytest.raises(MCPError) as missing:
            await other_id(task, task.task_id[::-1]).status()
    assert missing.value.error.code == -32602
    assert missing.value.error.message == f"Task {task.task_id[::-1]} not found"


def other_id(task: ToolTask, task_id: str) -> ToolTask:
    """A handle to another task id through the same client (public ToolTask API)."""
    created = task.create_result.model_copy(update={"task_id": task_id})
    return ToolTask(task._client, "report", created)


# ------------------------------------------------------------------ 2025-11-25


@pytest.mark.anyio
async def test_legacy_clients_get_optional_flows_inline() -> None:
    async with Client(server().fastmcp, mode="legacy") as client:
        result = await client.call_tool("report", {"n": 1})
    assert result.structured_content == {"n": 21}


@pytest.mark.anyio
async def test_legacy_clients_are_refused_required_flows_clearly() -> None:
    async with Client(server().fastmcp, mode="legacy") as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("charge_order", {"order": "A-1"})
    assert refused.value.error.code == -32021
    assert "runs only as a background task" in refused.value.error.message
    assert task_tools.COUNTS["charge:A-1"] == 0


@pytest.mark.anyio
async def test_modern_clients_run_required_flows_as_tasks() -> None:
    async with Client(server().fastmcp) as client:
        result = await client.call_tool("charge_order", {"order": "A-2"})
    assert result.structured_content == {"order": "A-2", "count": 1}


# ---------------------------------------------------------------------- audit


@pytest.mark.anyio
async def test_the_audit_records_creation_each_state_and_the_result_digest() -> None:
    audit: list[AuditEvent] = []
    async with Client(server(audit=audit).fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        result = await asyncio.wait_for(task.result(), LIMIT)
    # The task's own records (the gate's records of the tasks/get polls have no status).
    events = [event for event in audit if event.kind == "task" and event.task_status]
    assert [(e.phase, e.task_status) for e in events] == [
        ("decision", "working"), ("state", "working"), ("completed", "completed")]
    assert {e.task_id for e in events} == {task.task_id}
    assert {(e.flow_name, e.flow_version, e.name) for e in events} == {
        ("report", "1.0.0", "report")}
    text = result.content[0].text.encode()
    assert events[-1].result_sha256 == hashlib.sha256(text).hexdigest()
    assert events[-1].result_length == len(text)
    assert events[-1].outcome == "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["async", "failing"])
async def test_async_and_failing_audit_hooks(kind: str) -> None:
    seen: list[AuditEvent] = []

    async def async_hook(event: AuditEvent) -> None:
        seen.append(event)

    def failing_hook(event: AuditEvent) -> None:
        raise RuntimeError("the audit store is down")

    hook = async_hook if kind == "async" else failing_hook
    flow_server = FlowServer(executor(), tasks="memory://",
                             security=SecurityConfig(audit_hook=hook))
    async with Client(flow_server.fastmcp) as client:
        task = await call_tool_task(client, "report", {"n": 1})
        result = await asyncio.wait_for(task.result(), LIMIT)
    assert result.structured_content == {"n": 21}  # auditing never breaks a task
    if kind == "async":
        assert [e.task_status for e in seen if e.kind == "task" and e.task_status] == [
            "working", "working", "completed"]


def test_only_flows_idempotent_by_their_effective_safety_may_run_again() -> None:
    exposed = {name: provider_of(server()).exposure.tool(name)
               for name in ("report", "charge_order", "lookup_order")}
    assert {name: effective_idempotent(flow) for name, flow in exposed.items()
            if flow is not None} == {"report": True, "charge_order": False,
                                     "lookup_order": True}


@pytest.mark.anyio
async def test_each_in_memory_server_runs_only_its_own_tasks() -> None:
    # Docket keeps one in-memory store per URL and event loop; two memory:// servers in
    # one process must not share a queue (one would run the other's tasks, with its own
    # catalogue and governance).
    enqueue_only = server(TaskSettings(concurrency=0))
    running = server()
    async with Client(enqueue_only.fastmcp) as queued_client, \
            Client(running.fastmcp) as running_client:
        queued = await call_tool_task(queued_client, "report", {"n": 1})
        # The running server works through its own queue: its task, created later,
        # completes, while the first one stays queued on its own server.
        own = await call_tool_task(running_client, "report", {"n": 2})
        assert (await asyncio.wait_for(own.result(), LIMIT)).structured_content == {
            "n": 31}
        status = await queued.status()
    assert (status.status, status.status_message) == ("working",
                                                      "queued: waiting for a worker")
    assert task_tools.COUNTS["enrich"] == 1  # only the running server's own task ran


# ---------------------------------------------------------------- start-up cost


@pytest.mark.anyio
@pytest.mark.parametrize("flows", [1, 500])
async def test_start_registers_one_task_function_whatever_the_catalogue(flows: int) -> None:
    catalogue = executor()
    for index in range(flows):
        catalogue.registry.register_flow(Flow(f"f{index:04d}", "d", [FlowStep("fetch")]))
    flow_server = FlowServer(catalogue, tasks="memory://")
    provider = provider_of(flow_server)
    async with Client(flow_server.fastmcp) as client:
        assert provider.components_built == 0  # nothing built, nothing decided
        components = list(await flow_server.fastmcp.get_tasks())
        # A flow nobody looked at before runs as a task: nothing to register.
        result = await call_tool_task(client, f"f{flows - 1:04d}", {"n": 1})
        assert (await asyncio.wait_for(result.result(), LIMIT)).structured_content == {
            "n": 2}
    assert [c.name for c in components] == [RUNNER_NAME]


@pytest.mark.anyio
async def test_a_server_without_tasks_has_no_task_components() -> None:
    flow_server = FlowServer(build_catalogue())
    assert list(await flow_server.fastmcp.get_tasks()) == []


@pytest.mark.anyio
async def test_the_runner_is_never_a_published_tool() -> None:
    async with Client(server().fastmcp) as client:
        assert RUNNER_NAME not in {tool.name for tool in await client.list_tools()}
        never = await client.call_tool("never_existed", {}, raise_on_error=False)
        runner = await client.call_tool(RUNNER_NAME, {}, raise_on_error=False)
    assert runner.is_error and never.is_error
    assert runner.content[0].text.replace(RUNNER_NAME, "X") == \
        never.content[0].text.replace("never_existed", "X")


@pytest.mark.anyio
async def test_the_private_fastmcp_entry_points_used_for_tasks_still_exist() -> None:
    # fastmcp_seams reads the running Docket (server._docket) and enters
    # FastMCP._lifespan_manager() for workers: fail loudly when FastMCP moves them.
    flow_server = server()
    assert hasattr(flow_server.fastmcp, "_lifespan_manager")
    assert running_docket(flow_server.fastmcp) is None  # not started yet
    async with Client(flow_server.fastmcp):
        assert running_docket(flow_server.fastmcp) is not None
    assert callable(getattr(lifespan_manager(flow_server.fastmcp), "__aenter__", None))


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(("options", "message"), [
    ({"tasks": "ftp://x"}, "tasks must be None or a URL"),
    ({"tasks": 3}, "tasks must be None or a URL"),
    ({"tasks": {"mode": "sometimes"}}, "task_mode must be one of"),
])
def test_bad_task_configuration_is_refused_at_construction(
        options: dict[str, Any], message: str) -> None:
    with pytest.raises(ExposureConfigError, match=message):
        tasks = options["tasks"]
        FlowServer(executor(), tasks=TaskSettings(**tasks) if isinstance(tasks, dict) else tasks)


@pytest.mark.parametrize(("settings", "message"), [
    ({"concurrency": -1}, "concurrency must be None or an int >= 0"),
    ({"concurrency": True}, "concurrency must be None or an int >= 0"),
    ({"redelivery_timeout": 0}, "redelivery_timeout must be"),
    ({"encryption_key": ""}, "encryption_key must be"),
    ({"name": 5}, "name must be"),
])
def test_bad_task_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ExposureConfigError, match=message):
        TaskSettings(**settings)


def test_task_settings_reach_the_engine() -> None:
    flow_server = server(TaskSettings(concurrency=0, redelivery_timeout=2, name="cw-test"))
    (extension,) = flow_server.fastmcp._extensions.values()
    docket = extension.docket_settings  # type: ignore[attr-defined]
    assert (docket.concurrency, docket.redelivery_timeout.total_seconds(), docket.name) == (
        0, 2.0, "cw-test")


def test_an_encryption_key_protects_stored_request_contexts() -> None:
    from fastmcp_tasks.encryption import snapshot_codec
    from fastmcp_tasks.settings import tasks_settings

    before = tasks_settings.encryption_key
    try:
        server(TaskSettings(encryption_key="k" * 32))
        codec = snapshot_codec()
        stored = codec.encode('{"access_token_json": "secret"}')
        assert codec.protected and "secret" not in stored
    finally:
        tasks_settings.encryption_key = before


def test_a_server_with_tasks_cannot_be_mounted_yet() -> None:
    from fastmcp import FastMCP

    with pytest.raises(ExposureConfigError, match="cannot be mounted yet"):
        server().mount_into(FastMCP("parent"))


def test_run_worker_needs_a_shared_queue() -> None:
    with pytest.raises(ExposureConfigError, match="run_worker needs tasks='redis://"):
        server().run_worker()


def test_flow_task_mode_is_checked() -> None:
    with pytest.raises(DefinitionError, match="task_mode must be one of"):
        Flow("f", "d", [FlowStep("fetch")], task_mode="always")  # type: ignore[arg-type]
    with pytest.raises(ExposureConfigError, match="task_mode must be one of"):
        ExposurePolicy(task_mode="always")  # type: ignore[arg-type]


def test_flow_files_take_a_task_mode_and_the_schema_says_so() -> None:
    data = {"name": "f", "description": "d", "steps": ["fetch"]}
    assert flow_from_data({**data, "task_mode": "required"}).task_mode == "required"
    assert flow_from_data(data).task_mode is None
    with pytest.raises(FlowFileError, match="task_mode"):
        flow_from_data({**data, "task_mode": "later"})
    spec = flow_file_schema()["properties"]["task_mode"]
    assert spec["enum"] == ["forbidden", "optional", "required"]
