"""A FlowServer following the shared governance state while it serves (or works).

The follower (:class:`chainweaver.governance.SharedGovernance`) is built with the
server, so that its registry listener comes before the server's snapshot follower,
and runs on the server's event loop for as long as the server's lifespan is entered:
``serve``, an in-memory client, or ``chainweaver worker``. It changes the registry;
the server's own follower builds the next snapshot and its notifier tells clients,
exactly as for a local change.

Entering the lifespan waits until the follower applied the shared state, or its first
attempt to read it failed: a server then serves no flow until a read succeeds (it
answers, with empty lists), and a worker waits for that read before it takes a task
(one taken now could only fail, for good, though its flow may well be published). The
rest of the server's lifespan (Docket and its worker) starts after this part, and no
request is served before the lifespan is entered: a process started after an operator
archived a flow never publishes it, nor runs a task of it that was queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from chainweaver.governance import GovernanceSettings, SharedGovernance
from chainweaver.registry import FlowRegistry

logger = logging.getLogger("chainweaver.governance")


class SharedRunner:
    """Runs one :class:`SharedGovernance` while any lifespan of the server is entered."""

    def __init__(self, settings: GovernanceSettings, registry: FlowRegistry) -> None:
        self.follower = SharedGovernance(settings, registry)
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._entered = 0

    @property
    def following(self) -> bool:
        """Whether the follower runs (a lifespan of the server is entered)."""
        return self._task is not None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self._entered += 1
        try:
            if self._task is None:
                self._ready = asyncio.Event()
                self._task = asyncio.get_running_loop().create_task(
                    self.follower.run(self._ready))
            await _first_sync(self._ready, self._task)
            if self.follower.role == "worker" and not self.follower.applied.is_set():
                logger.warning("shared governance: this worker takes no task until it has "
                               "read the shared state")
                await _first_sync(self.follower.applied, self._task)
            yield
        finally:
            self._entered -= 1
            if self._entered == 0 and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def _first_sync(ready: asyncio.Event | None, task: asyncio.Task[None] | None) -> None:
    """Until ``ready`` is set (the follower's first attempt to read the state ended, or
    it applied a state), or the follower stopped."""
    if ready is None or task is None or ready.is_set():
        return
    waiting = asyncio.ensure_future(ready.wait())
    try:
        await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()


def shared_runner(settings: GovernanceSettings | None,
                  registry: FlowRegistry) -> SharedRunner | None:
    return None if settings is None else SharedRunner(settings, registry)


def running(runner: SharedRunner | None) -> contextlib.AbstractAsyncContextManager[None]:
    """The runner's lifespan part (nothing without shared governance)."""
    return contextlib.nullcontext() if runner is None else runner.running()
