"""FlowExecutor: runs flows step by step, validating every input and output.

A run never raises for bad data: invalid input, a tool that raises or returns the
wrong shape, or a missing context key ends the run with ``success=False`` and an
error naming the step, the tool and the field; the steps before it stay recorded.
Only programming errors about *which* flow to run (unknown name or version) raise.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import DuplicateToolError, FlowValidationError, ToolNotFoundError
from .flows import Flow
from .registry import FlowRegistry
from .safety import ToolSafetyContract, merge_safety_contracts
from .tools import Tool

logger = logging.getLogger("chainweaver.executor")


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a run failed: an error type, a message, and where it happened."""

    type: str
    message: str
    step_index: int | None = None
    tool_name: str | None = None
    field: str | None = None


@dataclass(slots=True)
class StepRecord:
    """What one step received, returned and how long it took."""

    index: int
    tool_name: str
    inputs: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    duration_ms: float = 0.0


@dataclass(slots=True)
class ExecutionResult:
    """The outcome of one flow run."""

    flow_name: str
    flow_version: str
    success: bool
    final_output: dict[str, Any] | None
    error: ErrorInfo | None
    steps: list[StepRecord] = field(default_factory=list)
    duration_ms: float = 0.0


class StepFailed(Exception):
    """Internal: carries the ErrorInfo of a failed step out of the step loop."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


@dataclass(frozen=True, slots=True)
class _PlannedStep:
    index: int
    tool: Tool
    # (tool input field, context key, explicitly mapped?)
    sources: tuple[tuple[str, str, bool], ...]


def _first_error_field(error: ValidationError) -> str | None:
    errors = error.errors()
    if not errors or not errors[0].get("loc"):
        return None
    return ".".join(str(part) for part in errors[0]["loc"])


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        where = ".".join(str(p) for p in item.get("loc", ())) or "(root)"
        parts.append(f"{where}: {item.get('msg')}")
    return "; ".join(parts)


class FlowExecutor:
    """Runs registered flows with the tools registered on it."""

    def __init__(self, registry: FlowRegistry, *, max_threads: int = 32) -> None:
        self.registry = registry
        self._tools: dict[str, Tool] = {}
        self._plans: dict[tuple[str, str], list[_PlannedStep]] = {}
        self._max_threads = max_threads
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ tools

    def register_tool(self, tool: Tool) -> Tool:
        """Make ``tool`` available to flow steps; a second tool with its name is an error."""
        if not isinstance(tool, Tool):
            raise TypeError(f"register_tool expects a Tool, got {type(tool).__name__}")
        if tool.name in self._tools:
            raise DuplicateToolError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._plans.clear()
        return tool

    def get_tool(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolNotFoundError(f"no tool named {name!r} is registered") from None

    @property
    def tools(self) -> Mapping[str, Tool]:
        return dict(self._tools)

    # ---------------------------------------------------- schemas and safety

    def input_model(self, flow: Flow) -> type[BaseModel] | None:
        """The flow's input model: its own, else its first tool's (None if that tool is missing)."""
        if flow.input_schema is not None:
            return flow.input_schema
        tool = self._tools.get(flow.steps[0].tool_name)
        return tool.input_schema if tool else None

    def output_model(self, flow: Flow) -> type[BaseModel] | None:
        """The flow's output model: its own, else its last tool's (None when unknown)."""
        if flow.output_schema is not None:
            return flow.output_schema
        tool = self._tools.get(flow.steps[-1].tool_name)
        return tool.output_schema if tool else None

    def effective_safety(self, flow: Flow) -> ToolSafetyContract | None:
        """The flow's own contract, else the merge of its tools', else None (unknown).

        Unknown means at least one step's tool is missing or declares no contract.
        """
        if flow.safety is not None:
            return flow.safety
        contracts = []
        for step in flow.steps:
            tool = self._tools.get(step.tool_name)
            if tool is None or tool.safety is None:
                return None
            contracts.append(tool.safety)
        return merge_safety_contracts(contracts)

    def check_flow(self, flow: Flow) -> list[str]:
        """Problems that would make ``flow`` fail before it runs: missing tools, bad mappings."""
        problems = []
        for index, step in enumerate(flow.steps):
            tool = self._tools.get(step.tool_name)
            if tool is None:
                problems.append(f"step {index} uses unregistered tool {step.tool_name!r}")
                continue
            for tool_field in step.input_mapping:
                if tool_field not in tool.input_fields:
                    problems.append(
                        f"step {index} ({step.tool_name!r}) maps field {tool_field!r}, "
                        f"which the tool's input does not have"
                    )
        return problems

    def validate_flow(self, flow: Flow) -> None:
        """Raise :class:`FlowValidationError` if :meth:`check_flow` finds problems."""
        problems = self.check_flow(flow)
        if problems:
            raise FlowValidationError(flow.name, problems)

    # ------------------------------------------------------------- execution

    def execute_flow(
        self, name: str, input: Mapping[str, Any] | BaseModel, version: str | None = None
    ) -> ExecutionResult:
        """Run a flow synchronously; async tools run on a private event loop."""
        flow = self.registry.get_flow(name, version)
        started = time.perf_counter()
        records: list[StepRecord] = []
        try:
            plan, context = self._start(flow, input)
            for planned in plan:
                context = self._run_step_sync(planned, context, records)
            return self._finish(flow, context, records, started)
        except StepFailed as failure:
            return self._failed(flow, failure.info, records, started)

    async def execute_flow_async(
        self,
        name: str,
        input: Mapping[str, Any] | BaseModel,
        version: str | None = None,
        *,
        timeout: float | None = None,
    ) -> ExecutionResult:
        """Run a flow without blocking the event loop.

        Async tools are awaited natively; each stretch of consecutive sync tools
        runs in one worker-thread hop. ``timeout`` (seconds) bounds the whole run;
        a run that exceeds it fails with ``TimeoutError`` and keeps its finished steps.
        After a timeout or cancellation no further step starts; a sync tool already
        running in a worker thread cannot be interrupted, so it finishes (holding its
        pool slot) and its output is discarded.
        """
        flow = self.registry.get_flow(name, version)
        started = time.perf_counter()
        records: list[StepRecord] = []
        # Set when this call is over (timed out, cancelled or done): a worker thread still
        # inside a sync stretch then starts no further step.
        abandoned = threading.Event()
        try:
            if timeout is None:
                context = await self._run_async(flow, input, records, abandoned)
            else:
                context = await asyncio.wait_for(
                    self._run_async(flow, input, records, abandoned), timeout
                )
            return self._finish(flow, context, records, started)
        except StepFailed as failure:
            return self._failed(flow, failure.info, records, started)
        except asyncio.TimeoutError:
            abandoned.set()
            # Snapshots: a stuck worker thread may still write to the originals.
            records = [replace(record) for record in records]
            step = len(records) - 1 if records else None
            info = ErrorInfo(
                "TimeoutError",
                f"flow {flow.name!r} did not finish within {timeout} s",
                step_index=step,
                tool_name=records[-1].tool_name if records else None,
            )
            return self._failed(flow, info, records, started)
        finally:
            abandoned.set()

    async def _run_async(
        self, flow: Flow, input: Mapping[str, Any] | BaseModel, records: list[StepRecord],
        abandoned: threading.Event,
    ) -> dict[str, Any]:
        plan, context = self._start(flow, input)
        position = 0
        while position < len(plan):
            planned = plan[position]
            if planned.tool.is_async:
                context = await self._run_step_async(planned, context, records)
                position += 1
                continue
            end = position
            while end < len(plan) and not plan[end].tool.is_async:
                end += 1
            stretch = plan[position:end]
            loop = asyncio.get_running_loop()
            context = await loop.run_in_executor(
                self._thread_pool(), self._run_sync_stretch, stretch, context, records,
                abandoned,
            )
            position = end
        return context

    def _run_sync_stretch(
        self, stretch: list[_PlannedStep], context: dict[str, Any], records: list[StepRecord],
        abandoned: threading.Event,
    ) -> dict[str, Any]:
        for planned in stretch:
            if abandoned.is_set():  # the caller has timed out or gone: do no more work
                break
            context = self._run_step_sync(planned, context, records)
        return context

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_threads, thread_name_prefix="chainweaver")
        return self._pool

    # -------------------------------------------------------- step machinery

    def _plan(self, flow: Flow) -> list[_PlannedStep]:
        key = (flow.name, flow.version)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        plan = []
        for index, step in enumerate(flow.steps):
            tool = self._tools.get(step.tool_name)
            if tool is None:
                raise StepFailed(ErrorInfo(
                    "ToolNotFoundError",
                    f"step {index}: tool {step.tool_name!r} is not registered",
                    step_index=index, tool_name=step.tool_name,
                ))
            mapping = step.input_mapping
            sources = tuple(
                (name, mapping.get(name, name), name in mapping) for name in tool.input_fields
            )
            plan.append(_PlannedStep(index, tool, sources))
        self._plans[key] = plan
        return plan

    def _start(
        self, flow: Flow, input: Mapping[str, Any] | BaseModel
    ) -> tuple[list[_PlannedStep], dict[str, Any]]:
        plan = self._plan(flow)
        model = self.input_model(flow)
        assert model is not None  # _plan guarantees the first tool exists
        try:
            # Exact class only: a subclass instance would carry undeclared fields into
            # the context, so it is dumped and validated like any other model.
            if type(input) is model:
                validated = input
            elif isinstance(input, BaseModel):
                validated = model.model_validate(input.model_dump())
            else:
                validated = model.model_validate(input)
            context = validated.model_dump()
        except ValidationError as error:
            raise StepFailed(ErrorInfo(
                "InputValidationError",
                f"flow {flow.name!r} input is invalid: {_describe(error)}",
                field=_first_error_field(error),
            )) from None
        except Exception as error:  # a validator or serializer bug, not the caller's
            raise _raised(f"flow {flow.name!r} input validation", error) from None
        return plan, context

    def _step_input(
        self, planned: _PlannedStep, context: dict[str, Any], record: StepRecord
    ) -> BaseModel:
        tool = planned.tool
        arguments = {}
        for tool_field, key, mapped in planned.sources:
            if key in context:
                arguments[tool_field] = context[key]
            elif mapped:
                raise StepFailed(ErrorInfo(
                    "MissingContextKeyError",
                    f"step {planned.index} ({tool.name!r}): field {tool_field!r} is mapped "
                    f"to context key {key!r}, which does not exist",
                    step_index=planned.index, tool_name=tool.name, field=tool_field,
                ))
        record.inputs = arguments
        try:
            return tool.input_schema.model_validate(arguments)
        except ValidationError as error:
            raise StepFailed(ErrorInfo(
                "StepInputError",
                f"step {planned.index} ({tool.name!r}) input is invalid: {_describe(error)}",
                step_index=planned.index, tool_name=tool.name,
                field=_first_error_field(error),
            )) from None
        except Exception as error:
            raise _raised(f"step {planned.index} ({tool.name!r}) input validation", error,
                          step_index=planned.index, tool_name=tool.name) from None

    def _step_output(self, planned: _PlannedStep, raw: Any) -> dict[str, Any]:
        tool = planned.tool
        schema = tool.output_schema
        try:
            if schema is not None:
                if type(raw) is schema:
                    return raw.model_dump()
                if isinstance(raw, BaseModel):
                    # Another model (or a subclass with extra fields): validate its data.
                    raw = raw.model_dump()
                return schema.model_validate(raw).model_dump()
            if isinstance(raw, BaseModel):
                return raw.model_dump()
        except ValidationError as error:
            raise StepFailed(ErrorInfo(
                "StepOutputError",
                f"step {planned.index} ({tool.name!r}) output is invalid: {_describe(error)}",
                step_index=planned.index, tool_name=tool.name,
                field=_first_error_field(error),
            )) from None
        except Exception as error:  # e.g. a serializer that raises, an unconvertible value
            raise _raised(f"step {planned.index} ({tool.name!r}) output validation", error,
                          step_index=planned.index, tool_name=tool.name) from None
        if isinstance(raw, Mapping):
            return dict(raw)
        raise StepFailed(ErrorInfo(
            "StepOutputError",
            f"step {planned.index} ({tool.name!r}) returned "
            f"{type(raw).__name__}; a tool must return a dict or a pydantic model",
            step_index=planned.index, tool_name=tool.name,
        ))

    def _tool_raised(self, planned: _PlannedStep, error: Exception) -> StepFailed:
        return _raised(f"step {planned.index} ({planned.tool.name!r})", error,
                       step_index=planned.index, tool_name=planned.tool.name)

    def _run_step_sync(
        self, planned: _PlannedStep, context: dict[str, Any], records: list[StepRecord]
    ) -> dict[str, Any]:
        record = StepRecord(planned.index, planned.tool.name)
        records.append(record)
        started = time.perf_counter()
        try:
            model = self._step_input(planned, context, record)
            try:
                if planned.tool.is_async:
                    raw = _run_coroutine_blocking(planned.tool.fn(model))
                else:
                    raw = planned.tool.fn(model)
            except Exception as error:  # a tool's failure is data, not a crash
                raise self._tool_raised(planned, error) from None
            record.outputs = self._step_output(planned, raw)
        except StepFailed as failure:
            record.error = failure.info
            raise
        finally:
            record.duration_ms = (time.perf_counter() - started) * 1000
        context.update(record.outputs)
        return context

    async def _run_step_async(
        self, planned: _PlannedStep, context: dict[str, Any], records: list[StepRecord]
    ) -> dict[str, Any]:
        record = StepRecord(planned.index, planned.tool.name)
        records.append(record)
        started = time.perf_counter()
        try:
            model = self._step_input(planned, context, record)
            try:
                raw = await planned.tool.fn(model)
            except Exception as error:
                raise self._tool_raised(planned, error) from None
            record.outputs = self._step_output(planned, raw)
        except StepFailed as failure:
            record.error = failure.info
            raise
        finally:
            record.duration_ms = (time.perf_counter() - started) * 1000
        context.update(record.outputs)
        return context

    def _finish(
        self, flow: Flow, context: dict[str, Any], records: list[StepRecord], started: float
    ) -> ExecutionResult:
        if flow.output_schema is not None:
            fields = flow.output_schema.model_fields
            try:
                final = flow.output_schema.model_validate(
                    {k: v for k, v in context.items() if k in fields}
                ).model_dump()
            except ValidationError as error:
                info = ErrorInfo(
                    "OutputValidationError",
                    f"flow {flow.name!r} output is invalid: {_describe(error)}",
                    field=_first_error_field(error),
                )
                return self._failed(flow, info, records, started)
            except Exception as error:
                info = _raised(f"flow {flow.name!r} output validation", error).info
                return self._failed(flow, info, records, started)
        else:
            final = (records[-1].outputs or {}) if records else {}
        return ExecutionResult(
            flow.name, flow.version, True, final, None, records,
            (time.perf_counter() - started) * 1000,
        )

    @staticmethod
    def _failed(
        flow: Flow, info: ErrorInfo, records: list[StepRecord], started: float
    ) -> ExecutionResult:
        return ExecutionResult(
            flow.name, flow.version, False, None, info, records,
            (time.perf_counter() - started) * 1000,
        )


def _raised(what: str, error: Exception, **where: Any) -> StepFailed:
    """A failure raised by code the executor calls (a tool, a validator, a serializer).

    The message may carry the exception's text; servers decide how much of it to show.
    """
    logger.debug("%s raised", what, exc_info=error)
    try:
        text = str(error)
    except Exception:  # an exception whose __str__ itself fails
        text = "(message unavailable)"
    name = type(error).__name__
    return StepFailed(ErrorInfo(name, f"{what} raised {name}: {text}", **where))


def _run_coroutine_blocking(coroutine: Any) -> Any:
    """Run an async tool from sync code, also when an event loop is already running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
