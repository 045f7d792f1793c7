"""Following the registry: every change swaps a new exposure snapshot in.

The server's :class:`RegistryFollower` is a registry listener, held weakly by the
registry (:func:`weakly`) and kept alive by what serves (the server's snapshot pins),
so a server nobody serves any more stops following.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence

from chainweaver.executor import FlowExecutor
from chainweaver.mcp.config import ExposurePolicy
from chainweaver.mcp.live.notifications import ChangeNotifier
from chainweaver.mcp.publish.exposure import Exposure
from chainweaver.mcp.publish.live_exposure import LiveExposure
from chainweaver.prompts import FlowPrompt
from chainweaver.registry import RegistryState


class RegistryFollower:
    """Swaps a new snapshot in for every registry change (a registry listener).

    ``check`` raises when a snapshot cannot be published (a flow under a tool name
    that ``resources_as_tools`` / ``prompts_as_tools`` took): the change is refused.
    """

    def __init__(self, executor: FlowExecutor, policy: ExposurePolicy,
                 prompts: Sequence[FlowPrompt], live: LiveExposure,
                 notifier: ChangeNotifier,
                 check: Callable[[Exposure], None] | None = None) -> None:
        self.executor = executor
        self.policy = policy
        self.prompts = prompts
        self.live = live
        self.notifier = notifier
        self.check = check
        self._lock = threading.Lock()

    def __call__(self, change: object = None) -> None:
        """Swap in a snapshot of the registry as it is now.

        Runs inside the change, so once ``set_lifecycle`` or ``unregister`` returns no
        request starting afterwards sees the old snapshot. Building is cheap: flows
        are judged when first needed, unchanged ones carried over. A snapshot that
        cannot be built (a name collision, a flow under a tool name that
        resources_as_tools / prompts_as_tools took) raises, and the registry refuses
        the change.
        """
        with self._lock:
            latest = self.live.latest
            state = self.executor.registry.state()
            if state.sequence <= latest.sequence:
                return
            self.live.swap(self._snapshot(state, latest))
        self.notifier.changed()

    def vet(self, state: RegistryState) -> None:
        """Raise, as :meth:`__call__` would, when ``state`` (a registry state that
        does not exist yet: a flow file watcher's edit) could not be published."""
        self._snapshot(state, self.live.latest)

    def _snapshot(self, state: RegistryState, latest: Exposure) -> Exposure:
        snapshot = Exposure(
            self.executor, self.policy, expose_schemas=latest.expose_schemas,
            expose_prompts=latest.expose_prompts, server_prompts=self.prompts,
            state=state, previous=latest)
        if self.check is not None:
            self.check(snapshot)
        return snapshot


def weakly(follower: RegistryFollower) -> Callable[[object], None]:
    """A registry listener that does not keep ``follower`` alive."""
    ref = weakref.ref(follower)

    def follow(change: object) -> None:
        alive = ref()
        if alive is not None:
            alive(change)

    return follow
