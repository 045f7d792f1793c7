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
  (``step 2/5 enrich``; a task whose worker stopped says so until it is redelivered:
  ``durable.as_seen``); creation and each state change are audited as the gate's
  caller, completion with the result's SHA-256 and length.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from docket import Docket
from fastmcp.server.context import Context
from fastmcp.server.extensions import MethodBinding
from fastmcp.tools.base import Tool as FastMCPTool
from fastmcp.utilities.tasks import TASKS_EXTENSION_ID
from fastmcp.utilities.versions import VersionSpec
from fastmcp_tasks import TasksExtension
from fastmcp_tasks.context import get_task_scope
from fastmcp_tasks.creation import create_task
from fastmcp_tasks.input_store import is_cancelled, load_task_args
from fastmcp_tasks.models import (
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CreateTaskResult,
    GetTaskResult,
    missing_capability_error_data,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from chainweaver.mcp.fastmcp_seams import (
    check_task_request,
    poll_busy_slots,
    running_docket,
)
from chainweaver.mcp.gate import admission
from chainweaver.mcp.publish.exposure import ExposedFlow
from chainweaver.mcp.publish.run_uris import RUNS_URI
from chainweaver.mcp.runs.approval import declared_elicitation
from chainweaver.mcp.runs.recording import RunRecorder, run_start
from chainweaver.mcp.runs.step_names import ALL_VISIBLE, StepNames, relabelled
from chainweaver.mcp.tasks.durable import as_seen, mark_queued

if TYPE_CHECKING:
    import mcp_types
    from fastmcp import FastMCP
    from fastmcp.server.extensions import ToolCallContinuation, ToolCallOutcome

    from chainweaver.mcp.components.flow_tool import FlowTool
    from chainweaver.mcp.components.provider import FlowProvider

from chainweaver.mcp.tasks.runner import (
    FLOW_TASK_KEYS,
    FlowTaskRunner,
    TaskAudit,
    kept_caller,
    mark_once,
    step_checks,
)

logger = logging.getLogger("chainweaver.mcp")


class FlowTasksExtension(TasksExtension):
    """The tasks extension, creating flow tasks through the exposure (see the module)."""

    def __init__(self, provider: FlowProvider, audit: TaskAudit, **settings: Any) -> None:
        super().__init__(**settings)
        self.provider = provider
        self.audit = audit
        self._runner: tuple[Docket, FastMCPTool] | None = None  # (its start's Docket, it)

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
        # The flow the gate admitted the call for (under any transform): an unknown or
        # hidden name has none, and the ordinary call answers it, exactly as for any
        # name that never existed. A version the client asked for that is not the
        # published one finds no tool: the ordinary call answers that too.
        held = admission.current()
        exposed = held.admits(self.provider.owner, "tool")[1] if held is not None else None
        version = _requested_version(params)
        if exposed is not None and version is not None and await context.fastmcp.get_tool(
                params.name, version) is None:
            exposed = None
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
        arguments = dict(params.arguments or {})
        if _nested_deeper_than(arguments, MAX_ARGUMENT_DEPTH):
            # Storing the payload walks it recursively: a value nested hundreds of
            # levels deep (the 2026-07-28 HTTP transport decodes ~1,000) would fail
            # there as an internal error. Inline calls refuse it by the input model.
            raise MCPError(code=INVALID_PARAMS, message=f"Invalid arguments for "
                           f"{params.name!r}: nested more than {MAX_ARGUMENT_DEPTH} "
                           "levels deep")
        try:
            json.dumps(arguments)  # the task's payload is stored as JSON
        except (TypeError, ValueError):
            # Only an in-memory client can send what JSON cannot carry (a number past
            # Python's 4,300-digit limit): the caller's mistake, never -32603.
            raise MCPError(code=INVALID_PARAMS, message=f"Invalid arguments for "
                           f"{params.name!r}: a value cannot be stored as JSON") from None
        return await self.create(exposed, arguments, context)

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
        caller = admission.caller()
        caller_id = caller.id
        payload = {"tool": exposed.tool_name, "version": exposed.flow.version,
                   "arguments": arguments, "caller": caller_id,
                   "approval": exposed.needs_approval,
                   "client_can_answer": declared_elicitation(context)}
        # The whole caller, whatever the server declares now: every leg runs as it
        # (kept_caller).
        payload["grant"] = kept_caller(caller)
        checks = step_checks(self.provider.runs)
        if checks:
            # What this replica asks before every step: a worker that would not ask it
            # does not run the task (FlowTaskRunner._runnable).
            payload["step_checks"] = checks
        run = run_start(None, caller_id)
        payload["run"] = run.run_id  # every leg of the task continues this run's record
        held = admission.current()
        if held is not None and held.runs_root != RUNS_URI:
            # Where this client reads the run resources (a Namespace on the server): the
            # legs link a large output there.
            payload["runs_root"] = held.runs_root
        runner = await self.registered_runner()
        created = await create_task(runner, payload, context)
        await mark_queued(self.docket, get_task_scope(), created.task_id, runner.key)
        run = dataclasses.replace(run, task_id=created.task_id)
        await RunRecorder(self.provider.run_log, exposed, run, ALL_VISIBLE).begin()
        await self.audit.record(exposed, created.task_id, "working", caller_id,
                                phase="decision", reason="created")
        return created

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """fastmcp-tasks' lifespan (Docket and its worker), with the worker noticing a
        freed slot at once when all of them are busy (:func:`poll_busy_slots`)."""
        async with super().lifespan():
            if running_docket(self.server) is not None:
                poll_busy_slots(self.server)
            yield

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
            # The request's admission, with the flow its task runs (only the task's id
            # names it): the provider finds the task runner only inside one.
            with admission.admitted(admission.task_request(ctx.session, self.provider.owner,
                                                           method, exposed)):
                if method == "tasks/cancel" and exposed is not None:
                    return await self._cancel(exposed, params.task_id, handler, ctx, params)
                result = await handler(ctx, params)
                if method == "tasks/get" and exposed is not None:
                    result = named_now(result, self.provider.flow_tool(exposed))
                    return await as_seen(self.docket, result)  # a worker that stopped
                return result

        return handle

    async def _cancel(self, exposed: ExposedFlow, task_id: str, handler: Any, ctx: Any,
                      params: Any) -> Any:
        """Cancel, and audit the cancellation exactly once, whatever the task was doing
        (running, waiting for an answer, queued) and however many cancels race; a
        finished task is not cancelled, so nothing is audited for it."""
        result = await handler(ctx, params)
        docket, scope = self.docket, get_task_scope()
        if (await is_cancelled(docket, scope, task_id)
                and await mark_once(docket, f"chainweaver:task-cancel:{scope}:{task_id}")):
            await self.audit.record(exposed, task_id, "cancelled", admission.caller().id)
            run_id = (await load_task_args(docket, scope, task_id)).get("run")
            if self.provider.run_log is not None and isinstance(run_id, str):
                await self.provider.run_log.cancelled(run_id)
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
        if (payload.get("caller") != admission.caller().id or exposed is None
                or exposed.flow.version != payload.get("version")
                or not self.provider.view().allows(exposed)):
            # The text fastmcp-tasks gives for a missing, expired or cross-scope id.
            raise MCPError(code=INVALID_PARAMS, message=f"Task {task_id} not found")
        return exposed

    async def registered_runner(self) -> FastMCPTool:
        """The runner as Docket registered it: through the server's transforms (a
        Namespace renames it), so its key is the one Docket and tasks/update know.

        Found once per start (Docket registers it once, at start): every task creation
        used to walk the server's task components again."""
        docket = self.docket
        found = self._runner
        if found is not None and found[0] is docket:
            return found[1]
        for component in await self.server.get_tasks():
            if isinstance(component, FlowTaskRunner):
                self._runner = (docket, component)
                return component
        raise MCPError(code=INTERNAL_ERROR, message="background tasks are not running")

    @property
    def docket(self) -> Docket:
        """The running Docket (FastMCP keeps it on the server while it runs)."""
        docket = _server_docket(self.server)
        if docket is None:
            raise MCPError(code=INTERNAL_ERROR, message="background tasks are not running")
        return docket


_STEP_STATUS = re.compile(r"(step \d+/\d+ )(.+)")


def named_now(result: Any, tool: FlowTool) -> Any:
    """``tasks/get``'s answer with the run's steps named as its caller may see them now.

    A task's status and result were written as its run went, in the caller's view of
    that moment; a sub-flow it named may have left that view since (its flow stayed):
    it is ``subflow#<index>`` with nothing nested, a failure's text (which may name
    it from any step) says only which step failed, as a call shows it, and a waiting
    task's approval question names its steps as a new ask would."""
    if not isinstance(result, GetTaskResult):
        return result
    names = tool.step_names()
    if not names.hides_any():
        return result
    update: dict[str, Any] = {}
    status = _STEP_STATUS.fullmatch(result.status_message or "")
    if status is not None and names.hides(status.group(2)):
        update["status_message"] = status.group(1) + names.label(status.group(2))
    if result.input_requests:
        asked = {key: _asked_now(request, names) for key, request in
                 result.input_requests.items()}
        if asked != result.input_requests:
            update["input_requests"] = asked
    stored = result.result
    meta = stored.get("_meta") if isinstance(stored, dict) else None
    run = meta.get("chainweaver") if isinstance(meta, dict) else None
    steps = run.get("steps") if isinstance(run, dict) else None
    if isinstance(stored, dict) and isinstance(meta, dict) and isinstance(run, dict) \
            and isinstance(steps, list):
        shown = relabelled(steps, names)
        if shown != steps:
            stored = {**stored, "_meta": {**meta, "chainweaver": {**run, "steps": shown}}}
            if stored.get("isError"):
                stored["content"] = [{"type": "text", "text": _failure(tool, stored, shown)}]
            update["result"] = stored
    return result.model_copy(update=update) if update else result


# A step path in an approval question (approval_message): its step lines and the
# sentence saying which step's grant decision changed.
_ASKED_STEP = re.compile(r"(^- (?:fallback of )?step |grant decision of step )"
                         r"('(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\")", re.MULTILINE)


def _asked_now(request: Any, names: StepNames) -> Any:
    """A waiting task's input request (an approval question, as sent on the wire) with
    each step path as ``names`` shows it now."""
    params = request.get("params") if isinstance(request, dict) else None
    message = params.get("message") if isinstance(params, dict) else None
    if not (isinstance(params, dict) and isinstance(message, str)):
        return request

    def now(match: re.Match[str]) -> str:
        try:
            path = ast.literal_eval(match.group(2))
        except (ValueError, SyntaxError):  # pragma: no cover - the pattern is a repr
            return match.group(0)
        return match.group(1) + repr(names.path(path)) if isinstance(path, str) \
            else match.group(0)

    shown = _ASKED_STEP.sub(now, message)
    return request if shown == message else {**request, "params": {**params,
                                                                    "message": shown}}


def _failure(tool: FlowTool, stored: dict[str, Any], steps: list[Any]) -> str:
    """A stored failure's text, naming only the step that failed (as now named)."""
    content = stored.get("content")
    text = content[0].get("text") if isinstance(content, list) and content and isinstance(
        content[0], dict) else None
    # "Type: message" (error_detail "full"), "Type" ("type_only"); generic shows neither.
    kind = text.split(": ", 1)[0] if isinstance(text, str) and text else "Error"
    failed = next((entry.get("id") for entry in steps if isinstance(entry, dict)
                   and entry.get("status") == "failed"), None)
    message = f"step {failed!r} failed" if isinstance(failed, str) \
        else f"flow {tool.name!r} failed"
    return tool.failure_text(kind, message)


def _server_docket(server: FastMCP) -> Docket | None:
    return cast("Docket | None", running_docket(server))


def _requested_version(params: mcp_types.CallToolRequestParams) -> VersionSpec | None:
    from fastmcp.server.dependencies import extract_version_spec

    text = extract_version_spec(cast("dict[str, Any] | None", params.meta))
    return VersionSpec(eq=text) if text else None


# How deeply a background task's arguments may nest (the top-level object is 1); the
# same bound prompt arguments have (prompt_render.MAX_JSON_DEPTH).
MAX_ARGUMENT_DEPTH = 64


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (decoded JSON) nests lists and objects more than ``limit``
    levels deep; walked without recursion, so any depth is safe to check."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) \
            else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False
