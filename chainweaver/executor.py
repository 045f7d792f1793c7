"""FlowExecutor: compiles flows into plans and runs them, validating every step.

A run never raises for bad data: invalid input, a tool that raises or returns the
wrong shape, or a missing context key ends the run with ``success=False`` and an
error naming the step, the tool and the field; the steps before it stay recorded.
Only programming errors about *which* flow to run (unknown name or version) raise.

Both lanes run the same step runner (:mod:`chainweaver.runner`): ``execute_flow`` runs
the steps one at a time in plan order; ``execute_flow_async`` runs every ready step at
once (up to ``max_concurrent_steps``), awaiting async tools and running sync tools in
worker threads. Results (failures included) never depend on timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import DuplicateToolError, FlowNotFoundError, FlowValidationError, ToolNotFoundError
from .flows import Flow
from .plan import Plan, Problem, Resolver, compile_plan
from .registry import FlowRegistry
from .runner import (
    CALL,
    SLEEP,
    ErrorInfo,
    ExecutionResult,
    RunState,
    StepFailed,
    StepRecord,
    call_blocking,
    describe,
    first_error_field,
    raised,
    run_coroutine_blocking,
    run_step,
    with_timeout,
)
from .safety import ToolSafetyContract, merge_safety_contracts
from .tools import Tool

__all__ = ["ErrorInfo", "ExecutionResult", "FlowExecutor", "StepRecord"]


class FlowExecutor:
    """Runs registered flows with the tools registered on it."""

    def __init__(self, registry: FlowRegistry, *, max_threads: int = 32,
                 max_concurrent_steps: int = 16) -> None:
        if max_concurrent_steps < 1:
            raise ValueError("max_concurrent_steps must be at least 1")
        self.registry = registry
        self._tools: dict[str, Tool] = {}
        # (name, version) -> (plan, problems); compiled once per flow version.
        self._plans: dict[tuple[str, str], tuple[Plan, list[Problem]]] = {}
        self._max_threads = max_threads
        self._max_concurrent = max_concurrent_steps
        self._pool: ThreadPoolExecutor | None = None
        self.plans_compiled = 0  # how many times a plan was compiled (benchmarks read it)

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

    def _subflow(self, name: str) -> Flow | None:
        try:
            return self.registry.get_flow(name)
        except FlowNotFoundError:
            return None

    def input_model(self, flow: Flow, _seen: tuple[str, ...] = ()) -> type[BaseModel] | None:
        """The flow's input model: its own, else its first step's (None when unknown)."""
        if flow.input_schema is not None:
            return flow.input_schema
        step = flow.steps[flow.order[0]]
        if step.flow is not None:
            sub = self._subflow(step.flow)
            if sub is None or sub.name in _seen or sub.name == flow.name:
                return None
            return self.input_model(sub, (*_seen, flow.name))
        tool = self._tools.get(step.tool_name)  # type: ignore[arg-type]
        return tool.input_schema if tool else None

    def output_model(self, flow: Flow, _seen: tuple[str, ...] = ()) -> type[BaseModel] | None:
        """The flow's output model: its own, else its single last step's (None when unknown)."""
        if flow.output_schema is not None:
            return flow.output_schema
        step = flow.steps[flow.sink]  # type: ignore[index]  # a flow without output_schema has one
        if step.flow is not None:
            sub = self._subflow(step.flow)
            if sub is None or sub.name in _seen or sub.name == flow.name:
                return None
            return self.output_model(sub, (*_seen, flow.name))
        tool = self._tools.get(step.tool_name)  # type: ignore[arg-type]
        return tool.output_schema if tool else None

    def effective_safety(self, flow: Flow,
                         _seen: tuple[str, ...] = ()) -> ToolSafetyContract | None:
        """The flow's own contract, else the merge over every step, fallback and sub-flow.

        None (unknown) when any of them is missing, declares no contract, or recurses.
        """
        if flow.safety is not None:
            return flow.safety
        contracts = []
        for step in flow.steps:
            if step.flow is not None:
                sub = self._subflow(step.flow)
                if sub is None or sub.name in _seen or sub.name == flow.name:
                    return None
                contract = self.effective_safety(sub, (*_seen, flow.name))
            else:
                tool = self._tools.get(step.tool_name)  # type: ignore[arg-type]
                contract = tool.safety if tool else None
            if contract is None:
                return None
            contracts.append(contract)
            if step.fallback is not None:
                fallback = self._tools.get(step.fallback)
                if fallback is None or fallback.safety is None:
                    return None
                contracts.append(fallback.safety)
        return merge_safety_contracts(contracts)

    def _resolver(self) -> Resolver:
        return Resolver(self._tools, self._subflow, self.input_model, self.output_model,
                        self.effective_safety, self._compile)

    def _compile(self, flow: Flow, stack: tuple[str, ...] = ()) -> tuple[Plan, list[Problem]]:
        return compile_plan(flow, self._resolver(), stack)

    def flow_problems(self, flow: Flow) -> list[Problem]:
        """Every problem :meth:`check_flow` reports, as data (kind, message, step, field)."""
        return list(self._plan(flow)[1])

    def check_flow(self, flow: Flow) -> list[str]:
        """Why ``flow`` cannot run, or cannot succeed for any input (empty: none found).

        Missing tools and sub-flows, bad mappings, retries on non-idempotent steps,
        steps that may run at once writing the same key, and the data-flow check: a
        required field nothing can provide, a mapping to a key that can never exist, an
        output schema the context cannot fill. Undeclared tool outputs may provide
        anything.
        """
        return [problem.message for problem in self._plan(flow)[1]]

    def validate_flow(self, flow: Flow) -> None:
        """Raise :class:`FlowValidationError` if :meth:`check_flow` finds problems."""
        problems = self.check_flow(flow)
        if problems:
            raise FlowValidationError(flow.name, problems)

    def plan(self, flow: Flow) -> Plan:
        """The compiled plan of ``flow`` (cached per flow version)."""
        return self._plan(flow)[0]

    def _plan(self, flow: Flow) -> tuple[Plan, list[Problem]]:
        """(plan, every problem), compiled once per flow version: again only after a tool
        is registered or a sub-flow (at any depth) gets a new latest version."""
        key = (flow.name, flow.version)
        cached = self._plans.get(key)
        if cached is not None and cached[0].flow is flow and (
                not cached[0].subflow_versions or all(
                    (sub := self._subflow(name)) is not None and sub.version == version
                    for name, version in cached[0].subflow_versions)):
            return cached
        cached = self._compile(flow)
        self.plans_compiled += 1
        self._plans[key] = cached
        return cached

    # ------------------------------------------------------------- execution

    def execute_flow(
        self, name: str, input: Mapping[str, Any] | BaseModel, version: str | None = None
    ) -> ExecutionResult:
        """Run a flow synchronously, one step at a time in plan order.

        Async tools run on a private event loop; a step with a ``timeout`` runs its tool
        in a helper thread that is abandoned (left to finish) when time runs out.
        """
        return self._run_sync(self.registry.get_flow(name, version), input)

    def _run_sync(self, flow: Flow, input: Mapping[str, Any] | BaseModel) -> ExecutionResult:
        started = time.perf_counter()
        try:
            state = self._start(flow, input)
        except StepFailed as failure:
            return _failed(flow, failure.info, [], started)
        for planned in state.plan.steps:
            self._drive_sync(run_step(state, planned))
            if state.failure is not None:
                break
        return self._finish(state, started)

    async def execute_flow_async(
        self,
        name: str,
        input: Mapping[str, Any] | BaseModel,
        version: str | None = None,
        *,
        timeout: float | None = None,
    ) -> ExecutionResult:
        """Run a flow without blocking the event loop, ready steps concurrently.

        ``timeout`` (seconds) bounds the whole run; a run that exceeds it fails with
        ``TimeoutError`` and keeps its finished steps. A failed run has the error and the
        records :meth:`execute_flow` gives (steps after the first failure in plan order
        neither start nor appear). After a timeout or a cancellation no further step
        starts; a sync tool already running in a worker thread cannot be interrupted, so
        it finishes and its output is discarded.
        """
        return await self._run_async(self.registry.get_flow(name, version), input, timeout)

    async def _run_async(self, flow: Flow, input: Mapping[str, Any] | BaseModel,
                         timeout: float | None) -> ExecutionResult:
        started = time.perf_counter()
        try:
            state = self._start(flow, input)
        except StepFailed as failure:
            return _failed(flow, failure.info, [], started)
        state.schedule()
        # Set when this call is over: a worker thread running a chain of sync steps then
        # starts no further step.
        abandoned = threading.Event()
        try:
            if timeout is None:
                await self._schedule(state, abandoned)
            else:
                await asyncio.wait_for(self._schedule(state, abandoned), timeout)
        except asyncio.TimeoutError:
            abandoned.set()
            return self._timed_out(state, timeout, started)
        finally:
            abandoned.set()
        return self._finish(state, started)

    async def _schedule(self, state: RunState, abandoned: threading.Event) -> None:
        """Start every ready step (bounded) until none is left that the sync lane would run.

        After a failure, steps earlier in plan order than the first failure still start
        (the sync lane runs them); steps after it do not start, and those already running
        are cancelled and left out of the records, so both lanes give the same result.
        """
        steps = state.plan.steps
        running: dict[asyncio.Future, int] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                while state.ready and len(running) < self._max_concurrent:
                    position = state.ready.pop()
                    if position > state.failed_at:
                        state.ready.clear()  # pop() takes the earliest: all are later
                        break
                    if steps[position].runs_in_thread and not running and not state.ready:
                        # Alone: one worker-thread hop runs it and the chain of sync steps
                        # after it (nothing else runs, so the state is the thread's).
                        await loop.run_in_executor(self._thread_pool(), self._run_chain,
                                                   state, position, abandoned)
                        continue
                    running[asyncio.ensure_future(self._run_one(state, position))] = position
                if not running:
                    return
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                    task.result()  # the runner turns failures into data; this re-raises bugs
                for task, position in list(running.items()):
                    if position > state.failed_at:  # its record is dropped: stop it
                        task.cancel()
                        del running[task]
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _run_one(self, state: RunState, position: int) -> None:
        planned = state.plan.steps[position]
        runner = run_step(state, planned)
        if planned.runs_in_thread:
            await asyncio.get_running_loop().run_in_executor(
                self._thread_pool(), self._drive_sync, runner)
        else:
            await self._drive_async(runner)
        state.finish(position)

    def _run_chain(self, state: RunState, position: int, abandoned: threading.Event) -> None:
        steps = state.plan.steps
        while True:
            self._drive_sync(run_step(state, steps[position]))
            state.finish(position)
            if abandoned.is_set() or len(state.ready) != 1 \
                    or not steps[state.ready[0]].runs_in_thread \
                    or state.ready[0] > state.failed_at:
                return
            position = state.ready.pop()

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_threads, thread_name_prefix="chainweaver")
        return self._pool

    # ------------------------------------------------------------------ lanes

    def _drive_sync(self, runner: Generator[tuple, Any, None]) -> None:
        """Answer a step's requests by calling directly (the sync lane, or a worker thread)."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = runner.send(reply) if error is None else runner.throw(error)
            except StopIteration:
                return
            reply = error = None
            try:
                if request[0] is CALL:
                    tool = request[1]
                    if request[3] is None and not tool.is_async:
                        reply = tool.fn(request[2])  # the common case, called directly
                    else:
                        reply = call_blocking(tool, request[2], request[3])
                elif request[0] is SLEEP:
                    time.sleep(request[1])
                else:  # a sub-flow runs in this lane too
                    reply = self._subflow_blocking(request[1], request[2], request[3])
            except Exception as caught:
                error = caught

    async def _drive_async(self, runner: Generator[tuple, Any, None]) -> None:
        """Answer a step's requests by awaiting (async tools, sub-flows, sleeps)."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = runner.send(reply) if error is None else runner.throw(error)
            except StopIteration:
                return
            reply = error = None
            try:
                if request[0] is CALL:
                    tool, model, timeout = request[1], request[2], request[3]
                    if tool.is_async:
                        reply = await with_timeout(tool.fn(model), timeout)
                    else:
                        reply = await asyncio.get_running_loop().run_in_executor(
                            self._thread_pool(), call_blocking, tool, model, timeout)
                elif request[0] is SLEEP:
                    await asyncio.sleep(request[1])
                else:
                    reply = await self._run_async(request[1], request[2], request[3])
            except Exception as caught:
                error = caught

    def _subflow_blocking(self, flow: Flow, input: dict[str, Any],
                          timeout: float | None) -> ExecutionResult:
        if timeout is None:
            return self._run_sync(flow, input)
        return run_coroutine_blocking(self._run_async(flow, input, timeout))

    # ----------------------------------------------------------- start, finish

    def _start(self, flow: Flow, input: Mapping[str, Any] | BaseModel) -> RunState:
        plan, problems = self._plan(flow)
        fatal = [problem for problem in problems if problem.fatal] if problems else None
        if fatal:
            problem = fatal[0]
            index = (flow.step_ids.index(problem.step_id)
                     if problem.step_id in flow.step_ids else None)
            step = flow.steps[index] if index is not None else None
            raise StepFailed(ErrorInfo(
                problem.kind, problem.message, step_index=index,
                tool_name=step.name if step else None, field=problem.field,
                step_id=problem.step_id))
        model = plan.input_model
        assert model is not None  # a plan without fatal problems has its first step's model
        try:
            # Exact class only: a subclass instance would carry undeclared fields into
            # the context, so it is dumped and validated like any other model.
            if type(input) is model:
                validated = input
            elif isinstance(input, BaseModel):
                validated = model.model_validate(input.model_dump())
            else:
                validated = model.__pydantic_validator__.validate_python(input)
            context = model.__pydantic_serializer__.to_python(validated)
        except ValidationError as error:
            detail = describe(error)
            raise StepFailed(ErrorInfo(
                "InputValidationError", f"flow {flow.name!r} input is invalid: {detail}",
                field=first_error_field(error), detail=detail,
            )) from None
        except Exception as error:  # a validator or serializer bug, not the caller's
            raise raised(f"flow {flow.name!r} input validation", error) from None
        return RunState(plan, context)

    def _finish(self, state: RunState, started: float) -> ExecutionResult:
        plan = state.plan
        flow = plan.flow
        if state.failure is not None:
            # What the sync lane records: the steps up to the first failure in plan order
            # (the async lane may have started later ones; they are left out).
            records = [record for record in state.records[:state.failed_at + 1]
                       if record is not None]
            return _failed(flow, state.failure, [replace(r) for r in records], started)
        # Steps that never started have no record.
        records = [record for record in state.records if record is not None]
        if flow.output_schema is not None:
            fields = flow.output_schema.model_fields
            context = state.context()
            try:
                final = flow.output_schema.model_validate(
                    {k: v for k, v in context.items() if k in fields}
                ).model_dump()
            except ValidationError as error:
                info = ErrorInfo("OutputValidationError",
                                 f"flow {flow.name!r} output is invalid: {describe(error)}",
                                 field=first_error_field(error))
                return _failed(flow, info, records, started)
            except Exception as error:
                info = raised(f"flow {flow.name!r} output validation", error).info
                return _failed(flow, info, records, started)
        else:
            sink = plan.steps[plan.sink]  # type: ignore[index]
            record = state.records[sink.position]
            if record is None or record.status != "completed":
                info = ErrorInfo("OutputValidationError",
                                 f"flow {flow.name!r} has no output: its last step "
                                 f"{sink.id!r} was skipped", step_index=sink.index,
                                 tool_name=sink.step.name, step_id=sink.id)
                return _failed(flow, info, records, started)
            final = record.outputs or {}
        return ExecutionResult(flow.name, flow.version, True, final, None, records,
                               (time.perf_counter() - started) * 1000)

    def _timed_out(self, state: RunState, timeout: float | None,
                   started: float) -> ExecutionResult:
        flow = state.plan.flow
        records = [record for record in state.records if record is not None]
        running = [record for record in records if record.status == "running"]
        blamed = running[0] if running else (records[-1] if records else None)
        info = ErrorInfo(
            "TimeoutError", f"flow {flow.name!r} did not finish within {timeout} s",
            step_index=blamed.index if blamed else None,
            tool_name=blamed.tool_name if blamed else None,
            step_id=blamed.step_id if blamed else None)
        return _failed(flow, info, _settled(records, info), started)


def _settled(records: list[StepRecord], info: ErrorInfo) -> list[StepRecord]:
    """Copies (a stuck worker thread may still write to the originals); a step still
    running when the run timed out is marked failed with the run's error."""
    settled = []
    for record in records:
        copy = replace(record)
        if copy.status == "running":
            copy.status = "failed"
            copy.error = info
        settled.append(copy)
    return settled


def _failed(flow: Flow, info: ErrorInfo, records: list[StepRecord],
            started: float) -> ExecutionResult:
    return ExecutionResult(flow.name, flow.version, False, None, info, records,
                           (time.perf_counter() - started) * 1000)
