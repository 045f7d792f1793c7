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
import time
from collections.abc import Generator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel

from . import outcome
from .calling import Stop, call_blocking, run_coroutine_blocking, with_timeout
from .errors import DuplicateToolError, FlowValidationError, ToolNotFoundError
from .flows import Flow
from .plan import MAX_SUBFLOW_DEPTH, Plan, Problem, Resolver, compile_plan
from .registry import FlowRegistry
from .runner import (
    CALL,
    SLEEP,
    STEP_LISTENER,
    ErrorInfo,
    ExecutionResult,
    RunState,
    StepFailed,
    StepRecord,
    run_plain_step,
    run_step,
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
        """The version a sub-flow step runs: the latest active one (None: there is none)."""
        return self.registry.latest_active(name)

    def _followed_subflow(self, name: str, parent: Flow, seen: tuple[str, ...]
                          ) -> Flow | None:
        """The sub-flow a step of ``parent`` runs, unless it is missing, recurses or nests
        deeper than ``MAX_SUBFLOW_DEPTH`` (None: then nothing about it can be known)."""
        sub = self._subflow(name)
        if sub is None or sub.name in seen or sub.name == parent.name \
                or len(seen) >= MAX_SUBFLOW_DEPTH:
            return None
        return sub

    def input_model(self, flow: Flow, _seen: tuple[str, ...] = ()) -> type[BaseModel] | None:
        """The flow's input model: its own, else its first step's (None when unknown)."""
        if flow.input_schema is not None:
            return flow.input_schema
        return self._step_model(flow, flow.order[0], "input", _seen)

    def output_model(self, flow: Flow, _seen: tuple[str, ...] = ()) -> type[BaseModel] | None:
        """The flow's output model: its own, else its single last step's (None when unknown)."""
        if flow.output_schema is not None:
            return flow.output_schema
        # A flow without output_schema has exactly one last step.
        return self._step_model(flow, flow.sink, "output", _seen)  # type: ignore[arg-type]

    def _step_model(self, flow: Flow, index: int, side: str, seen: tuple[str, ...]
                    ) -> type[BaseModel] | None:
        step = flow.steps[index]
        if step.flow is not None:
            sub = self._followed_subflow(step.flow, flow, seen)
            if sub is None:
                return None
            inner = (*seen, flow.name)
            return self.input_model(sub, inner) if side == "input" \
                else self.output_model(sub, inner)
        tool = self._tools.get(step.tool_name)  # type: ignore[arg-type]
        if tool is None:
            return None
        return tool.input_schema if side == "input" else tool.output_schema

    def effective_safety(self, flow: Flow, _seen: tuple[str, ...] = (), *,
                         declared: bool = True) -> ToolSafetyContract | None:
        """The flow's own contract, else the merge over every step, fallback and sub-flow.

        None (unknown) when any of them is missing, declares no contract, recurses or
        nests too deeply. ``declared=False`` ignores every flow's own contract (at any
        depth): what the tools really do, which decides whether a sub-flow step may be
        retried.
        """
        return self._safety(flow, _seen, declared, {})

    def _safety(self, flow: Flow, seen: tuple[str, ...], declared: bool,
                memo: dict[str, ToolSafetyContract | None]) -> ToolSafetyContract | None:
        if declared and flow.safety is not None:
            return flow.safety
        contracts = []
        for step in flow.steps:
            if step.flow is not None:
                sub = self._followed_subflow(step.flow, flow, seen)
                if sub is None:
                    return None
                if sub.name not in memo:  # a sub-flow used many times is merged once
                    memo[sub.name] = self._safety(sub, (*seen, flow.name), declared, memo)
                contract = memo[sub.name]
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

    def _tools_safety(self, flow: Flow) -> ToolSafetyContract | None:
        return self.effective_safety(flow, declared=False)

    def _compile(self, flow: Flow) -> tuple[Plan, list[Problem]]:
        """Compile ``flow``; each sub-flow (at any depth) is compiled once per call, or
        taken from the cache when it compiled there without problems."""
        compiled: dict[tuple[str, str], tuple[Plan, list[Problem]]] = {}

        def check(sub: Flow, stack: tuple[str, ...]) -> tuple[Plan, list[Problem]]:
            key = (sub.name, sub.version)
            if key not in compiled:
                cached = self._cached(sub)
                if cached is None or cached[1]:
                    cached = compile_plan(sub, resolver, stack)
                    self.plans_compiled += 1
                    if not cached[1]:
                        self._plans[key] = cached
                compiled[key] = cached
            return compiled[key]

        resolver = Resolver(self._tools, self._subflow, self.input_model, self.output_model,
                            self._tools_safety, check, registered=self.registry.__contains__)
        self.plans_compiled += 1
        return compile_plan(flow, resolver)

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
        is registered or a sub-flow (at any depth) gets a new latest active version, or
        a missing one appears."""
        cached = self._cached(flow)
        if cached is None:
            cached = self._plans[(flow.name, flow.version)] = self._compile(flow)
        return cached

    def _cached(self, flow: Flow) -> tuple[Plan, list[Problem]] | None:
        cached = self._plans.get((flow.name, flow.version))
        if cached is not None and cached[0].flow is flow and (
                not cached[0].subflow_versions or all(
                    getattr(self._subflow(name), "version", None) == version
                    for name, version in cached[0].subflow_versions)):
            return cached
        return None

    # ------------------------------------------------------------- execution

    def execute_flow(
        self, name: str, input: Mapping[str, Any] | BaseModel, version: str | None = None,
        *, plan: Plan | None = None,
    ) -> ExecutionResult:
        """Run a flow synchronously, one step at a time in plan order.

        Async tools run on a private event loop; a step with a ``timeout`` runs its tool
        in a helper thread that is abandoned (left to finish) when time runs out.
        ``plan`` (from :meth:`plan`) runs exactly that plan, with the sub-flows it was
        compiled with, whatever was registered since.
        """
        return self._run_sync(self._plan_to_run(name, version, plan), input)

    def _plan_to_run(self, name: str, version: str | None, plan: Plan | None) -> Plan:
        if plan is None:
            return self._plan(self.registry.get_flow(name, version))[0]
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a Plan from FlowExecutor.plan(), got "
                            f"{type(plan).__name__}")
        if plan.flow.name != name or version not in (None, plan.flow.version):
            raise ValueError(f"plan is of flow {plan.flow.name!r} {plan.flow.version}, not "
                             f"{name!r}{'' if version is None else ' ' + version}")
        return plan

    def _run_sync(self, plan: Plan, input: Mapping[str, Any] | BaseModel,
                  stop: Stop | None = None) -> ExecutionResult:
        started = time.perf_counter()
        try:
            state = outcome.start(plan, input)
        except StepFailed as failure:
            return outcome.failed(plan.flow, failure.info, [], started)
        for planned in plan.steps:
            if stop is not None and stop.is_set():
                break  # the caller is gone: the result is discarded
            if planned.plain and stop is None:  # nothing can stop it between steps
                run_plain_step(state, planned)
            else:
                self._drive_sync(run_step(state, planned), stop)
            if state.failure is not None:
                break
        return outcome.finish(state, started)

    async def execute_flow_async(
        self,
        name: str,
        input: Mapping[str, Any] | BaseModel,
        version: str | None = None,
        *,
        timeout: float | None = None,
        plan: Plan | None = None,
    ) -> ExecutionResult:
        """Run a flow without blocking the event loop, ready steps concurrently.

        ``timeout`` (seconds) bounds the whole run; a run that exceeds it fails with
        ``TimeoutError`` and keeps its finished steps. A failed run has the error and the
        records :meth:`execute_flow` gives (steps after the first failure in plan order
        neither start nor appear). After a timeout or a cancellation no further step,
        retry or fallback starts; a sync tool already running in a worker thread cannot
        be interrupted, so it finishes and its output is discarded. ``plan`` is as for
        :meth:`execute_flow`.
        """
        return await self._run_async(self._plan_to_run(name, version, plan), input, timeout,
                                     None, asyncio.Semaphore(self._max_concurrent))

    async def _run_async(self, plan: Plan, input: Mapping[str, Any] | BaseModel,
                         timeout: float | None, parent: Stop | None,
                         slots: asyncio.Semaphore) -> ExecutionResult:
        """Run ``plan``; ``slots`` bounds the tool steps running at once in the whole call
        (sub-flows share it; a sub-flow step itself takes no slot, so none waits for
        itself)."""
        started = time.perf_counter()
        try:
            state = outcome.start(plan, input)
        except StepFailed as failure:
            return outcome.failed(plan.flow, failure.info, [], started)
        state.schedule()
        if parent is None:
            state.listener = STEP_LISTENER.get()
        # Set when this call is over (or its caller's is): steps running in worker
        # threads then make no further call, retry, sleep or fallback.
        abandoned = Stop(parent)
        try:
            if timeout is None:
                await self._schedule(state, abandoned, slots)
            else:
                await asyncio.wait_for(self._schedule(state, abandoned, slots), timeout)
        except asyncio.TimeoutError:
            abandoned.set()
            return outcome.timed_out(state, timeout, started)
        finally:
            abandoned.set()
        return outcome.finish(state, started)

    async def _schedule(self, state: RunState, abandoned: Stop,
                        slots: asyncio.Semaphore) -> None:
        """Start every ready step (bounded) until none is left that the sync lane would run.

        After a failure, steps earlier in plan order than the first failure still start
        (the sync lane runs them); steps after it do not start, and those already running
        are cancelled and left out of the records, so both lanes give the same result.
        """
        steps = state.plan.steps
        running: dict[asyncio.Future, int] = {}
        stopped: list[asyncio.Future] = []  # cancelled: awaited before returning
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
                        async with slots:
                            await loop.run_in_executor(self._thread_pool(), self._run_chain,
                                                       state, position, abandoned)
                        continue
                    running[asyncio.ensure_future(
                        self._run_one(state, position, abandoned, slots))] = position
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
                        stopped.append(task)
        finally:
            for task in running:
                task.cancel()
            if running or stopped:
                await asyncio.gather(*running, *stopped, return_exceptions=True)

    async def _run_one(self, state: RunState, position: int, abandoned: Stop,
                       slots: asyncio.Semaphore) -> None:
        planned = state.plan.steps[position]
        state.step_starting(position)
        if planned.subflow is not None:
            await self._drive_async(run_step(state, planned), abandoned, slots)
        else:
            async with slots:
                runner = run_step(state, planned)
                if planned.runs_in_thread:
                    await asyncio.get_running_loop().run_in_executor(
                        self._thread_pool(), self._drive_sync, runner, abandoned)
                else:
                    await self._drive_async(runner, abandoned, slots)
        state.finish(position)

    def _run_chain(self, state: RunState, position: int, abandoned: Stop) -> None:
        steps = state.plan.steps
        while True:
            state.step_starting(position)
            self._drive_sync(run_step(state, steps[position]), abandoned)
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

    def _drive_sync(self, runner: Generator[tuple, Any, None], stop: Stop | None) -> None:
        """Answer a step's requests by calling directly (the sync lane, or a worker thread).

        Once ``stop`` is set (the async call that started it is over) it makes no further
        call, sleep or sub-flow run: the step is closed where it stands.
        """
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = runner.send(reply) if error is None else runner.throw(error)
            except StopIteration:
                return
            if stop is not None and stop.is_set():
                runner.close()
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
                    if stop is None:
                        time.sleep(request[1])
                    else:
                        stop.wait(request[1])
                else:  # a sub-flow runs in this lane too
                    reply = self._subflow_blocking(request[1], request[2], request[3], stop)
            except (Exception, asyncio.CancelledError) as caught:
                # Nothing cancels this thread: a CancelledError is the tool's own failure.
                error = caught

    async def _drive_async(self, runner: Generator[tuple, Any, None], stop: Stop,
                           slots: asyncio.Semaphore) -> None:
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
                    reply = await self._run_async(request[1], request[2], request[3], stop,
                                                  slots)
            except asyncio.CancelledError as caught:
                # Task.cancelling() is Python 3.11+; on 3.10 every CancelledError ends the run.
                cancelling = getattr(asyncio.current_task(), "cancelling", None)
                if cancelling is None or cancelling():
                    raise  # this run is being cancelled (a timeout, a failure, the caller)
                error = caught  # the tool's own CancelledError: a failure like any other
            except Exception as caught:
                error = caught

    def _subflow_blocking(self, plan: Plan, input: dict[str, Any], timeout: float | None,
                          stop: Stop | None) -> ExecutionResult:
        if timeout is None:
            return self._run_sync(plan, input, stop)
        # A run of its own on a private loop: its own bound.
        return run_coroutine_blocking(self._run_async(
            plan, input, timeout, stop, asyncio.Semaphore(self._max_concurrent)))
