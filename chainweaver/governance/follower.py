"""Following the shared governance state from one process (a server replica or worker).

:meth:`SharedGovernance.run` subscribes to the change channel, reads the whole state
(so nothing published before the subscription is missed), applies it, and then:

- on each message, reads the state again and applies it (changes arrive in ms);
- every ``confirm_interval`` seconds, compares the shared version counter with the
  version applied, and reads the state when they differ (a missed message is caught);
- every ``heartbeat_interval`` seconds, and after each apply, records what it applied
  and when, and the flow names it defines (``chainweaver flows status``; ``flows
  archive`` refuses a name no live process, entry or flow file knows).

``ready`` (an event given to :meth:`SharedGovernance.run`) is set once the first
attempt to read the state ended: applied, or Redis could not be reached. A server waits
for it before it serves or its worker takes tasks (``mcp/live/shared.py``), so a process
started after a change never publishes, or runs a queued task of, a flow it archived.

When Redis cannot be reached it keeps the state it applied last, logs that once
(naming the store, its password masked, and why), retries with a growing pause, and
reads everything again on reconnect. A process that has applied no state yet (Redis
unreachable or its state unreadable since the process started) serves no flow until it
has: its definitions never had an operator's decision applied, a flow withdrawn before
it started among them. With ``stop_serving_after``, once the state has gone
unconfirmed that long it serves no flow (every flow withheld) until the state is
confirmed again.

One entry it cannot read is not an outage: that flow is withheld, the rest apply, and
the heartbeat goes on. The heartbeat's ``version`` is the last version applied
completely; what it read and could not apply yet is in ``pending`` / ``not_applied``,
and the entries it cannot read in ``unreadable``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from datetime import UTC, datetime
from typing import Any

from chainweaver.registry import FlowRegistry

from .overlay import GovernanceOverlay
from .state import GovernanceSettings, masked_reason, masked_url
from .store import GovernanceStateError, GovernanceStore, check_url

logger = logging.getLogger("chainweaver.governance")

RETRY_PAUSES = (0.1, 0.25, 0.5, 1.0, 2.0)  # seconds between reconnect attempts
UNREADABLE_STATE = ("withheld by shared governance: the shared state cannot be read "
                    "and this process has applied none")
NOT_READ_YET = ("withheld by shared governance: this process has not read the shared "
                "state yet (Redis unreachable since it started)")


def iso(at: float) -> str:
    """A wall-clock time as logs and status show it (UTC, microseconds)."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds")


class SharedGovernance:
    """Applies the shared state to ``registry`` for as long as :meth:`run` runs."""

    def __init__(self, settings: GovernanceSettings, registry: FlowRegistry,
                 role: str = "serve") -> None:
        check_url(settings.url)  # a URL it could never follow: refused here
        self.settings = settings
        self.role = role
        # Its own heartbeat: host:pid alone is shared by two servers in one process, and
        # by containers on the host network (each its pid 1), which would then overwrite
        # each other's heartbeat (--wait confirming what only one of them applied).
        self.process = settings.replica or \
            f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        # Subscribed now, before a server's snapshot follower: see overlay.py.
        self.overlay = GovernanceOverlay(registry)
        self.applied_at: float | None = None  # wall time of the last apply
        self.confirmed: float | None = None  # monotonic time the state was last confirmed
        self.applied = asyncio.Event()  # set once a state was read (and applied)
        self.outage_since: float | None = None  # wall time Redis was lost
        self.last_outage: dict[str, float] | None = None
        self._beat = 0.0
        self._partial_logged: tuple[int, tuple[str, ...]] | None = None

    def as_worker(self) -> None:
        """This process runs background tasks and serves no transport (``chainweaver
        worker``): its heartbeat says so."""
        self.role = "worker"

    @property
    def version(self) -> int:
        """The shared version applied last, completely (every entry of it)."""
        return self.overlay.applied_version

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Follow the shared state until cancelled; never raises for a lost Redis.

        ``ready`` is set once the first attempt to read the state ended: applied, or
        failed (the process then serves no flow until a read succeeds)."""
        failures = 0
        while True:
            store: GovernanceStore | None = None
            try:
                store = GovernanceStore(self.settings.url, self.settings.prefix)
                await self._follow(store, ready)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # connection refused, reset, timed out, ...
                self._lost(error)
                if self.confirmed is None:
                    self._withhold_all(error)
            finally:
                if store is not None:
                    await _quietly_close(store)
            if ready is not None:
                ready.set()
            self._check_stale()
            await asyncio.sleep(RETRY_PAUSES[min(failures, len(RETRY_PAUSES) - 1)])
            failures = 0 if self.outage_since is None else failures + 1

    async def apply_once(self) -> None:
        """Read the state and apply it once, without following it (a command printing
        what a process would serve now). Raises when the state cannot be read: Redis
        unreachable, or a state as a whole unreadable (:class:`GovernanceStateError`)."""
        store = GovernanceStore(self.settings.url, self.settings.prefix)
        try:
            self._apply(await store.read())
        finally:
            await _quietly_close(store)

    async def _follow(self, store: GovernanceStore, ready: asyncio.Event | None = None
                      ) -> None:
        pubsub = store.redis.pubsub()
        try:
            await pubsub.subscribe(store.channel)
            await self._sync(store, confirmed_version=None)
            if ready is not None:
                ready.set()
            interval = min(self.settings.confirm_interval, self.settings.heartbeat_interval)
            next_confirm = time.monotonic() + self.settings.confirm_interval
            while True:
                wait = max(0.0, min(interval, next_confirm - time.monotonic()))
                message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                   timeout=wait)
                if message is not None:
                    await self._sync(store, confirmed_version=None)
                elif time.monotonic() >= next_confirm:
                    await self._sync(store, await store.current_version())
                    next_confirm = time.monotonic() + self.settings.confirm_interval
                if time.monotonic() - self._beat >= self.settings.heartbeat_interval:
                    await self._heartbeat(store)
        finally:
            await _quietly_close(pubsub)

    async def _sync(self, store: GovernanceStore, confirmed_version: int | None) -> None:
        """Read and apply the state, unless ``confirmed_version`` is the one applied
        (and applied completely: what could not be applied is tried again). A state
        read is applied when its version or its decisions differ from those applied."""
        complete = self.overlay.complete
        if confirmed_version is None or confirmed_version != self.version or not complete:
            state = await store.read()
            # The decisions read are compared too, not only the counter: a counter that
            # is missing (evicted, not restored) reads 0, and one restored from an older
            # snapshot can come back to the version applied with other decisions.
            if (state.version != self.version or self.overlay.suspended or not complete
                    or state.decisions != self.overlay.state.decisions):
                self._apply(state)
                self.confirmed = time.monotonic()
                self.applied.set()
                self._recovered()
                await self._heartbeat(store)
                return
        self.confirmed = time.monotonic()
        self.applied.set()
        if self._recovered():
            await self._heartbeat(store)

    def _apply(self, state: Any) -> None:
        previous = self.version
        changed = self.overlay.apply(state)
        if self.overlay.suspended:
            self.overlay.resume()
            logger.warning("shared governance: state confirmed again; serving flows")
        if not self.overlay.complete:
            failed = tuple(sorted(self.overlay.failed))
            if self._partial_logged != (state.version, failed):
                self._partial_logged = (state.version, failed)
                logger.error("shared governance: version %d not applied: the decision on "
                             "%s could not be applied (those flows are withheld); still "
                             "at version %d, trying again", state.version,
                             ", ".join(failed), self.version)
            return
        self._partial_logged = None
        self.applied_at = time.time()
        logger.info("shared governance: applied version %d at %s (was %d; flows changed: "
                    "%s)", state.version, iso(self.applied_at), previous,
                    ", ".join(changed) or "none")

    def _recovered(self) -> bool:
        """Reachable again after an outage: log it and keep it for status."""
        if self.outage_since is None:
            return False
        now = time.time()
        self.last_outage = {"from": self.outage_since, "to": now}
        logger.warning("shared governance: Redis reachable again after %.1f s; "
                       "re-synchronised to version %d", now - self.outage_since, self.version)
        self.outage_since = None
        return True

    def _lost(self, error: Exception) -> None:
        if self.outage_since is not None:
            return
        self.outage_since = time.time()
        store = masked_url(self.settings.url)
        why = masked_reason(error, self.settings.url)
        if self.confirmed is None:
            return  # no state applied to keep serving: _withhold_all says so
        if _unreadable(error):
            # e.g. the counter is not a number, a key of the wrong type (WRONGTYPE)
            logger.error("shared governance: the state at %s cannot be read (%s); "
                         "serving the last applied state (version %d) until it can",
                         store, why, self.version)
        elif _connection_error(error):
            logger.warning("shared governance: Redis unreachable at %s (%s); serving the "
                           "last applied state (version %d) until it is back",
                           store, why, self.version)
        else:  # a defect here: say so, with the traceback, and fail as for an outage
            logger.error("shared governance: following the state at %s failed (%s); "
                         "serving the last applied state (version %d)", store, why,
                         self.version, exc_info=error)

    def _withhold_all(self, error: Exception) -> None:
        """This process has applied no state (Redis unreachable, or answering with a
        state it cannot read, since it started): what governance withdrew is unknown,
        so serve no flow until it can read it (a process that applied a state keeps
        serving that one, as in an outage)."""
        if self.overlay.suspended:
            return
        store, why = masked_url(self.settings.url), masked_reason(error, self.settings.url)
        if _unreadable(error):
            self.overlay.suspend(UNREADABLE_STATE)
            logger.error("shared governance: the state at %s cannot be read (%s) and this "
                         "process has applied none; serving no flow until it can", store,
                         why)
        else:
            self.overlay.suspend(NOT_READ_YET)
            logger.error("shared governance: Redis unreachable at %s (%s) and this process "
                         "has applied no state yet; serving no flow until it can read it",
                         store, why)

    def _check_stale(self) -> None:
        """Stop serving flows once the state went unconfirmed for too long (opt-in; a
        process that never confirmed one serves none already: :meth:`_withhold_all`)."""
        limit = self.settings.stop_serving_after
        if limit is None or self.overlay.suspended or self.confirmed is None:
            return
        if time.monotonic() - self.confirmed > limit:
            self.overlay.suspend()
            logger.error("shared governance: state not confirmed for more than %g s; "
                         "serving no flow until Redis is reachable", limit)

    def sure_for(self) -> float | None:
        """Seconds this process is sure to keep serving the state it applied: until
        ``stop_serving_after`` would withhold every flow (None: no such bound; 0: the
        state is withheld, or was never confirmed)."""
        limit = self.settings.stop_serving_after
        if self.overlay.suspended or self.confirmed is None:
            return 0.0
        if limit is None:
            return None
        return max(0.0, limit - (time.monotonic() - self.confirmed))

    def record(self) -> dict[str, Any]:
        """What this process's heartbeat says."""
        now = time.time()
        overlay = self.overlay
        return {"role": self.role, "version": self.version, "applied_at": self.applied_at,
                "seen": now, "interval": self.settings.heartbeat_interval,
                "state": "suspended" if overlay.suspended else "serving",
                "last_outage": self.last_outage,
                "confirmed_ago": None if self.confirmed is None
                else round(time.monotonic() - self.confirmed, 3),
                # read but not applied yet (a decision the registry refused)
                "pending": None if overlay.complete else overlay.state.version,
                "not_applied": dict(overlay.failed),
                # entries this process cannot read: their flows are withheld
                "unreadable": overlay.state.unreadable,
                # the flows it defines: `chainweaver flows` refuses names nobody knows
                "flows": overlay.known_names()}

    async def _heartbeat(self, store: GovernanceStore) -> None:
        self._beat = time.monotonic()
        await store.heartbeat(self.process, self.record())


def _unreadable(error: BaseException) -> bool:
    """Redis answered, with a state that cannot be read (a counter that is not a
    number, a key of the wrong type, or anything else this process failed on while
    reading it), as opposed to not answering: only an unreachable Redis is an outage."""
    return isinstance(error, GovernanceStateError) or not _connection_error(error)


def _connection_error(error: BaseException) -> bool:
    """Redis could not be reached (refused, reset, timed out), as opposed to read."""
    try:
        from redis.exceptions import ConnectionError as Unreachable
        from redis.exceptions import TimeoutError as TimedOut
    except ImportError:  # no Redis client (the tasks extra): only the OS says so
        return isinstance(error, OSError)
    return isinstance(error, (OSError, Unreachable, TimedOut))


async def _quietly_close(closable: Any) -> None:
    try:
        await closable.aclose()
    except Exception:  # closing a connection to a Redis that went away
        logger.debug("closing a Redis connection failed", exc_info=True)
