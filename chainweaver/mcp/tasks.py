"""Flows as MCP background tasks (``io.modelcontextprotocol/tasks``, SEP-2663).

Built on ``fastmcp-tasks`` and its Docket engine (in memory, or Redis for server
replicas and ``chainweaver worker`` processes). What ChainWeaver adds:

- **One task function for every flow.** Docket registers its task functions once, at
  server start, from ``Provider.get_tasks()``; a tool that becomes task-capable later
  would fail. So Docket knows exactly one function, :class:`FlowTaskRunner`, which runs
  any exposed flow named in its payload. Start stays O(1) in the catalogue, and a flow
  published later (or on another replica) runs as a task with nothing to register.
- **Creation through the exposure and the gate.** :class:`FlowTasksExtension` decides
  a ``tools/call`` after the gate (FastMCP runs extensions after middleware) and only for
  a tool the provider resolves, so a hidden flow is refused exactly like an unknown tool.
  The task is stored as ``fastmcp-tasks`` stores its own (scoped to the token's
  ``client_id|sub``), under the runner's key, so its ``tasks/get``, ``tasks/update``
  and ``tasks/cancel`` serve flow tasks unchanged.
- **Approval inside a task.** A flow that asks for approval returns the ask from its
  first leg (no step has run); ``fastmcp-tasks`` parks the task ``input_required``,
  and ``tasks/update`` enqueues the runner again with the answer (the next leg).
- **Tasks answer their creator, in its view.** The gate's caller id is stored with the
  task; ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` (gated like lists) answer
  only that caller, and only while the flow version is published and in its view;
  otherwise exactly like an unknown id. (Under an ``authenticator`` hook the token
  scope alone would let every caller reach every task.)
- **No side effect twice.** A run writes a marker when it starts. A run that finds the
  marker is a redelivery (its worker died mid-run): it goes ahead only when the flow is
  idempotent by its effective safety; otherwise the task fails with a reason saying so.
- **Status and audit.** Each step that starts becomes the task's status message
  (``step 2/5 enrich``); creation and each state change are audited as the gate's
  caller, completion with the result's SHA-256 and length.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from docket import CurrentExecution, Docket
from docket.execution import Execution
from fastmcp.dependencies import CurrentContext
from fastmcp.server.context import Context
from fastmcp.server.extensions import MethodBinding
from fastmcp.tools.base import InputRequiredToolResult, ToolResult
from fastmcp.tools.base import Tool as FastMCPTool
from fastmcp.utilities.tasks import TASKS_EXTENSION_ID, TaskConfig
from fastmcp.utilities.versions import VersionSpec
from fastmcp_tasks import TasksExtension
from fastmcp_tasks.context import get_task_context, get_task_scope
from fastmcp_tasks.creation import TASK_MAPPING_TTL_BUFFER_SECONDS, create_task
from fastmcp_tasks.dependencies import CurrentDocket
from fastmcp_tasks.input_store import is_cancelled, load_task_args
from fastmcp_tasks.models import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CreateTaskResult,
    missing_capability_error_data,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, TextContent
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import PrivateAttr

from ..run_events import RunObserver
from ..runner import StepRecord
from .composition import flow_of, owned_meta
from .exposure import ExposedFlow
from .fastmcp_seams import check_task_request, running_docket
from .hooks import AuditEvent, AuditHook, CallerIdentity, approval_decision, deliver_audit
from .provider import task_runner_resolvable
from .runs import ApprovalInTask, SharedMark, declared_elicitation
from .security import payload_text
from .views import CURRENT_CALLER, Views, current_caller

if TYPE_CHECKING:
    import mcp_types
    from fastmcp import FastMCP
    from fastmcp.server.extensions import ToolCallContinuation, ToolCallOutcome

    from .provider import FlowProvider

logger = logging.getLogger("chainweaver.mcp")

# The Docket function name of the one task function. Never a published tool: the
# provider finds it only inside a tasks/get (provider.task_runner_resolvable), so no
# client can list or call it.
RUNNER_NAME = "chainweaver.flow_task"
# Keys every flow task's payload has (how a flow task is told from fastmcp-tasks' own).
FLOW_TASK_KEYS = frozenset({"tool", "version", "arguments"})
TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]


def effective_idempotent(exposed: ExposedFlow) -> bool:
    """May a run of this flow be repeated? Only when its effective safety says so."""
    return exposed.safety is not None and bool(exposed.safety.idempotent)


class TaskAudit:
    """Sends task audit records (kind ``"task"``) to the server's audit hook."""

    def __init__(self, hook: AuditHook | None, timeout: float) -> None:
        self.hook = hook
        self.timeout = timeout

    async def record(self, exposed: ExposedFlow, task_id: str, status: TaskStatus,
                     caller_id: str | None, *,
                     phase: Literal["decision", "state", "completed", "approval"] = "state",
                     reason: str = "ok", result: ToolResult | None = None,
                     step_id: str | None = None) -> None:
        if self.hook is None:
            return
        digest = length = None
        outcome: Literal["ok", "error"] | None = None
        if result is not None:
            # Hashed as the gate hashes a call's result, so a task's digest and a call's
            # agree for the same result.
            data = payload_text("tool", result).encode("utf-8", "surrogatepass")
            digest, length = hashlib.sha256(data).hexdigest(), len(data)
            outcome = "error" if result.is_error else "ok"
        event = AuditEvent(
            timestamp=time.time(), phase=phase, kind="task", name=exposed.tool_name,
            flow_name=exposed.flow.name, flow_version=exposed.flow.version,
            caller_id=caller_id,
            decision=approval_decision(reason) if phase == "approval" else "allowed",
            reason=reason, outcome=outcome, result_sha256=digest, result_length=length,
            task_id=task_id, task_status=status, step_id=step_id)
        await deliver_audit(self.hook, event, self.timeout)


class FlowTaskRunner(FastMCPTool):
    """The one component Docket registers: runs the exposed flow its payload names.

    The payload is ``{"tool": published name, "version": flow version, "arguments":
    {...}, "caller": the gate's caller id, "approval": whether the flow asks for
    approval where the task was created, "client_can_answer": whether the creating
    client declared elicitation}``, written by :meth:`FlowTasksExtension.create`.
    """

    _provider: FlowProvider = PrivateAttr()
    _audit: TaskAudit = PrivateAttr()

    @classmethod
    def build(cls, provider: FlowProvider, audit: TaskAudit) -> FlowTaskRunner:
        runner = cls(name=RUNNER_NAME, parameters={"type": "object"},
                     task_config=TaskConfig(mode="optional"))
        runner._provider = provider
        runner._audit = audit
        return runner

    async def run(  # Docket injects the dependencies
        self,
        arguments: dict[str, Any],
        ctx: Context = CurrentContext(),  # noqa: B008  (dependency injection markers)
        execution: Execution = CurrentExecution(),  # noqa: B008
        docket: Docket = CurrentDocket(),  # noqa: B008
    ) -> ToolResult:
        # The leg runs as the caller that created the task, as far as its view goes: the
        # exposure, the view and the names a run shows are judged as for that caller.
        caller = task_caller(arguments)
        token = CURRENT_CALLER.set(caller) if caller is not None else None
        try:
            return await self._run_leg(arguments, ctx, execution, docket)
        finally:
            if token is not None:
                CURRENT_CALLER.reset(token)

    async def _run_leg(self, arguments: dict[str, Any], ctx: Context, execution: Execution,
                       docket: Docket) -> ToolResult:
        task_id = ctx.task_id or execution.key
        caller_id = arguments.get("caller")
        task = get_task_context()
        if await is_cancelled(docket, task.task_scope if task else None, task_id):
            # Cancelled while queued, or as its answer arrived: a leg Docket could not
            # stop any more (FlowTasksExtension audited the cancellation). Nothing runs.
            return ToolResult(content=[TextContent(type="text", text="cancelled")],
                              is_error=True)
        exposed = await self._runnable(arguments, ctx, execution, docket, task_id)
        await self._audit.record(exposed, task_id, "working", caller_id)
        tool = self._provider.flow_tool(exposed)
        reports = _StepReports(ctx, tool.step_names().label)

        async def audit_answer(step_id: str, answer: str) -> None:
            await self._audit.record(exposed, task_id, "working", caller_id,
                                     phase="approval", reason=answer, step_id=step_id)

        asking = ApprovalInTask(audit_answer, arguments.get("client_can_answer", True),
                                caller_id=caller_id)
        try:
            result = await tool.run_flow(arguments["arguments"], ctx, status=reports,
                                         in_task=asking)
        finally:
            await reports.drain()
        if isinstance(result, InputRequiredToolResult):
            # The flow asks for approval before any step runs. fastmcp-tasks' wrapper
            # keeps the ask with the task (input_required) and ends this leg; the
            # client's tasks/update enqueues the runner again, carrying the answer.
            await self._audit.record(exposed, task_id, "input_required", caller_id)
            return result
        await self._audit.record(exposed, task_id, "completed", caller_id,
                                 phase="completed", result=result)
        return result

    async def _runnable(self, arguments: dict[str, Any], ctx: Context, execution: Execution,
                        docket: Docket, task_id: str) -> ExposedFlow:
        """The exposed flow the payload names, if this process may run it now; else the
        task fails (MCPError) with the reason as its status message."""
        exposed = self._provider.exposure.tool(arguments["tool"])
        if (exposed is None or exposed.flow.version != arguments["version"]
                or not self._provider.view().allows(exposed)):
            # Not published any more, or no longer in the caller's view: the same words.
            raise MCPError(code=INTERNAL_ERROR, message=(
                f"flow {arguments['tool']!r} version {arguments['version']} is no longer "
                "published here; the task did not run"))
        if arguments.get("approval") and not exposed.needs_approval:
            # A worker whose policy differs (no --approval elicit, but
            # --allow-requires-approval) would otherwise run it without asking.
            raise MCPError(code=INTERNAL_ERROR, message=(
                f"flow {arguments['tool']!r} asks for approval where the task was created, "
                "but not on this worker (start it with --approval elicit); the task did "
                "not run"))
        # A leg that will only ask for approval runs no step: safe to run again, unmarked.
        asks_only = exposed.needs_approval and ctx.request_state is None
        if (not asks_only and not await _first_run(docket, execution.key)
                and not effective_idempotent(exposed)):
            await self._audit.record(exposed, task_id, "failed", arguments.get("caller"),
                                     reason="not_idempotent")
            raise MCPError(code=INTERNAL_ERROR, message=(
                f"the worker running flow {exposed.flow.name!r} stopped during the run, "
                "and the flow is not idempotent (by its effective safety), so it was not "
                "run again"))
        return exposed


class _StepReports(RunObserver):
    """Turns each step that starts into the task's status (``ctx.report_progress``).

    Steps start on the event loop or in worker threads; every report is sent from the
    loop, in the run's context (the worker's task context lives there), in order.
    """

    def __init__(self, ctx: Context, label: Callable[[str], str] | None = None) -> None:
        self.ctx = ctx
        self.label = label  # a step's id as the task's caller may see it
        self.loop = asyncio.get_running_loop()
        self.context = contextvars.copy_context()
        self.last: asyncio.Future[None] | None = None
        self.total = 0
        self.started = 0
        self._lock = threading.Lock()

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self.total = total_steps

    def step_started(self, record: StepRecord) -> None:
        with self._lock:  # steps of the async lane start on the loop and in threads
            self.started += 1
            number = self.started
        step_id = self.label(record.step_id) if self.label is not None else record.step_id
        self.loop.call_soon_threadsafe(self._send, number, self.total, step_id,
                                       context=self.context)

    def _send(self, number: int, total: int, step_id: str) -> None:
        self.last = asyncio.ensure_future(self._report(self.last, number, total, step_id))

    async def _report(self, previous: asyncio.Future[None] | None, number: int, total: int,
                      step_id: str) -> None:
        if previous is not None:
            await previous
        try:
            await self.ctx.report_progress(number, total, f"step {number}/{total} {step_id}")
        except Exception as error:  # a lost status message must not fail the run
            logger.debug("task status report failed: %s", type(error).__name__)

    async def drain(self) -> None:
        await asyncio.sleep(0)  # reports queued from worker threads
        if self.last is not None:
            await self.last


def view_grant(views: Views, caller: CallerIdentity) -> dict[str, Any] | None:
    """What a task keeps of its caller so that its legs see the caller's view: the
    scopes and the claims the view rule reads (nothing without a rule)."""
    visibility = views.visibility
    if visibility is None:
        return None
    claims = {name: caller.claims[name] for name in visibility.claims
              if name in caller.claims}
    return {"scopes": sorted(caller.scopes), "claims": claims}


def task_caller(arguments: dict[str, Any]) -> CallerIdentity | None:
    """The caller a task's leg runs as (None: the task kept no view grant)."""
    grant = arguments.get("grant")
    caller_id = arguments.get("caller")
    if not isinstance(grant, dict) or not isinstance(caller_id, str):
        return None
    scopes = grant.get("scopes")
    claims = grant.get("claims")
    return CallerIdentity(caller_id, dict(claims) if isinstance(claims, dict) else {},
                          scopes=frozenset(s for s in scopes or () if isinstance(s, str)))


async def _first_run(docket: Docket, execution_key: str) -> bool:
    """Mark this execution as started; False when it was already (a redelivery)."""
    return await _mark_once(docket, f"chainweaver:task-run:{execution_key}")


async def _mark_once(docket: Docket, name: str) -> bool:
    """Set a marker that lives as long as a task's keys; False when it was set already."""
    ttl = int(docket.execution_ttl.total_seconds()) + TASK_MAPPING_TTL_BUFFER_SECONDS
    async with docket.redis() as redis:
        return bool(await redis.set(docket.key(name), "1", nx=True, ex=ttl))


class FlowTasksExtension(TasksExtension):
    """The tasks extension, creating flow tasks through the exposure (see the module)."""

    def __init__(self, provider: FlowProvider, audit: TaskAudit, **settings: Any) -> None:
        super().__init__(**settings)
        self.provider = provider
        self.audit = audit
        # An approval state a 2026-07-28 client echoes is used up in the task backend's
        # store: with Redis, every replica on it refuses a replay (see runs.ApprovalNonces).
        provider.runs.nonces.shared = self._approval_states

    def _approval_states(self) -> SharedMark | None:
        """Marks an approval state as used in the running Docket's Redis (None: not
        running, and the process record answers)."""
        try:
            docket = _server_docket(self.server)
        except RuntimeError:  # not registered on a server (yet)
            return None
        if docket is None:
            return None
        running: Docket = docket

        async def mark(nonce: str, expires: float) -> bool | None:
            ttl = max(1, int(expires - time.time()) + 1)
            try:
                async with running.redis() as redis:
                    return bool(await redis.set(
                        running.key(f"chainweaver:approval-state:{nonce}"), "1",
                        nx=True, ex=ttl))
            except Exception as error:  # cannot tell whether it was used: refused
                logger.warning("approval state refused: the task store failed (%s)",
                               type(error).__name__)
                return False

        return mark

    async def intercept_tool_call(
        self,
        params: mcp_types.CallToolRequestParams,
        context: Context,
        call_next: ToolCallContinuation,
    ) -> ToolCallOutcome:
        """Run the call as a task when the flow's mode and the client ask for it.

        ``required``: always a task (-32021 when the client did not opt in, as on
        2025-11-25); ``optional``: a task when the client opted in; otherwise, and
        for anything that is not an exposed flow, the ordinary call.
        """
        # An unknown or hidden name is None here: the ordinary call answers it, exactly
        # as for any name that never existed. The flow is found from the owner mark in
        # the tool's metadata, so a transform on server.fastmcp (a rename) keeps its mode.
        tool = await context.fastmcp.get_tool(params.name, _requested_version(params))
        meta = owned_meta(tool, self.provider.owner)
        exposed = flow_of(self.provider.exposure.current, meta) if meta is not None else None
        if exposed is None or exposed.task_mode == "forbidden":
            return await call_next()
        mode = exposed.task_mode
        request = context.request_context
        opted_in = (request is not None
                    and request.protocol_version in MODERN_PROTOCOL_VERSIONS
                    and context.client_extension_settings(TASKS_EXTENSION_ID) is not None)
        if mode == "required" and not opted_in:
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message=f"Tool {params.name!r} runs only as a background task: the client must "
                f"support the tasks extension ({TASKS_EXTENSION_ID}), which needs protocol "
                "2026-07-28 or later, and ask for a task",
                data=missing_capability_error_data())
        if not opted_in:
            return await call_next()
        return await self.create(exposed, dict(params.arguments or {}), context)

    async def create(self, exposed: ExposedFlow, arguments: dict[str, Any],
                     context: Context) -> CreateTaskResult:
        """Create and enqueue a task running ``exposed``'s flow, through fastmcp-tasks.

        fastmcp-tasks creates it for the one runner (under the runner's key, scoped to
        the token), with the flow named in the payload, so its ``tasks/get``,
        ``tasks/update`` and ``tasks/cancel`` serve it unchanged. Returns once
        ``tasks/get`` resolves the task on any replica.
        """
        # The gate's caller owns the task: every tasks/* request checks it (_owned), and
        # the task's audit records name it. Stored with the arguments, which live (and
        # are refreshed) exactly as long as the task's other keys.
        caller = current_caller()
        caller_id = caller.id
        payload = {"tool": exposed.tool_name, "version": exposed.flow.version,
                   "arguments": arguments, "caller": caller_id,
                   "approval": exposed.needs_approval,
                   "client_can_answer": declared_elicitation(context)}
        grant = view_grant(self.provider.views, caller)
        if grant is not None:
            payload["grant"] = grant
        created = await create_task(await self.registered_runner(), payload, context)
        await self.audit.record(exposed, created.task_id, "working", caller_id,
                                phase="decision", reason="created")
        return created

    def methods(self) -> Sequence[MethodBinding]:
        """``tasks/get``, ``tasks/update`` and ``tasks/cancel``, answering only the
        caller that created a flow task, while the flow is in its view."""
        return [dataclasses.replace(binding, handler=self._owned(binding.method, binding.handler))
                for binding in super().methods()]

    def _owned(self, method: str, handler: Any) -> Any:
        async def handle(ctx: Any, params: Any) -> Any:
            # The extension's own checks (capability, Mcp-Name header) come first, so
            # that another caller's task id and an id that never existed get past them
            # alike; fastmcp-tasks runs them again in ``handler`` (they are cheap).
            check_task_request(self, ctx, params.task_id)
            exposed = await self.reachable_flow(params.task_id)
            if method == "tasks/get":
                with task_runner_resolvable():
                    return await handler(ctx, params)
            if method == "tasks/cancel" and exposed is not None:
                return await self._cancel(exposed, params.task_id, handler, ctx, params)
            return await handler(ctx, params)

        return handle

    async def _cancel(self, exposed: ExposedFlow, task_id: str, handler: Any, ctx: Any,
                      params: Any) -> Any:
        """Cancel, and audit the cancellation exactly once, whatever the task was doing
        (running, waiting for an answer, queued) and however many cancels race; a
        finished task is not cancelled, so nothing is audited for it."""
        result = await handler(ctx, params)
        docket, scope = self.docket, get_task_scope()
        if (await is_cancelled(docket, scope, task_id)
                and await _mark_once(docket, f"chainweaver:task-cancel:{scope}:{task_id}")):
            await self.audit.record(exposed, task_id, "cancelled", current_caller().id)
        return result

    async def reachable_flow(self, task_id: str) -> ExposedFlow | None:
        """Refuse a flow task the current caller may not reach, exactly like an unknown id.

        Reachable: created by this caller (the gate's caller id, stored with the task),
        and its flow version is still published and in the caller's view. A run already
        under way finishes either way; only answers about it stop. Returns the task's
        exposed flow (None when the id names no flow task here: fastmcp-tasks answers).
        """
        docket = _server_docket(self.server)
        if docket is None:
            return None  # pragma: no cover - no request is served before the lifespan starts it
        payload = await load_task_args(docket, get_task_scope(), task_id)
        if not FLOW_TASK_KEYS <= payload.keys():
            # No such task in this token scope (or not a flow task): fastmcp-tasks
            # answers it.
            return None
        exposed = self.provider.exposure.tool(payload["tool"])
        if (payload.get("caller") != current_caller().id or exposed is None
                or exposed.flow.version != payload.get("version")
                or not self.provider.view().allows(exposed)):
            # The text fastmcp-tasks gives for a missing, expired or cross-scope id.
            raise MCPError(code=INVALID_PARAMS, message=f"Task {task_id} not found")
        return exposed

    async def registered_runner(self) -> FastMCPTool:
        """The runner as Docket registered it: through the server's transforms (a
        Namespace renames it), so its key is the one Docket and tasks/update know."""
        for component in await self.server.get_tasks():
            if isinstance(component, FlowTaskRunner):
                return component
        raise MCPError(code=INTERNAL_ERROR, message="background tasks are not running")

    @property
    def docket(self) -> Docket:
        """The running Docket (FastMCP keeps it on the server while it runs)."""
        docket = _server_docket(self.server)
        if docket is None:
            raise MCPError(code=INTERNAL_ERROR, message="background tasks are not running")
        return docket


def _server_docket(server: FastMCP) -> Docket | None:
    return cast("Docket | None", running_docket(server))


def _requested_version(params: mcp_types.CallToolRequestParams) -> VersionSpec | None:
    from fastmcp.server.dependencies import extract_version_spec

    text = extract_version_spec(cast("dict[str, Any] | None", params.meta))
    return VersionSpec(eq=text) if text else None
