"""The one task function Docket knows: :class:`FlowTaskRunner` runs any exposed flow
named in a task's payload (as its creator, in its view), durably (each step
checkpointed in the task backend, so a redelivered task resumes at the step where it
stopped), reports each step as the task's status, logs each leg it runs, and audits
each state change.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from docket import CurrentExecution, Docket
from docket.execution import Execution
from fastmcp.dependencies import CurrentContext
from fastmcp.server.context import Context
from fastmcp.tools.base import InputRequiredToolResult, ToolResult
from fastmcp.tools.base import Tool as FastMCPTool
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks.context import get_task_context
from fastmcp_tasks.creation import TASK_MAPPING_TTL_BUFFER_SECONDS
from fastmcp_tasks.dependencies import CurrentDocket
from fastmcp_tasks.input_store import is_cancelled
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, TextContent
from pydantic import PrivateAttr

from chainweaver.checkpoints import INTERRUPTED, CheckpointStoreError
from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.admission import RunNote
from chainweaver.mcp.gate.requests import completed
from chainweaver.mcp.hooks import (
    ANONYMOUS,
    AuditEvent,
    AuditHook,
    CallerIdentity,
    approval_decision,
    deliver_audit,
)
from chainweaver.mcp.publish.exposure import ExposedFlow
from chainweaver.mcp.publish.run_uris import RUNS_URI
from chainweaver.mcp.runs.approval import ApprovalInTask, RunSettings
from chainweaver.mcp.runs.metrics import ServerMetrics, StepCounter
from chainweaver.mcp.runs.recording import run_start
from chainweaver.mcp.tasks.durable import (
    RUNNING,
    checkpoint_store,
    ended,
    heartbeat,
    picked_up,
    start_leg,
    write_status,
)
from chainweaver.results import ExecutionResult, StepRecord
from chainweaver.run_events import RunObserver, fan_out

if TYPE_CHECKING:

    from chainweaver.governance import SharedGovernance
    from chainweaver.mcp.components.provider import FlowProvider

logger = logging.getLogger("chainweaver.mcp")

# The Docket function name of the one task function. Never a published tool: the
# provider finds it only while a tasks/* request is served (its admission says so), so
# no client can list or call it.


RUNNER_NAME = "chainweaver.flow_task"
# Keys every flow task's payload has (how a flow task is told from fastmcp-tasks' own).
FLOW_TASK_KEYS = frozenset({"tool", "version", "arguments"})
# A worker that does not know the shared governance state now waits for it, polling.
WAITING_FOR_GOVERNANCE = "waiting for the shared governance state"
GOVERNANCE_POLL = 0.25  # seconds
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
                     phase: Literal["decision", "state", "completed", "approval",
                                    "step"] = "state",
                     reason: str = "ok", result: ToolResult | None = None,
                     step_id: str | None = None, note: RunNote | None = None) -> None:
        if self.hook is None:
            return
        # Audited as the gate audits a call's result (one builder): a task's digest and
        # a call's agree for the same result.
        done = completed("tool", result, note) if result is not None else None
        event = AuditEvent(
            timestamp=time.time(), phase=phase, kind="task", name=exposed.tool_name,
            flow_name=exposed.flow.name, flow_version=exposed.flow.version,
            caller_id=caller_id,
            decision=approval_decision(reason) if phase == "approval"
            else "denied" if phase == "step" else "allowed",
            reason=reason, outcome=done.outcome if done else None,
            error_type=done.error_type if done else None,
            result_sha256=done.result_sha256 if done else None,
            result_length=done.result_length if done else None,
            task_id=task_id, task_status=status, step_id=step_id,
            steps=note.steps if note is not None and phase == "completed" else None)
        await deliver_audit(self.hook, event, self.timeout)

    async def refused(self, arguments: dict[str, Any], exposed: ExposedFlow | None,
                      task_id: str, reason: str) -> None:
        """A worker failed the task its payload (``arguments``) names without running
        it: ``exposed`` is the flow this worker publishes under its tool name, if any."""
        if self.hook is None:
            return
        caller_id, version = arguments.get("caller"), arguments.get("version")
        event = AuditEvent(
            timestamp=time.time(), phase="state", kind="task", name=str(arguments["tool"]),
            flow_name=exposed.flow.name if exposed is not None else None,
            flow_version=version if isinstance(version, str) else None,
            caller_id=caller_id if isinstance(caller_id, str) else None,
            decision="denied", reason=reason, task_id=task_id, task_status="failed")
        await deliver_audit(self.hook, event, self.timeout)


class WorkerRefusal(Exception):
    """This worker does not run the task: it audits the refusal with ``reason``, and the
    task fails with ``message`` as its status message. Never leaves the runner: the
    task fails with a plain MCPError, which Docket pickles (``exposed`` cannot be)."""

    def __init__(self, reason: str, message: str, exposed: ExposedFlow | None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.exposed = exposed


class FlowTaskRunner(FastMCPTool):
    """The one component Docket registers: runs the exposed flow its payload names.

    The payload is ``{"tool": published name, "version": flow version, "arguments":
    {...}, "caller": the gate's caller id, "approval": whether the flow asks for
    approval where the task was created, "client_can_answer": whether the creating
    client declared elicitation, "grant": the rest of that caller (:func:`kept_caller`),
    ...}``, written by :meth:`FlowTasksExtension.create`.
    """

    _provider: FlowProvider = PrivateAttr()
    _audit: TaskAudit = PrivateAttr()
    _metrics: ServerMetrics | None = PrivateAttr(default=None)
    _governance: SharedGovernance | None = PrivateAttr(default=None)

    @classmethod
    def build(cls, provider: FlowProvider, audit: TaskAudit,
              metrics: ServerMetrics | None = None,
              governance: SharedGovernance | None = None) -> FlowTaskRunner:
        """The runner of ``provider``'s flows; ``metrics``: where its runs and steps are
        counted (``chainweaver.runs`` and ``.steps``, like an inline run's);
        ``governance``: the shared state this process follows, if any."""
        runner = cls(name=RUNNER_NAME, parameters={"type": "object"},
                     task_config=TaskConfig(mode="optional"))
        runner._provider = provider
        runner._audit = audit
        runner._metrics = metrics
        runner._governance = governance
        return runner

    async def run(  # Docket injects the dependencies
        self,
        arguments: dict[str, Any],
        ctx: Context = CurrentContext(),  # noqa: B008  (dependency injection markers)
        execution: Execution = CurrentExecution(),  # noqa: B008
        docket: Docket = CurrentDocket(),  # noqa: B008
    ) -> ToolResult:
        # Every leg runs as the caller that created the task: the exposure, the view,
        # the names a run shows and every step's grants are judged for that caller (as
        # it is now, where refresh_caller is set), never for the token's caller.
        root = arguments.get("runs_root")
        root = root if isinstance(root, str) else RUNS_URI  # where its client reads runs
        with admission.admitted(admission.task_leg(execution, task_caller(arguments), root)):
            return await self._run_leg(arguments, ctx, execution, docket)

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
        governance = self._governance
        if governance is not None and governance.overlay.suspended:
            # The shared state is unknown here (unconfirmed past stop_serving_after, or
            # not read yet): refused now, a task whose flow may well be published would
            # fail for good. It waits, running no step, until the state is read again.
            await write_status(docket, execution.key, WAITING_FOR_GOVERNANCE)
            while governance.overlay.suspended:
                await asyncio.sleep(GOVERNANCE_POLL)
        try:
            exposed = self._runnable(arguments)
        except WorkerRefusal as refused_here:
            # Refused here: the task fails, and so does its run's record, which would
            # otherwise say "running" for good (read only while the flow is in view).
            run_log, refused = self._provider.run_log, arguments.get("run")
            if run_log is not None and run_log.records and isinstance(refused, str):
                await run_log.refused(refused)
            await self._audit.refused(arguments, refused_here.exposed, task_id,
                                      refused_here.reason)
            raise MCPError(code=INTERNAL_ERROR, message=refused_here.message) from None
        await self._audit.record(exposed, task_id, "working", caller_id)
        tool = self._provider.flow_tool(exposed)

        async def write(message: str) -> None:
            await write_status(docket, execution.key, message)

        reports = _StepReports(write, tool.step_names().label)
        given = arguments.get("run")
        run_id: str = given if isinstance(given, str) else task_id
        # A leg that will only ask for approval runs no step: not a delivery of the run.
        asks_only = exposed.needs_approval and ctx.request_state is None
        store = checkpoint_store(docket)
        # Count the delivery, set the leg's markers, show it running and read the run's
        # checkpoints: one round trip.
        deliveries = await start_leg(docket, task_id, run_id, execution.key, store,
                                     counts=not asks_only)

        async def audit_answer(step_id: str, answer: str) -> None:
            await self._audit.record(exposed, task_id, "working", caller_id,
                                     phase="approval", reason=answer, step_id=step_id)

        asking = ApprovalInTask(audit_answer, arguments.get("client_can_answer", True),
                                caller_id=caller_id)
        note = RunNote()
        # The caller id as the gate admitted it, whatever it holds ("" included); the
        # run record says how often it was delivered.
        run = run_start(arguments.get("run"),
                        caller_id if isinstance(caller_id, str) else "anonymous", note,
                        task_id, deliveries=max(deliveries, 1))
        metrics = self._metrics
        counter = StepCounter(metrics, exposed.tool_name) if metrics is not None else None
        try:
            async with heartbeat(docket, task_id):  # tasks/get tells a dead worker
                shown = picked_up(exposed, task_id, run_id, deliveries)
                if shown != RUNNING:  # start_leg showed "running"
                    reports.show(shown)
                result = await tool.run_flow(arguments["arguments"], ctx,
                                             status=fan_out(reports, counter),
                                             in_task=asking, run=run, checkpoints=store)
        except CheckpointStoreError as error:
            # The task store failed under the run (its worker shutting down, Redis
            # gone): not a failure of the flow. The run stays unfinished, the leg
            # stops, and a later delivery resumes it from its checkpoints.
            cause = type(error.__cause__ or error).__name__
            logger.warning("task %s: run %s of flow %r %s stopped: the task store failed "
                           "under it (%s); it resumes from its checkpoints when the task "
                           "is delivered again", task_id, run_id, exposed.flow.name,
                           exposed.flow.version, cause)
            raise
        except BaseException as error:
            if counter is not None:
                counter.finished("cancelled" if isinstance(error, asyncio.CancelledError)
                                 else "failed")
            ended(exposed, task_id, run_id, f"error ({type(error).__name__})")
            raise
        finally:
            await reports.drain()
        if isinstance(result, InputRequiredToolResult):
            # The flow asks for approval before any step runs. fastmcp-tasks' wrapper
            # keeps the ask with the task (input_required) and ends this leg; the
            # client's tasks/update enqueues the runner again, carrying the answer.
            await self._audit.record(exposed, task_id, "input_required", caller_id)
            ended(exposed, task_id, run_id, "input_required")
            return result
        interrupted = reports.interrupted()
        if counter is not None:
            counter.finished("failed" if result.is_error or interrupted is not None
                             else "completed")
        if interrupted is not None:
            await self._audit.record(exposed, task_id, "failed", caller_id,
                                     reason="not_idempotent")
            ended(exposed, task_id, run_id, f"failed ({INTERRUPTED} at {interrupted})")
            raise MCPError(code=INTERNAL_ERROR, message=(
                f"the worker running flow {exposed.flow.name!r} stopped during step "
                f"{interrupted!r}, which was interrupted while running a non-idempotent "
                "step: it is not idempotent and takes no idempotency key, so it was not "
                "run again (no completed step ran again either)"))
        refusal = note.steps.get("refused") if note.steps is not None else None
        if refusal is not None:
            await self._audit.record(exposed, task_id, "working", caller_id, phase="step",
                                     reason=refusal["reason"], step_id=refusal["path"])
        await self._audit.record(exposed, task_id, "completed", caller_id,
                                 phase="completed", result=result, note=note)
        ended(exposed, task_id, run_id, reports.outcome(), reports.restored)
        return result

    def _runnable(self, arguments: dict[str, Any]) -> ExposedFlow:
        """The exposed flow the payload names, if this process may run it now; else the
        task fails (:class:`WorkerRefusal`) with the reason as its status message."""
        exposed = self._provider.exposure.tool(arguments["tool"])
        if (exposed is None or exposed.flow.version != arguments["version"]
                or not self._provider.view().allows(exposed)):
            # Not published any more, or no longer in the caller's view: the same words.
            raise WorkerRefusal("flow_unavailable", (
                f"flow {arguments['tool']!r} version {arguments['version']} is no longer "
                "published here; the task did not run"), exposed)
        if arguments.get("approval") and not exposed.needs_approval:
            # A worker whose policy differs (no --approval elicit, but
            # --allow-requires-approval) would otherwise run it without asking.
            raise WorkerRefusal("approval_not_configured", (
                f"flow {arguments['tool']!r} asks for approval where the task was created, "
                "but not on this worker (start it with --approval elicit); the task did "
                "not run"), exposed)
        asked = arguments.get("step_checks")
        missing = [check for check in (asked if isinstance(asked, list) else ())
                   if check not in step_checks(self._provider.runs)]
        if missing:
            # A worker built without the replica's step authorizer (or refresh_caller)
            # would run the steps unchecked (or for the caller as it was).
            raise WorkerRefusal("step_checks_not_configured", (
                f"the steps of flow {arguments['tool']!r} are checked by "
                f"{' and '.join(map(str, missing))} where the task was created, but not on "
                "this worker (give it the same SecurityConfig); the task did not run"),
                exposed)
        return exposed


def step_checks(runs: RunSettings) -> list[str]:
    """The server-wide step hooks a run asks (``RunSettings``): the names of the
    :class:`~chainweaver.mcp.SecurityConfig` settings that are set."""
    return [name for name in ("step_authorizer", "refresh_caller")
            if getattr(runs, name) is not None]


class _StepReports(RunObserver):
    """Turns each step that starts into the task's status (``write``: a task leg's
    :func:`~.durable.write_status`).

    Steps start on the event loop or in worker threads; every report is sent from the
    loop, in the run's context (the worker's task context lives there), in order. A
    task's status is its latest one: a report that a later one overtook while it waited
    for the one before it is not written (each write is a round trip to the task
    backend).
    """

    def __init__(self, write: Callable[[str], Awaitable[None]],
                 label: Callable[[str], str] | None = None) -> None:
        self.write = write  # how a status is written
        self.label = label  # a step's id as the task's caller may see it
        self.loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()  # the loop's
        self.context = contextvars.copy_context()
        self.last: asyncio.Future[None] | None = None
        self.queued = 0  # status reports queued so far (the latest one is written)
        self.total = 0
        self.started = 0
        self.restored = 0  # steps taken from checkpoints
        self.result: ExecutionResult | None = None
        self._lock = threading.Lock()

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self.total = total_steps

    def run_finished(self, result: ExecutionResult) -> None:
        self.result = result

    def interrupted(self) -> str | None:
        """The step (as the caller may see it) the run refused to run again, if any."""
        error = self.result.error if self.result is not None else None
        if error is None or error.type != INTERRUPTED or error.step_id is None:
            return None
        return self.label(error.step_id) if self.label is not None else error.step_id

    def outcome(self) -> str:
        if self.result is None:
            return "ended"
        error = self.result.error
        return "completed" if error is None else f"failed ({error.type})"

    def step_started(self, record: StepRecord) -> None:
        with self._lock:  # steps of the async lane start on the loop and in threads
            self.started += 1
            number = self.started
            if record.restored:
                self.restored += 1
                return  # not running: its status would flash past
        step_id = self.label(record.step_id) if self.label is not None else record.step_id
        # From the loop itself, no wake-up of the loop (a write to its self-pipe).
        schedule = self.loop.call_soon if threading.get_ident() == self.thread \
            else self.loop.call_soon_threadsafe
        schedule(self.show, f"step {number}/{self.total} {step_id}", context=self.context)

    def show(self, message: str) -> None:
        """Show ``message`` as the task's status (called on the event loop), in order
        with the steps' reports."""
        self.queued += 1
        self.last = asyncio.ensure_future(self._report(self.last, self.queued, message))

    async def _report(self, previous: asyncio.Future[None] | None, sequence: int,
                      message: str) -> None:
        if previous is not None:
            await previous
        if sequence != self.queued:
            # A later status is queued: a task's status is its latest one, so this one
            # (a step that started and ended meanwhile) is never written.
            return
        try:
            # The message only: tasks/get shows a task's status message, never Docket's
            # progress counters, which would cost three more round trips per status.
            await self.write(message)
        except Exception as error:  # a lost status message must not fail the run
            logger.debug("task status report failed: %s", type(error).__name__)

    async def drain(self) -> None:
        await asyncio.sleep(0)  # reports queued from worker threads
        if self.last is not None:
            await self.last


def kept_caller(caller: CallerIdentity) -> dict[str, Any]:
    """What a task keeps of the caller that created it (its ``grant``), so that every
    leg runs as that caller: its scopes and every claim, with its subject and client id
    (a directory asked by ``refresh_caller`` may know it by its subject). Kept whatever
    the server declares when the task is created: a leg runs the plan of its own moment,
    and a grant (or a sub-flow's version asking for one) may appear meanwhile."""
    grant: dict[str, Any] = {"scopes": sorted(caller.scopes), "claims": dict(caller.claims)}
    if caller.subject is not None:
        grant["subject"] = caller.subject
    if caller.client_id is not None:
        grant["client_id"] = caller.client_id
    return grant


def task_caller(arguments: dict[str, Any]) -> CallerIdentity:
    """The caller a task's leg runs as: the one that created it, never the token's.

    A payload without a kept caller (written before every task kept one) names only
    the caller's id: the leg runs as that caller holding no scope and no claim."""
    grant = arguments.get("grant")
    caller_id = arguments.get("caller")
    if not isinstance(caller_id, str):
        caller_id = ANONYMOUS.id
    if not isinstance(grant, dict):
        return CallerIdentity(caller_id)
    scopes = grant.get("scopes")
    claims = grant.get("claims")
    subject, client_id = grant.get("subject"), grant.get("client_id")
    return CallerIdentity(caller_id, dict(claims) if isinstance(claims, dict) else {},
                          subject=subject if isinstance(subject, str) else None,
                          client_id=client_id if isinstance(client_id, str) else None,
                          scopes=frozenset(s for s in scopes or () if isinstance(s, str)))


async def mark_once(docket: Docket, name: str) -> bool:
    """Set a marker that lives as long as a task's keys; False when it was set already."""
    ttl = int(docket.execution_ttl.total_seconds()) + TASK_MAPPING_TTL_BUFFER_SECONDS
    async with docket.redis() as redis:
        return bool(await redis.set(docket.key(name), "1", nx=True, ex=ttl))
