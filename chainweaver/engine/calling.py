"""How the lanes call things: tools with a per-attempt timeout, coroutines from sync code,
and the stop signal of an async run that is over."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from queue import SimpleQueue
from time import perf_counter
from typing import Any

from pydantic import BaseModel

from ..tools import Tool
from .step_failures import StepTimeout

_MAKING_EVENTS = threading.Lock()


class Stop:
    """Set when an async run is over (finished, timed out, cancelled), or its caller's
    run is: steps still running in worker threads then make no further request."""

    __slots__ = ("_set", "_parent", "_event")

    def __init__(self, parent: Stop | None = None) -> None:
        self._set = False
        self._parent = parent
        # Made only when a step sleeps on it (a retry's backoff in a worker thread): most
        # runs never wait, and an Event (with its Condition) costs every run otherwise.
        self._event: threading.Event | None = None

    def set(self) -> None:
        self._set = True
        event = self._event  # read after the flag: see wait()
        if event is not None:
            event.set()

    def is_set(self) -> bool:
        return self._set or (self._parent is not None and self._parent.is_set())

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, waking early once set."""
        if self._event is None:
            # Made before the flag is read again below: a set() that missed the new
            # event had set the flag first, so the loop sees it and does not wait.
            with _MAKING_EVENTS:  # two threads waiting at once share one event
                if self._event is None:
                    self._event = threading.Event()
        deadline = perf_counter() + seconds
        while not self.is_set():
            left = deadline - perf_counter()
            if left <= 0:
                return
            # In slices: the parent's event is not waited on directly.
            self._event.wait(min(left, 0.05) if self._parent is not None else left)


class WorkerThreads:
    """The async lane's worker threads, made as needed up to ``max_threads``.

    A hop to one is a queue entry an idle thread takes, and its end one callback on the
    loop: about 40 % of what ``loop.run_in_executor`` with a ``ThreadPoolExecutor``
    costs per hop (its concurrent future, condition and chained callbacks). Like the
    pool, a call whose awaiting task was cancelled before a thread took it is not made,
    and one under way runs to its end (the lanes' :class:`Stop` ends the run's further
    calls). The threads are daemons: at interpreter exit a step still running in one is
    abandoned rather than waited for.
    """

    def __init__(self, max_threads: int, name: str = "chainweaver") -> None:
        self._max = max_threads
        self._name = name
        self._calls: SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...],
                                       asyncio.AbstractEventLoop, asyncio.Future[Any]]] = \
            SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a call
        self._queued = 0  # calls no thread has taken yet
        self._threads = 0

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` in a worker thread; await the future for its result."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._lock:
            self._queued += 1
            start = self._queued > self._idle and self._threads < self._max
            if start:
                name = f"{self._name}_{self._threads}"
                self._threads += 1
        self._calls.put((fn, args, loop, done))
        if start:
            threading.Thread(target=self._work, name=name, daemon=True).start()
        return done

    def busy(self) -> int:
        """How many threads are making a call now."""
        with self._lock:
            return self._threads - self._idle

    def _work(self) -> None:
        calls, lock = self._calls, self._lock
        while True:
            with lock:
                self._idle += 1
            fn, args, loop, done = calls.get()
            with lock:
                self._idle -= 1
                self._queued -= 1
            if not done.cancelled():  # a stale read at worst makes a call nobody awaits
                try:
                    result = fn(*args)
                except BaseException as error:  # handed to the awaiting task
                    _hand_back(loop, _failed, done, error)
                else:
                    _hand_back(loop, _settled, done, result)


def _hand_back(loop: asyncio.AbstractEventLoop, settle: Callable[..., None],
               done: asyncio.Future[Any], value: Any) -> None:
    try:
        loop.call_soon_threadsafe(settle, done, value)
    except RuntimeError:  # the loop closed meanwhile: no one awaits the call any more
        pass


def _settled(done: asyncio.Future[Any], result: Any) -> None:
    if not done.cancelled():
        done.set_result(result)


def _failed(done: asyncio.Future[Any], error: BaseException) -> None:
    if not done.cancelled():
        done.set_exception(error)


async def with_timeout(coroutine: Coroutine[Any, Any, Any], timeout: float | None) -> Any:
    if timeout is None:
        return await coroutine
    try:
        return await asyncio.wait_for(coroutine, timeout)
    except TimeoutError:
        raise StepTimeout(timeout) from None


def call_blocking(tool: Tool, model: BaseModel, timeout: float | None) -> Any:
    """Call a tool from sync code; with a timeout, in a helper thread left behind on expiry."""
    if tool.is_async:
        return run_coroutine_blocking(with_timeout(tool.fn(model), timeout))
    if timeout is None:
        return tool.fn(model)
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append((True, tool.fn(model)))
        except BaseException as error:  # handed to the waiting step below
            outcome.append((False, error))

    # A daemon thread, not the pool: an abandoned call must not hold a pool slot that
    # other steps wait for, nor keep the interpreter alive at exit.
    helper = threading.Thread(target=target, name=f"chainweaver-{tool.name}", daemon=True)
    helper.start()
    helper.join(timeout)
    if not outcome:
        raise StepTimeout(timeout)
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def run_coroutine_blocking(coroutine: Any) -> Any:
    """Run a coroutine from sync code, also when an event loop is already running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
