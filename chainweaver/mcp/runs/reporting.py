"""Run reporting: a flow run's events as the client asked for them.

:class:`RunReporter` turns the executor's run events into progress notifications (only
when the client sent a progress token; progress = steps finished, total = steps
planned) and log messages (at the level the client asked for: ``logging/setLevel`` on
2025-11-25, the request's log-level ``_meta`` on 2026-07-28). Neither ever carries an
argument value, an output or an error message: step ids, statuses and error types only.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import mcp_types
from fastmcp.server.context import Context
from mcp.server.connection import allowed_log_levels
from mcp.server.session import ServerSession
from mcp_types import LoggingLevel
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from chainweaver.mcp.gate.log_level import LEVELS, client_log_level
from chainweaver.results import ErrorInfo, ExecutionResult, StepRecord
from chainweaver.run_events import RunObserver

logger = logging.getLogger("chainweaver.mcp.runs.reporting")

LOGGER_NAME = "chainweaver"
_RUN_LEVELS = ("info", "warning", "error")  # the levels a run logs at

def _same(step_id: str) -> str:
    return step_id


def wants_progress(ctx: Context) -> bool:
    """Whether the client asked for progress (a task always reports its status)."""
    if ctx.is_background_task:
        return True
    rc = ctx.request_context
    meta = rc.meta if rc is not None else None
    return meta is not None and meta.get("progressToken") is not None


def log_levels(ctx: Context) -> frozenset[str]:
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
        minimum = client_log_level(ctx)
        allowed = frozenset() if minimum is None else frozenset(
            LEVELS[LEVELS.index(minimum):])
    return allowed.intersection(_RUN_LEVELS)


class RunReporter(RunObserver):
    """Sends a run's events to the client, in order, from the event loop.

    Events may come from worker threads: those are batched, and the first of a batch
    asks the loop to wake up once, which takes every event that arrived meanwhile, in
    order. A step's events are handed over before its worker thread can report the
    step's end, since the loop runs its callbacks in the order they were asked for.
    One sender task sends them while the run is under way; it starts two turns of the
    loop after the first event (:meth:`_start_soon`), so a run over by then (one that
    never yields, or whose worker thread's quick hop ended as its events were handed
    over) starts none, and :meth:`close` sends its events.
    """

    def __init__(self, ctx: Context, tool_name: str, *, progress: bool,
                 levels: frozenset[str], show_error_type: bool,
                 label: Callable[[str], str] | None = None) -> None:
        self._ctx = ctx
        self._name = tool_name
        # A step's id as the client may see it (a sub-flow it cannot see is not named).
        self._label = label if label is not None else _same
        self._progress = progress
        self._levels = levels
        self._show_error_type = show_error_type
        self._total = 0
        self._finished = 0
        self._session: ServerSession | None = None  # read on the first message sent
        self._request_id: str | None = None
        # The client's progress token (None: a background task's context, which
        # report_progress serves from its own store).
        rc = ctx.request_context if progress and not ctx.is_background_task else None
        meta = rc.meta if rc is not None else None
        self._token = meta.get("progressToken") if meta is not None else None
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._ready: deque[tuple[Any, ...]] = deque()  # on the loop, not yet sent
        # Events from worker threads waiting for their one wake-up of the loop.
        self._pending: list[tuple[Any, ...]] = []
        self._pending_lock = threading.Lock()
        self._sender: asyncio.Task[None] | None = None
        # The request's context, for the sender a worker thread's wake-up may start
        # (that callback runs in the thread's own context, without the request).
        self._context = contextvars.copy_context()
        self._idle: asyncio.Future[None] | None = None  # the sender, waiting for events
        self._start_asked = False
        self._closing = False

    @classmethod
    def wanted(cls, ctx: Context, tool_name: str, *, show_error_type: bool,
               label: Callable[[str], str] | None = None) -> RunReporter | None:
        """A reporter for this request, or None when the client asked for nothing."""
        progress, levels = wants_progress(ctx), log_levels(ctx)
        if not (progress or levels):
            return None
        return cls(ctx, tool_name, progress=progress, levels=levels,
                   show_error_type=show_error_type, label=label)

    # Observer side (any thread) -------------------------------------------

    def _put(self, item: tuple[Any, ...]) -> None:
        if threading.get_ident() == self._thread:
            if self._pending:
                self._hand_over()  # a worker thread's events came first
            self._ready.append(item)
            if self._sender is not None:  # running or idle: it takes this one too
                self._wake()
            else:
                self._start_soon()
            return
        with self._pending_lock:
            self._pending.append(item)
            if len(self._pending) > 1:
                return  # the wake-up the first one asked for takes this one too
        self._loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        """Take the events worker threads left (on the loop), in the order they came."""
        with self._pending_lock:
            items, self._pending = self._pending, []
        self._ready.extend(items)
        if self._sender is not None:
            self._wake()
        else:
            self._start_soon()

    def _start_soon(self) -> None:
        """Start the sender two turns of the loop from now (asked once per run).

        Not at once: a run that never yields is over before the loop turns, and a worker
        thread's hop that ran its steps quickly usually ends in the turn that hands its
        events over, the run's task resuming in the next. Either run may be over by the
        second turn, and close() then sends the events without a task. A run still
        under way (a step awaiting, a worker thread running) lets the loop turn at once.
        """
        if not self._start_asked:
            self._start_asked = True
            self._loop.call_soon(self._loop.call_soon, self._wake)

    def _wake(self) -> None:
        """Have the sender send what is ready (on the loop): wake it, or start it."""
        idle = self._idle
        if idle is not None:
            self._idle = None
            idle.set_result(None)
        elif self._sender is None and not self._closing and self._ready:
            self._sender = self._loop.create_task(self._send_all(), context=self._context)

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        self._total = total_steps

    def step_started(self, record: StepRecord) -> None:
        if "info" in self._levels:
            self._put(("log", "info", f"step {self._label(record.step_id)!r} started"))

    def step_retrying(self, record: StepRecord, error: ErrorInfo) -> None:
        if "warning" in self._levels:
            self._put(("log", "warning", f"step {self._label(record.step_id)!r} attempt "
                                         f"{record.attempts} failed{self._error(error)}; "
                                         "retrying"))

    def step_finished(self, record: StepRecord) -> None:
        self._put(("step", self._label(record.step_id), record.status, record.error))

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
        """Send what is left, then stop (before the call's result goes out)."""
        self._closing = True
        if self._pending:
            self._hand_over()
        sender = self._sender
        if sender is not None:
            self._wake()  # idle, it wakes; sending, it drains first: then it sees closing
            await sender
            return
        await self._send_ready()

    def abandon(self) -> None:
        """Stop at once (the call was cancelled: nothing more reaches the client)."""
        self._closing = True
        self._ready.clear()
        if self._sender is not None:
            self._sender.cancel()

    async def _send_all(self) -> None:
        while True:
            await self._send_ready()
            if self._closing:
                return
            self._idle = self._loop.create_future()
            await self._idle

    async def _send_ready(self) -> None:
        """Send every event that is ready, in order."""
        ready = self._ready
        while ready:
            item = ready.popleft()
            try:
                if item[0] == "log":
                    await self._log(item[1], item[2])
                else:
                    await self._step_ended(*item[1:])
            except Exception as error:  # a client that went away must not break the run
                logger.debug("could not send a run notification: %s", type(error).__name__)

    async def _step_ended(self, step_id: str, status: str, error: ErrorInfo | None) -> None:
        self._finished += 1
        message = f"step {step_id!r} {status}"
        level: LoggingLevel = "error" if status == "failed" else \
            "warning" if status == "cancelled" else "info"
        if level in self._levels:
            await self._log(level, f"{message}{self._error(error)}")
        if not self._progress:
            return
        if self._token is None:  # no token of its own to name (ctx knows what to do)
            await self._ctx.report_progress(self._finished, self._total or None, message)
            return
        await (self._session or self._stream()).send_progress_notification(
            self._token, self._finished, self._total or None, message,
            related_request_id=self._request_id)

    async def _log(self, level: LoggingLevel, message: str) -> None:
        # The levels were checked against what the client asked for (log_levels); sent
        # on this request's stream, in the shape ctx.log sends ({"msg", "extra"}).
        notification = mcp_types.LoggingMessageNotification(
            params=mcp_types.LoggingMessageNotificationParams(
                level=level, logger=LOGGER_NAME, data={"msg": message, "extra": None}))
        await (self._session or self._stream()).send_notification(
            notification, related_request_id=self._request_id)

    def _stream(self) -> ServerSession:
        """The session this request came on and its id (read once: each read of them
        through the context costs a few context-variable lookups)."""
        session = self._session
        if session is None:
            ctx = self._ctx
            session = self._session = ctx.session
            self._request_id = ctx.request_id
        return session
