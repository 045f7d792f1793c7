"""Recording runs: a run observer building each run's record, the server's run log
that stores it and tells subscribers, and large outputs sent as resource links.

Every flow run started through MCP (a ``tools/call`` or a background task's leg) gets
a run id, carried in its result's ``_meta``. With a run history configured
(``FlowServer(run_history=RunHistory(...))``) its record is saved when it starts,
when it waits for approval and when it ends; every failed, cancelled or refused run is
logged at warning, with its id, flow, version, step and error type, whatever the
client was told.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastmcp.tools.base import ToolResult
from mcp_types import ResourceLink, TextContent

from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.admission import RunNote
from chainweaver.mcp.gate.body_cap import MAX_RANGE_BYTES, MESSAGE_BUDGET, sent_size
from chainweaver.mcp.publish.run_uris import RUNS_URI, output_uri, run_uri
from chainweaver.mcp.runs.records import (
    MemoryRunStore,
    RunRecord,
    RunStatus,
    RunStore,
    RunStoreError,
    new_run_id,
)
from chainweaver.mcp.runs.spill import (
    SPILL_MAX_AGE,
    SPILL_MAX_BYTES,
    SPILL_MAX_OUTPUTS,
    SpillStore,
)
from chainweaver.mcp.runs.step_names import StepNames, step_entry
from chainweaver.run_events import RunObserver

if TYPE_CHECKING:
    from chainweaver.executor import ExecutionResult, StepRecord
    from chainweaver.mcp.publish.exposure import ExposedFlow

logger = logging.getLogger("chainweaver.mcp.runs")

OUTPUT_MIME = "application/json"
PREVIEW_BYTES = 1024
# Told of a run's status change: (its caller's id, its flow's name, the URIs updated).
RunUpdated = Callable[[str, str, list[str]], Awaitable[None]]


def state_run_id(caller_id: str, state: str) -> str:
    """The run id of a call that asked for approval, from the state its retry echoes
    (bound to the caller: another caller's copy of the state names another run). Both
    are JSON-encoded: no caller id, whatever it holds, meets another's."""
    named = json.dumps([caller_id, state], separators=(",", ":"))
    return hashlib.sha256(named.encode()).hexdigest()[:24]


@dataclass
class RunStart:
    """Which run a flow tool's run is: its id, its caller and task, and where the
    audit of its request reads what it needs (:class:`RunNote`)."""

    run_id: str
    caller_id: str
    task_id: str | None = None
    note: RunNote = field(default_factory=RunNote)
    fresh: bool = False  # a new id: no record of it to continue
    deliveries: int = 1  # a task's leg: its delivery of the run (redelivered: more)


class RunLog:
    """The server's run history: its store and output limit, and who is told of each
    status change (``updated(caller_id, flow_name, uris)``: the server's change
    notifier, told the run's URI and the listing's).

    ``records`` False: no run history, only the outputs too large to send in one
    message, each kept with the record of its run in the server's output spill (a
    :class:`~.spill.SpillStore`). ``task_links`` False: a background task's output
    is not linked from here (a spill that another process's task worker cannot reach).
    Servers build theirs with :meth:`open` or :meth:`spill`.
    """

    def __init__(self, settings: RunHistory, store: RunStore, *,
                 records: bool = True, task_links: bool = True,
                 updated: RunUpdated | None = None) -> None:
        self.settings = settings
        self.store = store
        self.records = records
        self.task_links = task_links
        self.updated = updated

    @classmethod
    def open(cls, settings: RunHistory, updated: RunUpdated | None = None) -> RunLog:
        """The run log a server's ``run_history`` asks for."""
        return cls(settings, open_store(settings), updated=updated)

    @classmethod
    def spill(cls, *, task_links: bool = True) -> RunLog:
        """Where a server without a run history keeps outputs too large to send: its
        output spill (:mod:`.spill`). ``task_links`` False: its background tasks may
        run in other processes (a shared task backend), whose spills no client
        reaches."""
        settings = RunHistory(max_runs=SPILL_MAX_OUTPUTS, max_age=SPILL_MAX_AGE,
                              max_output_bytes=SPILL_MAX_BYTES)
        return cls(settings, SpillStore(SPILL_MAX_OUTPUTS, SPILL_MAX_AGE, SPILL_MAX_BYTES),
                   records=False, task_links=task_links)

    async def save(self, record: RunRecord, *, new: bool = False,
                   changed: bool = True) -> None:
        try:
            await self.store.save(record, new=new)
        except Exception as error:  # a lost record must never fail the run
            logger.warning("run %s: its record could not be saved (%s)", record.run_id,
                           type(error).__name__)
            return
        if changed and self.updated is not None:
            await self.updated(record.caller, record.flow, [run_uri(record.run_id), RUNS_URI])

    async def forget(self, run_id: str) -> None:
        """Delete a record; when the store fails (it logged why), retention drops it."""
        try:
            await self.store.delete(run_id)
        except RunStoreError:
            logger.warning("run %s: its record could not be deleted (RunStoreError)",
                           run_id)

    async def cancelled(self, run_id: str) -> None:
        """Mark a run cancelled (a background task's ``tasks/cancel``, which a store
        that fails never fails: it logged why). Only a run not yet finished: the
        record its own run saves as it ends (its steps, where it stopped) wins."""
        await self._end(run_id, "cancelled", None, "cancelled by its caller")

    async def refused(self, run_id: str) -> None:
        """A background task's run that its worker would not start (its flow version is
        not published there, or not as it was where the task was created): its record
        ends ``failed`` (``FlowUnavailable``) rather than saying ``running`` for good.
        Only a run not yet finished."""
        await self._end(run_id, "failed", "FlowUnavailable",
                        "failed: the worker that took its task would not run it")

    async def _end(self, run_id: str, status: RunStatus, error_type: str | None,
                   why: str) -> None:
        try:
            record = await self.store.end(run_id, time.time(), status, error_type)
        except RunStoreError:
            logger.warning("run %s: its record could not be marked %s (RunStoreError)",
                           run_id, status)
            return
        if record is None:
            return
        # The run's own end says how it went (and is logged where it ran); this is the
        # record's word until then, or for good if its worker is gone.
        logger.info("run %s of flow %r version %s: %s", run_id, record.flow,
                    record.version, why)
        if self.updated is not None:
            await self.updated(record.caller, record.flow, [run_uri(run_id), RUNS_URI])


def open_store(settings: RunHistory) -> RunStore:
    """The store a ``RunHistory(store=...)`` URL names."""
    if settings.store.startswith("memory://"):
        return MemoryRunStore(settings.max_runs, settings.max_age, settings.max_output_bytes)
    from chainweaver.mcp.runs.redis_records import RedisRunStore

    return RedisRunStore(settings.store, max_runs=settings.max_runs, max_age=settings.max_age,
                         prefix=settings.prefix)


# Failures that are the caller's mistake, not the server's: logged at info, so that
# a client sending bad arguments cannot fill the operator's log with warnings.
CALLER_ERRORS = frozenset({"InputValidationError"})


def log_unsuccessful(record: RunRecord) -> None:
    """The operator's line for a failed, cancelled or refused run."""
    if record.error_step:
        where = f" at step {record.error_step!r}"
    else:
        # The flow's input is checked before any step; other failures without a step
        # say nothing of where (a run without a history keeps no steps to tell).
        where = " before any step" if record.error_type == "InputValidationError" else ""
    level = logging.INFO if record.error_type in CALLER_ERRORS else logging.WARNING
    logger.log(level, "run %s of flow %r version %s %s%s: %s", record.run_id, record.flow,
               record.version, record.status, where, record.error_type or "(no error type)")


class RunRecorder(RunObserver):
    """Builds one run's record from its steps, and saves it at each status change.

    Without a run history (``log`` None) nothing keeps a record, so none is built
    unless the run fails (its warning line names it) or its output is kept in the
    spill; the recorder then observes no step (:attr:`observes`)."""

    def __init__(self, log: RunLog | None, exposed: ExposedFlow, start: RunStart,
                 names: StepNames, outputs: RunLog | None = None) -> None:
        self.log = log
        # Where an output too large for the result is kept: the history, or without
        # one the server's output spill.
        self.outputs = outputs or log
        self.start = start
        self.names = names
        self._exposed = exposed
        self._started_at = time.time()
        self._record: RunRecord | None = None
        self._decided_at: float | None = None  # when the approval was answered
        start.note.run_id = start.run_id

    @property
    def record(self) -> RunRecord:
        """The run's record, built on first use."""
        if self._record is None:
            start, exposed, now = self.start, self._exposed, self._started_at
            self._record = RunRecord(start.run_id, exposed.flow.name, exposed.flow.version,
                                     exposed.tool_name, start.caller_id, int(now * 1e6), now,
                                     task_id=start.task_id, deliveries=start.deliveries,
                                     subflows=self.names.named_subflows())
        return self._record

    def linked_output(self) -> dict[str, Any] | None:
        """``_meta.chainweaver.output`` when the output travels as a link (None: not)."""
        return None if self._record is None else output_meta(self._record)

    @property
    def observes(self) -> bool:
        """Whether the run's steps need telling: only a record in a history lists them."""
        return self.log is not None

    @property
    def run_id(self) -> str:
        return self.start.run_id  # the record's too: both move together

    async def begin(self) -> None:
        """Save the record as running (a task's later leg, or the retry of a call that
        asked for approval, continues the record it left). A call naming a run that no
        longer waits for approval (a replayed approval state) is a run of its own: it
        never rewrites how that run ended."""
        if self.log is None:
            return
        record = self.record
        try:
            known = None if self.start.fresh else await self.log.store.get(record.run_id)
        except RunStoreError:
            # The store failed (it logged why). The run goes on, unrecorded: filing a
            # new record over one it could not read could rewrite how that run went.
            logger.warning("run %s: its record could not be read; this run is not "
                           "recorded (RunStoreError)", record.run_id)
            self.log = None
            return
        # Never continued: another caller's record, or (a call) a run that no longer
        # waits for approval.
        if known is not None and (known.caller != record.caller or (
                record.task_id is None and known.status != "waiting_approval")):
            record.run_id = self.start.run_id = self.start.note.run_id = new_run_id()
            known = None
        if known is not None:
            record.seq, record.started_at = known.seq, known.started_at
            record.approvals = list(known.approvals)
        await self.log.save(record, new=known is None)

    def run_started(self, flow_name: str, flow_version: str, total_steps: int) -> None:
        # The first step is scheduled right after an approval was given.
        if self._decided_at is None:
            self._decided_at = time.time()

    async def asking(self) -> None:
        """The run asks its user for approval over the 2025-11-25 back-channel (an
        elicitation) and waits for the answer: ``waiting_approval`` meanwhile."""
        if self.log is not None:
            self.record.status = "waiting_approval"
            await self.log.save(self.record)

    async def answered(self) -> None:
        """The user answered an elicitation :meth:`asking` waited for."""
        self._decided_at = time.time()
        if self.log is not None and self.record.status == "waiting_approval":
            self.record.status = "running"
            await self.log.save(self.record)

    def step_finished(self, record: StepRecord) -> None:
        # Steps of the async lane end on the loop and in threads: list.append is atomic.
        # Without a history no one reads them.
        if self.log is not None:
            entry = step_entry(record, "full", self.names)
            if record.restored:  # a durable run's step taken from its checkpoint
                entry["restored"] = True
            self.record.steps.append(entry)

    async def waiting(self, state: str | None) -> None:
        """The run asked for approval and waits: a call's record moves to the id its
        retry will name (from ``state``); a task keeps its own."""
        if self.log is None:
            return
        record = self.record
        record.status = "waiting_approval"
        if state is not None and record.task_id is None:
            await self.log.forget(record.run_id)
            # A freshly minted state: no run has its id yet.
            record.run_id = self.start.run_id = self.start.note.run_id = \
                state_run_id(record.caller, state)
            await self.log.save(record, new=True)
            return
        await self.log.save(record)

    async def finish(self, result: ExecutionResult | None, tool_result: ToolResult,
                     approval: Any = None, *, error_type: str = "FlowUnavailable") -> None:
        """The run ended with ``tool_result`` (``result``: the executor's, None when the
        flow never ran: then a failure's type is ``error_type``)."""
        error = result.error if result is not None else None
        failed = bool(tool_result.is_error) and not _linked(tool_result)
        if self.log is None and not failed:
            return  # a success with no history: nothing to keep and nothing to log
        record, note = self.record, self.start.note
        record.ended_at = time.time()
        if approval is not None and approval.outcome != "not_asked":
            request = approval.request
            record.approvals.append({
                "at": self._decided_at or record.ended_at, "decision": approval.outcome,
                "steps": [self.names.path(step) for step in request.step_ids]
                if request is not None else []})
        record.status = _status(error.type if error is not None else None, failed)
        if failed:
            record.error_type = error.type if error is not None else error_type
            record.error_step = self.names.path(error.step_id) \
                if error is not None and error.step_id is not None else None
            note.error_type = record.error_type
        elif record.output_sha256 is None and self.log is not None:
            data = "\n".join(getattr(block, "text", "")
                             for block in tool_result.content).encode("utf-8")
            record.output_sha256 = hashlib.sha256(data).hexdigest()
            record.output_size, record.output_mime = len(data), OUTPUT_MIME
        if record.status != "completed":
            log_unsuccessful(record)
        if self.log is not None:
            await self.log.save(record)

    async def cancelled(self) -> None:
        record = self.record
        record.status, record.ended_at = "cancelled", time.time()
        record.error_type = "CancelledError"
        # Where it stopped: the step (as the caller may see it) cancelled while running.
        record.error_step = next((entry["id"] for entry in record.steps
                                  if entry.get("status") == "cancelled"), None)
        log_unsuccessful(record)
        if self.log is not None:
            await self.log.save(record)

    async def outgoing(self, tool_result: ToolResult, *, has_schema: bool) -> ToolResult:
        """``tool_result`` (a success), or, when its output is above the history's
        output limit or too large to send in one message, a preview and a
        ``resource_link`` to the output kept in the store (see ``docs/run-history.md``
        for flows with an output schema); an ``isError`` result naming the limit when
        nowhere can keep it."""
        log = self.outputs
        if log is None or len(tool_result.content) != 1:
            return tool_result
        text = getattr(tool_result.content[0], "text", "")
        # A flow with an output schema sends its output twice: as text, and structured.
        parts = [text, text] if has_schema else [text]
        limit = log.settings.output_limit if log.records else None
        within = limit is None or len(text) * 4 <= limit or len(text.encode()) <= limit
        sent = sent_size(parts)
        if within and sent is None:
            return tool_result
        data = text.encode("utf-8")
        if not within:
            why = (f"is {len(data)} bytes, above this server's limit of {limit} bytes for "
                   "a tool result")
        else:
            why = (f"would take {sent} bytes as sent, above the {MESSAGE_BUDGET} bytes one "
                   "MCP message carries to a standard client")
        record, note = self.record, self.start.note
        keeps = getattr(log.store, "max_output_bytes", None)
        if keeps is not None and len(data) > keeps:
            return unsendable(record.tool, len(data))
        if not log.records and record.task_id is not None and not log.task_links:
            # A worker's spill is in its own process: no replica could read the link.
            return unsendable(record.tool, len(data), unlinked=True)
        record.output_sha256 = note.output_sha256 = hashlib.sha256(data).hexdigest()
        record.output_size = note.output_length = len(data)
        record.output_mime, record.output_stored = OUTPUT_MIME, True
        if isinstance(log.store, SpillStore):
            # Only this run's output is kept, with just enough of its record to answer
            # its caller alone, while its flow is in that caller's view.
            record.status, record.ended_at = "completed", time.time()
            if not log.store.keep(dataclasses.replace(record), data):
                record.output_stored = False
                return unsendable(record.tool, len(data))
            return link_result(record, data, why, has_schema)
        try:
            await log.store.put_output(record.run_id, data)
        except Exception as error:  # the store failed (it logged the detail)
            logger.warning("run %s: its output could not be kept (%s)", record.run_id,
                           type(error).__name__)
            record.output_stored = False
            return unsendable(record.tool, len(data), output=True, now=True)
        return link_result(record, data, why, has_schema)


def _linked(tool_result: ToolResult) -> bool:
    return any(isinstance(block, ResourceLink) for block in tool_result.content)


def _status(error_type: str | None, failed: bool) -> RunStatus:
    if not failed:
        return "completed"
    return "cancelled" if error_type == "CancelledError" else "failed"


def link_result(record: RunRecord, data: bytes, why: str, has_schema: bool) -> ToolResult:
    """A short preview of the output and a link to all of it (``why``: why the output
    is not in the result). For a flow with an output schema it is an ``isError``
    result: a success would have to carry structured content that fits the schema,
    and a preview never does."""
    uri = output_link(record.run_id)
    preview = data[:PREVIEW_BYTES].decode("utf-8", "ignore")
    size = len(data)
    said = (f"The output of flow {record.tool!r} {why}; read it from {uri} "
            f"(in ranges: ?offset=N&length=M, at most {MAX_RANGE_BYTES} bytes each).")
    text = f"{said}\nPreview: {preview}…" if has_schema else f"{preview}…\n[{said}]"
    link = ResourceLink(type="resource_link", uri=uri, name=f"{record.tool}_output",
                        title=f"Output of run {record.run_id}", mime_type=OUTPUT_MIME,
                        size=size, description="The whole output of the run, as JSON.")
    return ToolResult(content=[TextContent(type="text", text=text), link],
                      is_error=has_schema)


def output_link(run_id: str) -> str:
    """The URI of a run's output as the client of the request being served reads it:
    where its composition (a ``Namespace``, ``mount_into``) lets it reach the run
    resources, as the gate admitted the request. Every link and ``_meta`` URI to an
    output is written here."""
    held = admission.current()
    return output_uri(run_id, held.runs_root if held is not None else RUNS_URI)


def unsendable(tool: str, size: int, *, output: bool = True, now: bool = False,
               unlinked: bool = False) -> ToolResult:
    """The last resort: an ``isError`` result for a result of ``size`` bytes that no
    client could receive in one message: an output no store can keep for reading in
    ranges (``output``; ``now``: the store failed, it may keep it later;
    ``unlinked``: a background task's, with no run history its readers share), or an
    error message of that size."""
    if unlinked:
        kept = ("; a background task's output that large is kept for reading in ranges "
                "only with a run history every server process shares (run_history on "
                "Redis)")
    elif output:
        kept = ("; this server cannot keep it for reading in ranges right now, try "
                "again later" if now else "; this server cannot keep it for reading in "
                "ranges")
    else:
        kept = ""
    text = (f"The result of flow {tool!r} is {size} bytes, above the {MESSAGE_BUDGET} "
            f"bytes one MCP message carries to a standard client{kept}.")
    return ToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def sendable(tool: str, tool_result: ToolResult) -> ToolResult:
    """``tool_result``, or when it could not reach a client in one message (an error
    message of megabytes), an ``isError`` result naming the limit."""
    sent = sent_size([getattr(block, "text", "") for block in tool_result.content])
    if sent is None:
        return tool_result
    logger.warning("flow tool %r: a result of %d bytes as sent was replaced by an error "
                   "naming the message limit", tool, sent)
    return unsendable(tool, sent, output=False)


def output_meta(record: RunRecord) -> dict[str, Any] | None:
    """``_meta.chainweaver.output`` of a result whose output travels as a link."""
    if not record.output_stored:
        return None
    return {"uri": output_link(record.run_id), "size": record.output_size,
            "sha256": record.output_sha256, "mime_type": record.output_mime}


def run_start(run_id: str | None, caller_id: str, note: RunNote | None = None,
              task_id: str | None = None, *, deliveries: int = 1) -> RunStart:
    """Which run a flow tool's run is: ``run_id`` continued, or (None) a new one."""
    if run_id is None:
        return RunStart(new_run_id(), caller_id, task_id, note or RunNote(), fresh=True,
                        deliveries=deliveries)
    return RunStart(run_id, caller_id, task_id, note or RunNote(), deliveries=deliveries)
