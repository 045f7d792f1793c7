"""A FlowServer following the shared governance state while it serves (or works).

The follower (:class:`chainweaver.governance.SharedGovernance`) is built with the
server, so that its registry listener comes before the server's snapshot follower,
and runs on the server's event loop for as long as the server's lifespan is entered:
``serve``, an in-memory client, or ``chainweaver worker``. It changes the registry;
the server's own follower builds the next snapshot and its notifier tells clients,
exactly as for a local change.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from chainweaver.governance import GovernanceSettings, SharedGovernance
from chainweaver.registry import FlowRegistry


class SharedRunner:
    """Runs one :class:`SharedGovernance` while any lifespan of the server is entered."""

    def __init__(self, settings: GovernanceSettings, registry: FlowRegistry) -> None:
        self.follower = SharedGovernance(settings, registry)
        self._task: asyncio.Task[None] | None = None
        self._entered = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self._entered += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.follower.run())
        try:
            yield
        finally:
            self._entered -= 1
            if self._entered == 0 and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def shared_runner(settings: GovernanceSettings | None,
                  registry: FlowRegistry) -> SharedRunner | None:
    return None if settings is None else SharedRunner(settings, registry)


def running(runner: SharedRunner | None) -> contextlib.AbstractAsyncContextManager[None]:
    """The runner's lifespan part (nothing without shared governance)."""
    return contextlib.nullcontext() if runner is None else runner.running()
