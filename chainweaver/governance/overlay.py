"""Applying the shared governance state to one process's registry.

A :class:`GovernanceOverlay` remembers, for every flow name a decision touched, its
versions as this process's code and files defined them (the *base*), and puts each
version in the registry as the shared decision makes it (:func:`.state.governed`),
one registry change per name that differs. The registry's listeners (a
``FlowServer``'s snapshot follower) then do what they do for any local change: build
the next snapshot and tell clients.

Flows registered later (a flow file reloaded by ``serve --watch``) are governed
inside their own change: the overlay is a registry listener, subscribed before the
server's follower, that governs the name again before the follower sees the change.

An apply is complete when every name it touched is in the registry as decided; only
then is its version :attr:`GovernanceOverlay.applied_version` (what the heartbeat
reports). A name whose decision the registry refused is withheld instead, and tried
again with the next apply. An entry that cannot be read withholds its flow (logged
once, naming the flow) and does not stop the others from applying.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from chainweaver.flows import Flow
from chainweaver.registry import FlowRegistry, RegistryChange

from .state import Decision, SharedState

logger = logging.getLogger("chainweaver.governance")

# Serving no flow: every one withheld (not merely archived: force_expose publishes that).
STALE = ("withheld by shared governance: the shared state could not be confirmed for "
         "too long (stop_serving_after)")


class GovernanceOverlay:
    """Puts a registry's flows under the shared decisions (see the module docstring)."""

    def __init__(self, registry: FlowRegistry) -> None:
        self.registry = registry
        self.state = SharedState()  # the last state applied (completely or not)
        self.applied_version = 0  # the version of the last complete apply
        self.suspended = False
        self._suspended_as = Decision(withheld=STALE)  # what governs every flow then
        # name -> why its decision could not be put in the registry (tried again)
        self.failed: dict[str, str] = {}
        # name -> its versions as defined; id(copy placed) -> (copy, definition); the
        # version keys the decision withdrew (kept in the base, absent from the registry)
        self._base: dict[str, tuple[Flow, ...]] = {}
        self._origin: dict[str, dict[int, tuple[Flow, Flow]]] = {}
        self._withdrawn: dict[str, set[tuple[object, ...]]] = {}
        self._applying = False
        # The registry's own lock: its listeners (this one too) run holding it, so one
        # lock for both keeps the order of changes and cannot deadlock.
        self._lock = registry._lock
        self._unsubscribe: Callable[[], None] = registry.subscribe(self._on_change)

    def close(self) -> None:
        """Stop following registry changes (the flows stay as they are)."""
        self._unsubscribe()

    @property
    def complete(self) -> bool:
        """Whether the last state applied is in the registry, every name as decided."""
        return self.applied_version == self.state.version and not self.failed

    def apply(self, state: SharedState) -> list[str]:
        """Govern the registry by ``state``; the names whose flows changed.

        Names whose decision could not be applied last time are tried again.
        :attr:`applied_version` becomes ``state.version`` only if every name is in the
        registry as decided (:attr:`failed` says which are not, and why)."""
        with self._lock:
            before = self.state.decisions
            self.state = state
            names = {*before, *state.decisions}
            touched = {name for name in names
                       if before.get(name) != state.decisions.get(name)}
            _log_readability(before, state, touched)
            if self.suspended:
                return []
            changed = [name for name in sorted(touched | set(self.failed))
                       if self._govern(name)]
            if not self.failed:
                self.applied_version = state.version
            return changed

    def suspend(self, reason: str = STALE) -> int:
        """Serve no flow (every one withheld, for ``reason``) until :meth:`resume`; how
        many changed."""
        with self._lock:
            self.suspended = True
            self._suspended_as = Decision(withheld=reason)
            return sum(self._govern(name) for name in self.registry.names())

    def resume(self) -> int:
        """Govern by the last applied state again; how many names changed."""
        with self._lock:
            self.suspended = False
            changed = sum(self._govern(name)
                          for name in {*self.registry.names(), *self._base})
            if not self.failed:
                self.applied_version = self.state.version
            return changed

    def known_names(self) -> list[str]:
        """Every flow name this process defines, sorted: those in its registry and those
        a decision withdrew from it (their definitions are kept here)."""
        with self._lock:
            return sorted(set(self.registry.names()) | set(self._base))

    def decision(self, name: str) -> Decision | None:
        """The decision governing ``name`` now (suspended: withheld)."""
        return self._suspended_as if self.suspended else self.state.decisions.get(name)

    # ------------------------------------------------------------------ internals

    def _govern(self, name: str) -> bool:
        """Put ``name``'s versions in the registry as decided; whether that changed it.

        When the registry refuses (a server could not publish the result, e.g. a name
        collision), the flow is withheld instead, and ``name`` stays in :attr:`failed`
        until an apply succeeds."""
        base = self._definitions(name)
        decision = self.decision(name)
        before = self.registry.state().flows.get(name, ())
        try:
            self._place(name, base, decision)
            self.failed.pop(name, None)
        except Exception as error:
            # The registry keeps what it had, and the overlay what it knew. Tried again
            # with every apply: logged when the failure is new.
            why = f"{type(error).__name__}: {error}"[:300]
            if self.failed.get(name) != why:
                logger.exception("shared governance: could not apply the decision on %r; "
                                 "withholding the flow until it applies", name)
            self.failed[name] = why
            reason = (f"withheld by shared governance: the decision could not be "
                      f"applied here ({self.failed[name]})")
            try:
                self._place(name, base, Decision(withheld=reason))
            except Exception:
                logger.exception("shared governance: could not withhold %r either", name)
        after = self.registry.state().flows.get(name, ())
        return len(after) != len(before) or any(
            a is not b for a, b in zip(after, before, strict=True))

    def _place(self, name: str, base: tuple[Flow, ...], decision: Decision | None) -> None:
        wanted: list[Flow] = []
        origin: dict[int, tuple[Flow, Flow]] = {}
        for defined in base:
            copy = defined if decision is None else decision.govern(defined)
            if copy is not None:
                wanted.append(copy)
                if copy is not defined:
                    origin[id(copy)] = (copy, defined)
        self._applying = True
        try:
            self.registry.govern(name, tuple(wanted))
        finally:
            self._applying = False
        if decision is None:  # nothing decided: the definitions stand
            for known in (self._base, self._origin, self._withdrawn):
                known.pop(name, None)
        else:
            self._base[name], self._origin[name] = base, origin
            kept = {flow.version_key for flow in wanted}
            self._withdrawn[name] = {f.version_key for f in base if f.version_key not in kept}

    def _definitions(self, name: str) -> tuple[Flow, ...]:
        """``name``'s versions as defined: the registry's, with governed copies mapped
        back to their definitions, plus the versions the decision withdrew."""
        origin = self._origin.get(name, {})
        current = self.registry.state().flows.get(name, ())
        defined = []
        for flow in current:
            placed = origin.get(id(flow))
            defined.append(placed[1] if placed is not None and placed[0] is flow else flow)
        keys = {flow.version_key for flow in defined}
        gone = self._withdrawn.get(name, set())
        withdrawn = [flow for flow in self._base.get(name, ())
                     if flow.version_key in gone and flow.version_key not in keys]
        return tuple(sorted((*defined, *withdrawn), key=lambda f: f.version_key))

    def _on_change(self, change: RegistryChange) -> None:
        """A change made by other code: govern its name again, inside that change."""
        if self._applying or (change.name not in self._base and self.decision(
                change.name) is None):
            return
        with self._lock:
            self._govern(change.name)


def _log_readability(before: Mapping[str, Decision], state: SharedState,
                     names: set[str]) -> None:
    """Once per change of an entry's readability: a warning naming the flow."""
    for name in sorted(names):
        was, now = before.get(name), state.decisions.get(name)
        withheld = now.withheld if now is not None else None
        if withheld is not None and (was is None or was.withheld != withheld):
            logger.warning("shared governance: flow %r is not served: %s", name, withheld)
        elif was is not None and was.withheld is not None and withheld is None:
            logger.warning("shared governance: the entry for flow %r can be read again; "
                           "it governs the flow", name)
