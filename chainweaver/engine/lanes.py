"""The two lanes that drive a plan's steps through the step runner (:mod:`.runner`).

The sync lane runs the steps one at a time in plan order and answers each step's requests
by calling directly. The async lane starts every ready step at once (up to
``max_concurrent``), awaiting async tools and sub-flows and running sync tools in worker
threads. Both report to the run's observer, and give the same result whatever the timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator, Mapping
from typing import Any

from pydantic import BaseModel

from ..checkpoints import CheckpointStore
from ..plan import Plan
from ..results import ErrorInfo, ExecutionResult
from ..run_events import (
    Cancellation,
    RunCancelled,
    RunObserver,
    ask_approval,
    notify,
)
from ..step_guard import StepGuard
from . import outcome
from .approved import (
    NO_APPROVAL,
    PARENT_DECIDED,
    Approve,
    approval_gate,
    ask_blocking,
    caller_now,
    caller_now_async,
    denied,
    under_grants,
)
from .calling import Stop, WorkerThreads, call_blocking, run_coroutine_blocking, with_timeout
from .durable import Durable
from .runner import (
    CALL,
    CHECK,
    FLOW,
    SLEEP,
    LaneRequest,
    RunState,
    run_plain_chain,
    run_plain_step,
    run_step,
)
from .step_failures import StepFailed


class Lanes:
    """Runs plans in either lane; holds the worker-thread pool (made on first use) and
    the bound on tool steps running at once in one async call."""

    def __init__(self, max_threads: int, max_concurrent: int) -> None:
        self.max_threads = max_threads
        self.max_concurrent = max_concurrent
        self.threads = WorkerThreads(max_threads)  # for sync tools in the async lane

    # ------------------------------------------------------------- sync lane

    def run_sync(self, plan: Plan, input: Mapping[str, Any] | BaseModel,
                 stop: Stop | None = None, *, observer: RunObserver | None = None,
                 cancel: Cancellation | None = None, approve: Approve = None,
                 run_id: str | None = None, guard: StepGuard | None = None
                 ) -> ExecutionResult:
        """Run ``plan`` one step at a time in plan order; ``stop`` is set when the async
        run that started this one (a sub-flow in a worker thread) is over: then nothing
        further runs. ``approve`` as for :func:`approval_gate`; ``guard`` is asked
        before every attempt (:mod:`chainweaver.grants`)."""
        started = time.perf_counter()
        # A plan known to need no approval skips the gate (the first run works it out).
        gate = None if plan.approval == NO_APPROVAL else approval_gate(plan, approve)
        if isinstance(gate, ErrorInfo):
            return _reported(outcome.failed(plan.flow, gate, [], started), observer)
        try:
            state = outcome.start(plan, input, started)
        except StepFailed as failure:
            return _reported(outcome.failed(plan.flow, failure.info, [], started), observer)
        state.run_id = run_id
        if gate is not None:
            caller = caller_now(guard) if guard is not None else None
            request, approved = under_grants(plan, gate, guard, caller, None)
            refused = denied(plan, request, ask_blocking(gate[1], request))
            if refused is not None:
                return _reported(outcome.failed(plan.flow, refused, [], started), observer)
            if guard is not None:
                guard.keep_approval(approved)
        if guard is not None:
            refused = _entry_refused(plan, guard, guard.decide)
            if refused is not None:
                return _reported(outcome.failed(plan.flow, refused, [], started), observer)
            state.guard = guard
        if observer is not None:
            _observe(state, observer)
        elif plan.plain and cancel is None and stop is None and guard is None:
            run_plain_chain(state)  # nothing watches, stops or checks it: one tight loop
            return outcome.finish(state, started)
        # Plain steps skip the generator when nothing can stop them between steps and
        # no guard asks before them (decided once: the loop stays as tight as it was).
        direct = stop is None and guard is None
        for planned in plan.steps:
            if stop is not None and stop.is_set():
                break  # the caller is gone: the result is discarded
            if cancel is not None and cancel.cancelled:
                return _reported(outcome.cancelled(state, started), observer)
            if planned.plain and direct:
                run_plain_step(state, planned)
            else:
                self._drive_sync(run_step(state, planned), stop)
            if state.failure is not None:
                break
        return _reported(outcome.finish(state, started), observer)

    # ------------------------------------------------------------ async lane

    async def run_async(self, plan: Plan, input: Mapping[str, Any] | BaseModel,
                        timeout: float | None = None, *, parent: Stop | None = None,
                        slots: asyncio.Semaphore | None = None,
                        observer: RunObserver | None = None,
                        cancel: Cancellation | None = None,
                        approve: Approve = None, run_id: str | None = None,
                        checkpoints: CheckpointStore | None = None,
                        guard: StepGuard | None = None) -> ExecutionResult:
        """Run ``plan``, ready steps at once; ``parent`` is set when the run that started
        this one is over. ``slots`` bounds the tool steps running at once in the whole
        call: a new call makes them (``max_concurrent``); sub-flows share their caller's
        (a sub-flow step itself takes no slot, so none waits for itself). ``approve`` as
        for :func:`approval_gate`. ``run_id`` names the run (its idempotency keys);
        with ``checkpoints`` the run is durable (:mod:`.durable`);
        ``guard`` is asked before every attempt (:mod:`chainweaver.grants`)."""
        if slots is None:
            slots = asyncio.Semaphore(self.max_concurrent)
        started = time.perf_counter()
        # A plan known to need no approval skips the gate (the first run works it out).
        gate = None if plan.approval == NO_APPROVAL else approval_gate(plan, approve)
        if isinstance(gate, ErrorInfo):
            return _reported(outcome.failed(plan.flow, gate, [], started), observer)
        try:
            state = outcome.start(plan, input, started)
        except StepFailed as failure:
            return _reported(outcome.failed(plan.flow, failure.info, [], started), observer)
        state.run_id = run_id
        if checkpoints is not None and run_id is not None:
            # Before any ask: a run that cannot resume says so at once.
            state.durable = await Durable.open(checkpoints, run_id, state)
        if guard is not None and not guard.prefix:  # a called flow (a sub-flow: its parent's)
            guard.on_loop(asyncio.get_running_loop())
        if gate is not None:
            caller = await caller_now_async(guard) if guard is not None else None
            request, approved = under_grants(plan, gate, guard, caller,
                                             asyncio.get_running_loop())
            refused = denied(plan, request, await ask_approval(gate[1], request))
            if refused is not None:
                return _reported(outcome.failed(plan.flow, refused, [], started), observer)
            if guard is not None:
                guard.keep_approval(approved)
        if guard is not None:
            refused = await _entry_refused_async(plan, guard)
            if refused is not None:
                return _reported(outcome.failed(plan.flow, refused, [], started), observer)
            state.guard = guard
        if observer is not None:
            _observe(state, observer)
        state.schedule()
        if state.durable is not None:
            state.durable.restore(state)
            if state.failure is not None:  # interrupted where it must not run again
                return _reported(outcome.finish(state, started), observer)
        # Set when this call is over (or its caller's is): steps running in worker
        # threads then make no further call, retry, sleep or fallback.
        abandoned = Stop(parent)
        work = self._schedule(state, abandoned, slots)
        try:
            if timeout is not None:
                work = asyncio.wait_for(work, timeout)
            if cancel is None:
                await work
            else:
                await cancel.guard(work)
        except TimeoutError:
            _abandon(state, abandoned)
            return _reported(outcome.timed_out(state, timeout, started), observer)
        except RunCancelled:
            _abandon(state, abandoned)
            return _reported(outcome.cancelled(state, started), observer)
        except asyncio.CancelledError:
            # The task awaiting the run was cancelled: no result, but the observer
            # still learns which steps were cancelled.
            _abandon(state, abandoned)
            if observer is not None:
                outcome.cancelled(state, started)
            raise
        finally:
            abandoned.set()
        if state.durable is not None:
            await state.durable.flush()  # checkpoints written behind the steps
        return _reported(outcome.finish(state, started), observer)

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
        # A step whose check may wait for this loop (an async hook, chainweaver.step_guard;
        # a step asked about again, chainweaver.engine.approved) never runs on it.
        guard = state.guard
        on_loop = guard is None or (guard.approved is None and not guard.awaits)
        try:
            while True:
                while state.ready and len(running) < self.max_concurrent:
                    position = state.ready.pop()
                    if position > state.failed_at:
                        state.ready.clear()  # pop() takes the earliest: all are later
                        break
                    alone = not running and not state.ready \
                        and state.durable is None  # checkpoints are awaited per step
                    if alone and steps[position].runs_in_thread:
                        # One worker-thread hop runs it and the chain of sync steps after
                        # it (nothing else runs, so the state is the thread's).
                        async with slots:
                            await self.threads.run(self._run_chain, state, position,
                                                   abandoned, True)
                        continue
                    if alone and steps[position].inline and on_loop:
                        # Non-blocking sync tools: run right here, on the event loop.
                        self._run_chain(state, position, abandoned, False)
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
        durable = state.durable
        if durable is not None:
            await durable.started(planned)
        if planned.subflow is not None:
            await self._drive_async(run_step(state, planned), abandoned, slots)
        else:
            async with slots:
                runner = run_step(state, planned)
                if planned.runs_in_thread:
                    await self.threads.run(self._drive_sync, runner, abandoned)
                else:
                    await self._drive_async(runner, abandoned, slots)
        if durable is not None:  # before any step that depends on it starts
            await durable.finished(state, planned)
        state.finish(position)

    def _run_chain(self, state: RunState, position: int, abandoned: Stop,
                   in_thread: bool) -> None:
        """Run the step at ``position`` and each single ready step after it that runs in
        the same place (a worker thread: ``in_thread``; else the event loop)."""
        plan = state.plan
        # A guard asks before every attempt: only the step-by-step path has its place.
        direct = state.guard is None
        if position == 0 and plan.plain and state.observer is None and direct:
            run_plain_chain(state, abandoned)  # the whole plan: nothing left to schedule
            return
        steps = plan.steps
        while True:
            planned = steps[position]
            if planned.plain and direct:
                run_plain_step(state, planned, abandoned)
            else:
                self._drive_sync(run_step(state, planned), abandoned)
            state.finish(position)
            if abandoned.is_set() or len(state.ready) != 1 \
                    or state.ready[0] > state.failed_at:
                return
            following = steps[state.ready[0]]
            if not (following.runs_in_thread if in_thread else following.inline):
                return
            position = state.ready.pop()

    # ------------------------------------------------------- answering steps

    def _drive_sync(self, runner: Generator[LaneRequest, Any, None], stop: Stop | None) -> None:
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
                    _, tool, arguments, timeout = request
                    if timeout is None and not tool.is_async:
                        reply = tool.fn(arguments)  # the common case, called directly
                    else:
                        reply = call_blocking(tool, arguments, timeout)
                elif request[0] is SLEEP:
                    _, seconds = request
                    if stop is None:
                        time.sleep(seconds)
                    else:
                        stop.wait(seconds)
                elif request[0] is CHECK:
                    _, guard, asked = request
                    reply = guard.decide(asked)
                elif request[0] is FLOW:  # a sub-flow runs in this lane too
                    _, plan, input, timeout, run_id, inner_guard = request
                    reply = self._subflow_blocking(plan, input, timeout, stop, run_id,
                                                   inner_guard)
            except (Exception, asyncio.CancelledError) as caught:
                # Nothing cancels this thread: a CancelledError is the tool's own failure.
                error = caught

    async def _drive_async(self, runner: Generator[LaneRequest, Any, None], stop: Stop,
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
                    _, tool, arguments, timeout = request
                    if tool.is_async:
                        reply = await with_timeout(tool.fn(arguments), timeout)
                    elif not tool.blocking and timeout is None:
                        reply = tool.fn(arguments)  # declared non-blocking: on the loop
                    else:
                        reply = await self.threads.run(call_blocking, tool, arguments,
                                                       timeout)
                elif request[0] is SLEEP:
                    _, seconds = request
                    await asyncio.sleep(seconds)
                elif request[0] is CHECK:
                    _, guard, asked = request
                    reply = await guard.decide_async(asked)
                elif request[0] is FLOW:
                    _, plan, input, timeout, run_id, inner_guard = request
                    reply = await self.run_async(plan, input, timeout, parent=stop,
                                                 slots=slots, approve=PARENT_DECIDED,
                                                 run_id=run_id, guard=inner_guard)
            except asyncio.CancelledError as caught:
                current = asyncio.current_task()
                if current is None or current.cancelling():
                    raise  # this run is being cancelled (a timeout, a failure, the caller)
                error = caught  # the tool's own CancelledError: a failure like any other
            except Exception as caught:
                error = caught

    def _subflow_blocking(self, plan: Plan, input: dict[str, Any], timeout: float | None,
                          stop: Stop | None, run_id: str, guard: StepGuard | None
                          ) -> ExecutionResult:
        if timeout is None:
            return self.run_sync(plan, input, stop, approve=PARENT_DECIDED, run_id=run_id,
                                 guard=guard)
        # A run of its own on a private loop: its own bound.
        return run_coroutine_blocking(self.run_async(plan, input, timeout, parent=stop,
                                                     approve=PARENT_DECIDED, run_id=run_id,
                                                     guard=guard))


def _entry_request(plan: Plan, guard: StepGuard) -> Any:
    """The check of the called flow itself (its own ``requires``), before any step;
    None for a sub-flow's run (its step asked) or a flow that declares nothing."""
    flow = plan.flow
    if guard.prefix or flow.requires is None:
        return None
    return guard.request("", "flow", flow.name, None, flow.safety, {}, flow.requires)


def _entry_refused(plan: Plan, guard: StepGuard, decide: Any) -> ErrorInfo | None:
    request = _entry_request(plan, guard)
    refused = decide(request) if request is not None else None
    return None if refused is None else _flow_refused(plan, refused)


async def _entry_refused_async(plan: Plan, guard: StepGuard) -> ErrorInfo | None:
    request = _entry_request(plan, guard)
    refused = await guard.decide_async(request) if request is not None else None
    return None if refused is None else _flow_refused(plan, refused)


def _flow_refused(plan: Plan, reason: str) -> ErrorInfo:
    return ErrorInfo("StepRefused", f"flow {plan.flow.name!r} {plan.flow.version} was "
                     f"refused for this caller ({reason}); no step ran", detail=reason)


def _abandon(state: RunState, abandoned: Stop) -> None:
    """The run ends before its work did (timed out, cancelled): steps still in worker
    threads make no further request, and checkpoint writes still under way stop."""
    abandoned.set()
    if state.durable is not None:
        state.durable.abandon()


def _observe(state: RunState, observer: RunObserver) -> None:
    state.observer = observer
    plan = state.plan
    notify(observer.run_started, plan.flow.name, plan.flow.version, len(plan.steps))


def _reported(result: ExecutionResult, observer: RunObserver | None) -> ExecutionResult:
    if observer is not None:
        notify(observer.run_finished, result)
    return result
