"""A flow published as an MCP tool: schemas, annotations, metadata, and the call path.

``tools/call`` -> ``FlowTool.run`` -> ``FlowExecutor.execute_flow_async`` -> a
``ToolResult``: structured content when the output schema is known, an ``isError``
result (never a protocol error) when the arguments or the flow fail. While it runs,
the flow reports progress and log messages and may ask for approval (``runs.py``).

Anything else a call raises (reporting, approval, the executor, serialising the
result: a bug, or a FastMCP that moved) is caught at the tool's boundary: an
``isError`` result naming the flow and the failing part, with the exception's type at
most (not even that under ``error_detail="generic"``), never its message, which may
carry a file path or a value; the traceback goes to the server's log. A cancellation
and an ``MCPError`` (a protocol error, meant as one) go through unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import pydantic_core
from fastmcp.server.context import Context
from fastmcp.server.dependencies import CurrentContext, get_context
from fastmcp.tools.base import InputRequiredToolResult, ToolResult
from fastmcp.tools.base import Tool as FastMCPTool
from fastmcp.utilities.tasks import TaskConfig
from mcp.shared.exceptions import MCPError
from mcp_types import TextContent, ToolAnnotations

from chainweaver.checkpoints import CheckpointStore, CheckpointStoreError
from chainweaver.executor import ExecutionResult, FlowExecutor
from chainweaver.mcp.components.plain_slots import SET_BY_BUILD, PlainSlots, set_slots
from chainweaver.mcp.config import ErrorDetail
from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.views import View, Views
from chainweaver.mcp.live.cursors import sent_size
from chainweaver.mcp.publish.exposure import ExposedFlow
from chainweaver.mcp.publish.live_exposure import LiveExposure
from chainweaver.mcp.runs.approval import Approval, ApprovalInTask, RunSettings
from chainweaver.mcp.runs.recording import (
    RunLog,
    RunRecorder,
    RunStart,
    run_start,
    sendable,
    state_run_id,
)
from chainweaver.mcp.runs.reporting import RunReporter
from chainweaver.mcp.runs.step_names import ALL_VISIBLE, StepNames, run_meta, step_names
from chainweaver.run_events import ALWAYS_APPROVE, ApprovalHook, RunObserver, fan_out
from chainweaver.safety import SideEffectLevel
from chainweaver.step_guard import StepGuard, fixed_caller

logger = logging.getLogger("chainweaver.mcp")

GENERIC_FAILURE = "The flow failed. Ask the server operator to check its logs."


def tool_annotations(exposed: ExposedFlow) -> ToolAnnotations:
    """MCP hints from the flow's effective safety; unknown safety (forced) is worst-case."""
    safety = exposed.safety
    title = exposed.flow.display_title
    if safety is None:
        return ToolAnnotations(title=title, read_only_hint=False, destructive_hint=True,
                               idempotent_hint=False, open_world_hint=True)
    read_only = safety.read_only
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=safety.side_effects == SideEffectLevel.DESTRUCTIVE,
        idempotent_hint=bool(safety.idempotent),
        open_world_hint=safety.side_effects == SideEffectLevel.EXTERNAL or safety.open_world,
    )


def flow_meta(exposed: ExposedFlow) -> dict[str, Any]:
    flow = exposed.flow
    return {
        "flow": flow.name,
        "version": flow.version,
        "lifecycle": flow.governance.lifecycle.value,
        "owner": flow.governance.owner,
        "safety": exposed.safety.to_dict() if exposed.safety else None,
        "forced": exposed.forced,
        "needs_approval": exposed.needs_approval,
        "task_mode": exposed.task_mode,
    }


# Made once: json.dumps with keywords builds an encoder on every call.
_ARGUMENTS_JSON = json.JSONEncoder(ensure_ascii=False)
_OUTPUT_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def _sendable(arguments: dict[str, Any]) -> bool:
    """Whether ``arguments`` hold only text UTF-8 can carry (no lone surrogate)."""
    try:
        pydantic_core.to_json(arguments)  # in C: the common case, answered at once
        return True
    except pydantic_core.PydanticSerializationError:
        pass  # a lone surrogate, or something else JSON cannot carry: tell which
    try:
        _ARGUMENTS_JSON.encode(arguments).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except (ValueError, TypeError, RecursionError):
        return True  # not a Unicode problem: input validation reports it
    return True


class ServedFrom:
    """What a flow tool reads of the server publishing it while a call runs: the live
    exposure (every snapshot it swaps in) and the per-caller views."""

    def __init__(self, live: LiveExposure, views: Views,
                 view: Callable[[], View] | None = None, owner: str = "") -> None:
        self.live = live
        self.views = views
        self.view = view  # the current caller's view, as the publishing server admitted it
        self.owner = owner  # the owner mark of the publishing server's gate

    def readmits(self, exposed: ExposedFlow) -> bool:
        """Whether a call of ``exposed`` would be admitted now: its version is the one
        the newest snapshot publishes under its name, in the current caller's view."""
        latest = self.live.latest
        now = latest.tool(exposed.tool_name)
        return (now is not None and now.flow.name == exposed.flow.name
                and now.flow.version == exposed.flow.version
                and self.views.of(latest, admission.caller(self.owner)).allows(now))

    def step_names(self, exposed: ExposedFlow) -> StepNames:
        """How ``exposed``'s steps are named to the current caller (its view of the
        snapshot the request pinned, as admitted), worked out once per view."""
        snapshot = self.live.current
        view = self.view() if self.view is not None \
            else self.views.of(snapshot, admission.caller(self.owner))
        return step_names(view, snapshot, exposed)


class FlowTool(PlainSlots, FastMCPTool):
    """The MCP tool for one exposed flow."""

    # Plain attributes, not pydantic private ones: a call reads them (plain_slots.py).
    __slots__ = ("_executor", "_exposed", "_error_detail", "_timeout", "_runs", "_served",
                 "_run_log", "_outputs", "_sent", "_owner")
    if TYPE_CHECKING:  # annotated at run time, pydantic would make them private again
        _executor: FlowExecutor = SET_BY_BUILD
        _exposed: ExposedFlow = SET_BY_BUILD
        _error_detail: str = SET_BY_BUILD
        _timeout: float | None = SET_BY_BUILD
        _runs: RunSettings = SET_BY_BUILD
        _served: ServedFrom | None = SET_BY_BUILD
        _run_log: RunLog | None = SET_BY_BUILD
        _outputs: RunLog | None = SET_BY_BUILD
        _sent: tuple[str, int] | None = SET_BY_BUILD
        _owner: str = SET_BY_BUILD  # the publishing server's gate: whose caller runs it

    @classmethod
    def build(
        cls,
        exposed: ExposedFlow,
        executor: FlowExecutor,
        *,
        error_detail: ErrorDetail = "full",
        timeout: float | None = None,
        runs: RunSettings | None = None,
        live: LiveExposure | None = None,
        views: Views | None = None,
        view: Callable[[], View] | None = None,
        run_log: RunLog | None = None,
        outputs: RunLog | None = None,
        owner: str = "",
    ) -> FlowTool:
        flow = exposed.flow
        tool = cls(
            name=exposed.tool_name,
            title=flow.display_title,
            description=flow.description,
            parameters=exposed.contract.input_schema,
            output_schema=exposed.contract.output_schema,
            annotations=tool_annotations(exposed),
            meta={"chainweaver": flow_meta(exposed)},
            task_config=TaskConfig(mode=exposed.task_mode),  # type: ignore[arg-type]
        )
        set_slots(tool, _executor=executor, _exposed=exposed, _error_detail=error_detail,
                  _timeout=timeout, _runs=runs if runs is not None else RunSettings(),
                  _served=None if live is None
                  else ServedFrom(live, views or Views(None), view, owner),
                  _run_log=run_log, _outputs=outputs or run_log, _sent=None, _owner=owner)
        return tool

    def sent_size(self) -> int:
        """This tool's bytes in a ``tools/list`` as sent (measured once: a component
        never changes; a renamed copy, which carries the slot, measures its own)."""
        sent = self._sent
        if sent is None or sent[0] != self.name:
            sent = (self.name, sent_size(self.to_mcp_tool(name=self.name)))
            set_slots(self, _sent=sent)
        return sent[1]

    @property
    def exposed(self) -> ExposedFlow:
        """The exposure decision this tool publishes."""
        return self._exposed

    def step_names(self) -> StepNames:
        """How this flow's steps are named to the caller being served (every step by its
        id when the tool was built without its server)."""
        if self._served is None:
            return ALL_VISIBLE
        return self._served.step_names(self._exposed)

    def readmits(self) -> bool:
        """Whether this flow version would be admitted for the current caller now."""
        return self._served is None or self._served.readmits(self._exposed)

    async def run(self, arguments: dict[str, Any],
                  ctx: Context = CurrentContext()) -> ToolResult:  # noqa: B008
        return await self.run_flow(arguments, ctx)

    async def run_flow(self, arguments: dict[str, Any], ctx: Context | Any = None, *,
                       status: RunObserver | None = None,
                       in_task: ApprovalInTask | None = None,
                       run: RunStart | None = None,
                       checkpoints: CheckpointStore | None = None) -> ToolResult:
        """Run the flow: ``tools/call`` comes here through :meth:`run`, a background
        task's runner directly, with ``status`` observing the steps (the task's status
        message) in place of the client's progress and log reports, ``in_task``
        saying how its approval is asked and audited, ``run`` which run it is (its
        id, caller and task), and ``checkpoints`` where a durable run keeps its steps."""
        call = _Call()
        try:
            return await self._call(call, arguments, ctx, status, in_task, run, checkpoints)
        except (MCPError, CheckpointStoreError):
            # A protocol error, meant as one (asyncio.CancelledError is no Exception);
            # a task store that failed under a durable run: no failure of the flow (the
            # task's runner stops the leg, and the run resumes on redelivery).
            raise
        except Exception as error:
            if call.reporter is not None:
                call.reporter.abandon()
            result = self._unexpected(error, call.part)
            if call.recorder is None:
                return result
            return await self._ended(call.recorder, result, error_type=_type_name(error))

    def _step_guard(self) -> StepGuard | None:
        """What the run asks before every attempt of every step: the declared grants
        against the caller as it is now, then the server's step authorizer (None: the
        flow declares no grant and there is no authorizer, so nothing is asked)."""
        settings = self._runs
        plan = self._exposed.plan
        if not plan.needs and settings.step_authorizer is None:
            return None
        caller = admission.caller(self._owner)
        refresh = settings.refresh_caller
        # A partial, not a lambda: the guard tells an async refresh_caller by it.
        source = fixed_caller(caller) if refresh is None else functools.partial(refresh,
                                                                                caller)
        flow = plan.flow
        return StepGuard(source, settings.step_authorizer, flow.name, flow.version,
                         delegations=tuple(flow.delegations))

    def _run_start(self, ctx: Context | None) -> RunStart:
        """Which run a ``tools/call`` starts: the retry of a call that asked for approval
        continues that call's run (named by the state the client echoes)."""
        held = admission.current()
        caller_id = admission.caller(self._owner).id
        state = getattr(ctx, "request_state", None) if self._exposed.needs_approval else None
        return run_start(state_run_id(caller_id, state) if isinstance(state, str) else None,
                         caller_id, held.run if held is not None else None)

    async def _ended(self, recorder: RunRecorder, tool_result: ToolResult,
                     result: ExecutionResult | None = None, approval: Approval | None = None,
                     *, meta: dict[str, Any] | None = None,
                     error_type: str = "FlowUnavailable") -> ToolResult:
        """``tool_result`` with the run's id (and linked output) in its ``_meta``, once
        the run's record says how it ended."""
        if tool_result.is_error:  # a success was measured as it went out (outgoing)
            tool_result = sendable(self.name, tool_result)
        await recorder.finish(result, tool_result, approval, error_type=error_type)
        meta = meta or {"chainweaver": {}}
        meta["chainweaver"]["run_id"] = recorder.run_id
        linked = recorder.linked_output()
        if linked is not None:
            meta["chainweaver"]["output"] = linked
        tool_result.meta = meta
        return tool_result

    async def _call(self, call: _Call, arguments: dict[str, Any], ctx: Context | Any,
                    status: RunObserver | None, in_task: ApprovalInTask | None,
                    run: RunStart | None, checkpoints: CheckpointStore | None = None
                    ) -> ToolResult:
        """:meth:`run_flow`'s work, saying in ``call`` which part of it is under way."""
        flow = self._exposed.flow
        call.part = "reading the request"
        if not isinstance(ctx, Context):
            # Called as tools/call does (run(arguments)), the default is the dependency
            # marker itself; a background-task worker injects a real Context.
            ctx = _request_context()
        call.part = "run records"
        names = self.step_names()
        recorder = call.recorder = RunRecorder(self._run_log, self._exposed,
                                               run or self._run_start(ctx), names,
                                               self._outputs)
        if recorder.log is not None:  # no run history: nothing to save yet
            await recorder.begin()
        call.part = "checking the arguments"
        if not _sendable(arguments):
            # A lone surrogate ("\ud800" in the request's JSON): the reply could not echo
            # it, and the flow must not run on text that is not Unicode.
            text = f"Invalid arguments for {self.name!r}: text must be valid Unicode"
            return await self._ended(recorder, ToolResult(
                content=[TextContent(type="text", text=text)], is_error=True),
                error_type="InputValidationError")
        call.part = "run reporting"
        reporter = None
        if ctx is not None and status is None and self._runs.notifications:
            reporter = call.reporter = RunReporter.wanted(
                ctx, self.name, show_error_type=self._error_detail != "generic",
                label=names.label)
        call.part = "approval"
        # A flow published without asking (the operator's allow_requires_approval or
        # force_expose) runs by that explicit choice; one that asks goes through Approval.
        approval: Approval | None = None
        approve: ApprovalHook = ALWAYS_APPROVE
        if self._exposed.needs_approval:
            if ctx is None:
                return await self._ended(recorder, self._error_result(
                    "ApprovalDenied", "no client to ask for approval"),
                    error_type="ApprovalDenied")
            approval = approve = Approval(ctx, self.name, self._runs, in_task,
                                          arguments=arguments, readmit=self.readmits,
                                          shown=names.shown, waiting=recorder,
                                          owner=self._owner)
        call.part = "the run"
        held = admission.current()
        watching = held.observers if held is not None and status is None else ()
        guard = self._step_guard()
        # Only what is on watches the run: with nothing asked for, no observer at all.
        observer = fan_out(status or reporter, recorder if recorder.observes else None,
                           *watching)
        try:
            result = await self._executor.execute_flow_async(
                flow.name, arguments, version=flow.version, timeout=self._timeout,
                plan=self._exposed.plan, observer=observer, approve=approve,
                run_id=recorder.run_id, checkpoints=checkpoints, guard=guard)
        except BaseException as error:
            if reporter is not None:
                reporter.abandon()
            if isinstance(error, asyncio.CancelledError):
                logger.info("a call of %r was cancelled by the client", self.name)
                with anyio.CancelScope(shield=True):
                    await recorder.cancelled()
            raise
        if guard is not None:
            recorder.start.note.steps = guard.decisions.summary()
        call.part = "run reporting"
        if reporter is not None:
            await reporter.close()
        call.part = "approval"
        if approval is not None and approval.ask is not None:
            call.part = "run records"
            await recorder.waiting(approval.ask.request_state)
            return InputRequiredToolResult(approval.ask)
        if approval is not None and approval.outcome == "flow_unavailable":
            return await self._ended(recorder, self._unavailable(), approval=approval)
        call.part = "serialising the result"
        meta = run_meta(result, self._error_detail, names)
        if not result.success:
            tool_result = self._failure(result, approval, names)
        else:
            try:
                tool_result = self._success(result)
            except (TypeError, ValueError, RecursionError,
                    pydantic_core.PydanticSerializationError) as error:
                # NaN / Infinity, a lone surrogate, nesting too deep to encode, or an
                # object JSON cannot carry: valid JSON or an error, never text that breaks
                # the advertised output schema or the transport.
                tool_result = self._error_result(
                    "OutputSerializationError",
                    f"flow {self._exposed.flow.name!r} output cannot be sent as JSON: {error}")
                return await self._ended(recorder, tool_result, meta=meta,
                                         error_type="OutputSerializationError")
            call.part = "run records"
            tool_result = await recorder.outgoing(
                tool_result, has_schema=self.output_schema is not None)
        # A success is an error here only when its output could not be sent or kept.
        return await self._ended(recorder, tool_result, result, approval, meta=meta,
                                 error_type="OutputTooLarge")

    def _unexpected(self, error: Exception, part: str) -> ToolResult:
        """The isError result for an exception nothing expected: the flow and the part
        that failed (and the exception's type, unless ``error_detail`` is ``"generic"``),
        with a reference to the traceback in the server's log. Never the exception's
        text: it may hold a file path, a value or a secret."""
        reference = secrets.token_hex(4)
        logger.exception("flow tool %r failed unexpectedly in %s (error reference %s)",
                         self.name, part, reference)
        kind = "" if self._error_detail == "generic" else f" ({_type_name(error)})"
        text = (f"Flow {self.name!r} failed unexpectedly in {part}{kind}. Ask the server "
                f"operator to check its logs (error reference {reference}).")
        return ToolResult(content=[TextContent(type="text", text=text)], is_error=True)

    def _success(self, result: ExecutionResult) -> ToolResult:
        output = pydantic_core.to_jsonable_python(result.final_output)
        text = _OUTPUT_JSON.encode(output)
        text.encode("utf-8")  # a lone surrogate cannot be sent: UnicodeEncodeError
        if self.output_schema is None:
            return ToolResult(content=[TextContent(type="text", text=text)])
        return ToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=output)

    def _unavailable(self) -> ToolResult:
        """The flow left the server, or the caller's view, while the run waited for its
        approval: the same words either way, and nothing ran."""
        text = f"Flow {self.name!r} is no longer available; nothing ran."
        return ToolResult(content=[TextContent(type="text", text=text)], is_error=True)

    def _failure(self, result: ExecutionResult, approval: Approval | None = None,
                 names: StepNames = ALL_VISIBLE) -> ToolResult:
        error = result.error
        assert error is not None
        answer = approval.outcome if approval is not None else "none"
        if error.type == "InputValidationError" and error.step_id is None:
            # The caller's own mistake: always say which field, whatever error_detail says.
            text = f"Invalid arguments for {self.name!r}: {error.detail}"
            return ToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        if error.type == "ApprovalDenied":
            # Only what the user was shown when asked (and the answer): always in full.
            message = error.message
            request = approval.request if approval is not None else None
            if request is not None and approval is not None and names.hides_any():
                # The engine's words name every covered step's path; the user was shown
                # them with the sub-flows it cannot see unnamed.
                shown = approval.shown(request).describe()
                message = (f"flow {self.name!r} {request.flow_version}: approval of "
                           f"{shown} was not given, so no step ran")
                if request.changed is not None:  # asked again mid-run (approved.py)
                    step = names.label(error.step_id or "")
                    message = (f"step {step!r}: its grant decision changed after the "
                               f"run was approved; approval of {shown} was asked again "
                               "and not given, so it did not run")
            text = f"ApprovalDenied: {message} (answer: {answer})"
            return ToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        if names.hides_any():
            # A flow running a sub-flow the caller cannot see: the engine's message may
            # name it from any step (a failure nested inside a visible sub-flow, a later
            # step missing what a skipped hidden step would have given), so only the
            # failing step's label is said.
            label = names.label(error.step_id) if error.step_id is not None else None
            return self._error_result(error.type, f"step {label!r} failed" if label
                                      else f"flow {self.name!r} failed")
        return self._error_result(error.type, error.message)

    def _error_result(self, error_type: str, message: str) -> ToolResult:
        """An isError result showing as much as ``error_detail`` allows."""
        text = self.failure_text(error_type, message)
        return ToolResult(content=[TextContent(type="text", text=text)], is_error=True)

    def failure_text(self, error_type: str, message: str) -> str:
        """What an isError result says: as much as ``error_detail`` allows."""
        if self._error_detail == "full":
            return f"{error_type}: {message}"
        return error_type if self._error_detail == "type_only" else GENERIC_FAILURE


class _Call:
    """One call of a flow tool, as far as an unexpected failure needs to know it."""

    __slots__ = ("part", "recorder", "reporter")

    def __init__(self) -> None:
        self.part = "the call"  # named in the result when something unexpected fails
        self.reporter: RunReporter | None = None
        self.recorder: RunRecorder | None = None


def _type_name(error: BaseException) -> str:
    """The exception's class name, when it is a plain identifier (a class made with
    ``type()`` may be named anything, a path or a value too)."""
    name = type(error).__name__
    return name if name.isidentifier() and name.isascii() else "Exception"


def _request_context() -> Context | None:
    try:
        return get_context()
    except RuntimeError:  # called outside any MCP request (directly, in a test)
        return None
