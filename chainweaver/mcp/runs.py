"""A flow run that talks to its MCP client: progress, log messages and approval.

:class:`RunReporter` turns the executor's run events into progress notifications (only
when the client sent a progress token; progress = steps finished, total = steps
planned) and log messages (at the level the client asked for: ``logging/setLevel`` on
2025-11-25, the request's log-level ``_meta`` on 2026-07-28). Neither ever carries an
argument value, an output or an error message: step ids, statuses and error types only.

:class:`Approval` asks the user to approve a run before any step starts: through
elicitation on 2025-11-25, through an ``input_required`` result on 2026-07-28 (the
client retries the call with the answer). Every answer is audited.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types
from fastmcp.server.context import Context
from mcp.server.connection import allowed_log_levels
from mcp_types import LoggingLevel
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, StrictBool, ValidationError

from ..run_events import ApprovalRequest, RunObserver
from ..runner import ErrorInfo, ExecutionResult, StepRecord
from .log_level import LEVELS, client_log_level
from .security import audit_approval

logger = logging.getLogger("chainweaver.mcp.runs")

LOGGER_NAME = "chainweaver"
APPROVAL_KEY = "chainweaver_approval"  # the input request's key on 2026-07-28
_RUN_LEVELS = ("info", "warning", "error")  # the levels a run logs at


@dataclass(frozen=True)
class RunSettings:
    """How a server's flow tools talk back during a run (one per server)."""

    approval: bool = False  # ask the user before a run whose steps need approval
    approval_timeout: float = 300.0  # seconds to wait for an elicitation answer
    notifications: bool = True  # per-step progress and log messages, when asked for
    # Sign the approval state handed to 2026-07-28 clients (the SDK also seals it): the
    # first signs, any verifies. Derived from the server's request-state keys when it
    # has them (replicas and workers then agree), else random per process.
    secrets: tuple[bytes, ...] = field(default_factory=lambda: (secrets.token_bytes(32),),
                                       repr=False)

    @classmethod
    def build(cls, approval: bool, approval_timeout: float,
              keys: tuple[bytes, ...] | None, notifications: bool = True) -> RunSettings:
        if not keys:
            return cls(approval, approval_timeout, notifications)
        derived = tuple(hashlib.sha256(b"chainweaver/approval-state:" + key).digest()
                        for key in keys)
        return cls(approval, approval_timeout, notifications, derived)


# ------------------------------------------------------------------ reporting


def wants_progress(ctx: Context) -> bool:
    """Whether the client asked for progress (a task always reports its status)."""
    if ctx.is_background_task:
        return True
    rc = ctx.request_context
    meta = rc.meta if rc is not None else None
    return meta is not None and meta.get("progressToken") is not None


async def log_levels(ctx: Context) -> frozenset[str]:
    """The levels of a run's log messages that may reach the client of this request."""
    rc = ctx.request_context
    if rc is None or ctx.is_background_task:
        return frozenset()  # a task has no channel for log messages
    if rc.protocol_version in MODERN_PROTOCOL_VERSIONS:
        allowed: frozenset[str] = frozenset(allowed_log_levels(rc.protocol_version, rc.meta))
    else:
        # Only a client that asked: one that never set a level (a plain script posting
        # requests) gets its results without a stream of messages in front of them.
        # Sent through the session rather than ctx.log, which also echoes every message
        # to the server's own log.
        minimum = await client_log_level(ctx)
        allowed = frozenset() if minimum is None else frozenset(
            LEVELS[LEVELS.index(minimum):])
    return allowed.intersection(_RUN_LEVELS)


class RunReporter(RunObserver):
    """Sends a run's events to the client, in order, from the event loop.

    Events may come from worker threads; they are queued to one sender task, which
    counts finished steps, so progress only ever increases.
    """

    def __init__(self, ctx: Context, tool_name: str, *, progress: bool,
                 levels: frozenset[str], show_error_type: bool) -> None:
        self._ctx = ctx
        self._name = tool_name
        self._progress = progress
        self._levels = levels
        self._show_error_type = show_error_type
        self._total = 0
        self._finished = 0
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._queue: asyncio.Queue[tuple[Any, ...] | None] = asyncio.Queue()
        self._sender = asyncio.ensure_future(self._send_all())

    @classmethod
    async def wanted(cls, ctx: Context, tool_name: str, *, show_error_type: bool
                     ) -> RunReporter | None:
        """A reporter for this request, or None when the client asked for nothing."""
        progress, levels = wants_progress(ctx), await log_levels(ctx)
        if not (progress or levels):
            return None
        return cls(ctx, tool_name, progress=progress, levels=levels,
                   show_error_type=show_error_type)

    # Observer side (any thread) -------------------------------------------

    def _put(self, item: tuple[Any, ...] | None) -> None:
        if threading.get_ident() == self._thread:
            self._queue.put_nowait(item)
        else:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self._total = total_steps

    def step_started(self, record: StepRecord) -> None:
        if "info" in self._levels:
            self._put(("log", "info", f"step {record.step_id!r} started"))

    def step_retrying(self, record: StepRecord, error: ErrorInfo) -> None:
        if "warning" in self._levels:
            self._put(("log", "warning", f"step {record.step_id!r} attempt {record.attempts} "
                                         f"failed{self._error(error)}; retrying"))

    def step_finished(self, record: StepRecord) -> None:
        self._put(("step", record.step_id, record.status, record.error))

    def run_finished(self, result: ExecutionResult) -> None:
        # Only a failure after the start: an invalid input or a refused approval is the
        # result's to say, and a completed run's last step said it already.
        if self._total and not result.success and "error" in self._levels:
            self._put(("log", "error", f"flow {self._name!r} failed"
                                       f"{self._error(result.error)}"))

    def _error(self, error: ErrorInfo | None) -> str:
        if error is None or not self._show_error_type:
            return ""
        return f" ({error.type})"

    # Sender side (the event loop) -------------------------------------------

    async def close(self) -> None:
        """Send what is queued, then stop (before the call's result goes out)."""
        self._queue.put_nowait(None)
        await self._sender

    def abandon(self) -> None:
        """Stop at once (the call was cancelled: nothing more reaches the client)."""
        self._sender.cancel()

    async def _send_all(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            try:
                await self._send(item)
            except Exception as error:  # a client that went away must not break the run
                logger.debug("could not send a run notification: %s", type(error).__name__)

    async def _send(self, item: tuple[Any, ...]) -> None:
        if item[0] == "log":
            await self._log(item[1], item[2])
            return
        _, step_id, status, error = item
        self._finished += 1
        message = f"step {step_id!r} {status}"
        level: LoggingLevel = "error" if status == "failed" else \
            "warning" if status == "cancelled" else "info"
        if level in self._levels:
            await self._log(level, f"{message}{self._error(error)}")
        if self._progress:
            await self._ctx.report_progress(self._finished, self._total or None, message)

    async def _log(self, level: LoggingLevel, message: str) -> None:
        # The levels were checked against what the client asked for (log_levels); sent
        # on this request's stream, in the shape ctx.log sends ({"msg", "extra"}).
        ctx = self._ctx
        notification = mcp_types.LoggingMessageNotification(
            params=mcp_types.LoggingMessageNotificationParams(
                level=level, logger=LOGGER_NAME, data={"msg": message, "extra": None}))
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)


# ------------------------------------------------------------------ approval


class ApprovalAnswer(BaseModel):
    """The form a user fills in to approve a run."""

    # Strict: only a JSON true approves ("yes", "on", 1 would otherwise pass as True).
    approve: StrictBool = Field(title="Approve",
                                description="Run the flow, side effects included")


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Approve",
                               "description": "Run the flow, side effects included"}},
    "required": ["approve"],
}


def approval_message(request: ApprovalRequest, tool_name: str) -> str:
    reason = f" Reason: {request.reason}." if request.reason else ""
    return (f"Flow {tool_name!r} (version {request.flow_version}) wants to run step "
            f"{request.step_id!r} (tool {request.tool_name!r}), whose side effects are "
            f"{request.side_effects!r} and which requires approval.{reason} Approve?")


def declared_elicitation(ctx: Context) -> bool:
    """The client declared the elicitation capability: its user can be asked."""
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


@dataclass(frozen=True)
class ApprovalInTask:
    """How a run inside a background task asks for approval (``chainweaver.mcp.tasks``).

    ``audit`` records the user's answer for a step (``step_id``, answer) in the task's
    audit; ``client_can_answer``: the client that created the task declared elicitation,
    so it can answer the ask through ``tasks/update``.
    """

    audit: Callable[[str, str], Awaitable[None]]
    client_can_answer: bool


class Approval:
    """The ``approve`` hook of one call: asks the client's user, audits the answer.

    On 2026-07-28 (and in a background task) the first round cannot wait for the
    user: it sets :attr:`ask` (an ``input_required`` result for the tool to return)
    and refuses. The client's retry carries the answer and the signed state; in a
    task, ``tasks/update`` carries the answer and the next leg reads both.
    """

    def __init__(self, ctx: Context, tool_name: str, settings: RunSettings,
                 in_task: ApprovalInTask | None = None) -> None:
        self._ctx = ctx
        self._name = tool_name
        self._settings = settings
        self._in_task = in_task
        self.ask: mcp_types.InputRequiredResult | None = None
        self.outcome = "not_asked"  # accept, decline, cancel, no_answer, unavailable, ...

    async def __call__(self, request: ApprovalRequest) -> bool:
        ctx = self._ctx
        rc = ctx.request_context
        if self._in_task is not None or (rc is not None
                                         and rc.protocol_version in MODERN_PROTOCOL_VERSIONS):
            answer = self._from_retry(request)
        else:
            answer = await self._elicit(request)
        if answer is None:  # asked through input_required: decided on the retry
            return False
        self.outcome = answer
        audit = self._in_task.audit if self._in_task is not None else audit_approval
        await audit(request.step_id, answer)
        return answer == "accept"

    async def _elicit(self, request: ApprovalRequest) -> str:
        """Ask over the 2025-11-25 back-channel; the answer as an outcome word."""
        ctx = self._ctx
        session = ctx.session
        capability = mcp_types.ClientCapabilities(elicitation=mcp_types.ElicitationCapability())
        if not session.check_client_capability(capability):
            return "unavailable"  # the client declared no elicitation capability
        if not session.can_send_request:
            return "unavailable"  # stateless HTTP: no channel for a server request
        try:
            result = await asyncio.wait_for(
                ctx.elicit(approval_message(request, self._name), ApprovalAnswer),
                self._settings.approval_timeout)
        except asyncio.TimeoutError:
            return "no_answer"
        except Exception as error:  # the client failed or refused to ask
            logger.info("approval elicitation failed: %s", type(error).__name__)
            return "no_answer"
        if result.action != "accept":
            return result.action  # decline or cancel
        data = getattr(result, "data", None)
        return "accept" if isinstance(data, ApprovalAnswer) and data.approve else "decline"

    def _from_retry(self, request: ApprovalRequest) -> str | None:
        """The answer on a 2026-07-28 retry; None after asking (``ask`` is set)."""
        ctx = self._ctx
        state = ctx.request_state
        if state is None:
            if not self._can_ask():
                return "unavailable"
            self.ask = mcp_types.InputRequiredResult(
                input_requests={APPROVAL_KEY: mcp_types.ElicitRequest(
                    params=mcp_types.ElicitRequestFormParams(
                        message=approval_message(request, self._name),
                        requested_schema=APPROVAL_SCHEMA))},
                request_state=self._mint(request))
            return None
        # A background task's state never leaves the server (fastmcp-tasks keeps it with
        # the task; the client answers by key), and the next leg may run on a worker
        # with other secrets: there only the binding is checked.
        if not self._verify(state, request, signed=self._in_task is None):
            return "invalid_state"
        response = (ctx.input_responses or {}).get(APPROVAL_KEY)
        if not isinstance(response, mcp_types.ElicitResult):
            return "no_answer"
        if response.action != "accept":
            return response.action
        try:
            answer = ApprovalAnswer.model_validate(response.content or {})
        except ValidationError:
            return "decline"
        return "accept" if answer.approve else "decline"

    def _can_ask(self) -> bool:
        if self._in_task is not None:
            return self._in_task.client_can_answer  # through tasks/update
        return declared_elicitation(self._ctx)

    # The SDK seals request_state and binds it to the tool, arguments and caller; this
    # signature also binds it to the flow version and step, so the state of another
    # flow, step or server never approves this one.
    def _mint(self, request: ApprovalRequest) -> str:
        body = json.dumps([request.flow_name, request.flow_version, request.step_id,
                           secrets.token_hex(8)], separators=(",", ":"))
        return f"{body}|{self._sign(body)}"

    def _verify(self, state: str, request: ApprovalRequest, *, signed: bool = True) -> bool:
        body, _, signature = state.rpartition("|")
        if signed and not any(
                hmac.compare_digest(signature, self._sign(body, secret))
                for secret in self._settings.secrets):
            return False
        try:
            flow, version, step, _ = json.loads(body)
        except (ValueError, TypeError):
            return False
        return [flow, version, step] == [request.flow_name, request.flow_version,
                                         request.step_id]

    def _sign(self, body: str, secret: bytes | None = None) -> str:
        key = self._settings.secrets[0] if secret is None else secret
        return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()
