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
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from chainweaver.flows import Flow
from chainweaver.registry import FlowRegistry, RegistryChange

from .state import Decision, SharedState, governed

logger = logging.getLogger("chainweaver.governance")

_SUSPENDED = Decision(all="archived")  # serving no flow: every one archived


class GovernanceOverlay:
    """Puts a registry's flows under the shared decisions (see the module docstring)."""

    def __init__(self, registry: FlowRegistry) -> None:
        self.registry = registry
        self.state = SharedState()  # the last state applied
        self.suspended = False
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

    def apply(self, state: SharedState) -> list[str]:
        """Govern the registry by ``state``; the names whose flows changed."""
        with self._lock:
            before = self.state.decisions
            self.state = state
            if self.suspended:
                return []
            names = {*before, *state.decisions}
            changed = [name for name in names
                       if before.get(name) != state.decisions.get(name)]
            return [name for name in sorted(changed) if self._govern(name)]

    def suspend(self) -> int:
        """Serve no flow (every one archived) until :meth:`resume`; how many changed."""
        with self._lock:
            self.suspended = True
            return sum(self._govern(name) for name in self.registry.names())

    def resume(self) -> int:
        """Govern by the last applied state again; how many names changed."""
        with self._lock:
            self.suspended = False
            return sum(self._govern(name) for name in {*self.registry.names(), *self._base})

    def decision(self, name: str) -> Decision | None:
        """The decision governing ``name`` now (suspended: archived)."""
        return _SUSPENDED if self.suspended else self.state.decisions.get(name)

    # ------------------------------------------------------------------ internals

    def _govern(self, name: str) -> bool:
        """Put ``name``'s versions in the registry as decided; whether that changed it."""
        base = self._definitions(name)
        decision = self.decision(name)
        wanted: list[Flow] = []
        origin: dict[int, tuple[Flow, Flow]] = {}
        for defined in base:
            copy = defined if decision is None else governed(
                defined, decision.for_version(defined.version))
            if copy is not None:
                wanted.append(copy)
                if copy is not defined:
                    origin[id(copy)] = (copy, defined)
        before = self.registry.sequence
        self._applying = True
        try:
            self.registry.govern(name, tuple(wanted))
        except Exception:
            # A server refused the snapshot (e.g. a name collision): the registry keeps
            # what it had, and the overlay what it knew.
            logger.exception("shared governance: could not apply the decision on %r", name)
            return False
        finally:
            self._applying = False
        if decision is None:  # nothing decided: the definitions stand
            for known in (self._base, self._origin, self._withdrawn):
                known.pop(name, None)
        else:
            self._base[name], self._origin[name] = base, origin
            kept = {flow.version_key for flow in wanted}
            self._withdrawn[name] = {f.version_key for f in base if f.version_key not in kept}
        return self.registry.sequence != before

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
