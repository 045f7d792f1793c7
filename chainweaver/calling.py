"""How the lanes call things: tools with a per-attempt timeout, coroutines from sync code,
and the stop signal of an async run that is over."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import Any

from pydantic import BaseModel

from .runner import StepTimeout
from .tools import Tool


class Stop:
    """Set when an async run is over (finished, timed out, cancelled), or its caller's
    run is: steps still running in worker threads then make no further request."""

    __slots__ = ("_event", "_parent")

    def __init__(self, parent: Stop | None = None) -> None:
        self._event = threading.Event()
        self._parent = parent

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set() or (self._parent is not None and self._parent.is_set())

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, waking early once set."""
        deadline = perf_counter() + seconds
        while not self.is_set():
            left = deadline - perf_counter()
            if left <= 0:
                return
            # In slices: the parent's event is not waited on directly.
            self._event.wait(min(left, 0.05) if self._parent is not None else left)


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
