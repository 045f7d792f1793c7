"""FlowRegistry: every registered flow, by name and version, and the changes to it."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from .errors import DuplicateFlowError, FlowNotFoundError, FlowVersionNotFoundError
from .flows import Flow, FlowLifecycle
from .versions import version_key

logger = logging.getLogger("chainweaver.registry")

ChangeKind = Literal["registered", "lifecycle", "unregistered"]


@dataclass(frozen=True)
class RegistryChange:
    """One applied change: what happened to which flow, and the registry's new sequence."""

    kind: ChangeKind
    name: str
    version: str | None
    sequence: int


@dataclass(frozen=True)
class RegistryState:
    """The registry as it stood at one ``sequence``: never changes once taken."""

    sequence: int
    flows: Mapping[str, tuple[Flow, ...]]  # name -> versions, ascending

    def latest(self, name: str) -> Flow | None:
        """The latest version of ``name`` in this state (None: no version)."""
        versions = self.flows.get(name)
        return versions[-1] if versions else None

    def names(self) -> list[str]:
        """Flow names in this state, in registration order."""
        return list(self.flows)

    def __contains__(self, name: object) -> bool:
        return name in self.flows


Listener = Callable[[RegistryChange], None]


class FlowRegistry:
    """Holds flows by name; each name may have many versions, compared as versions.

    The registry may change while servers read it: every change is numbered
    (:attr:`sequence`), :meth:`state` hands out an immutable view of one point in its
    history, and :meth:`subscribe` tells listeners about each change after it is
    applied. Changes and listeners are serialised by one lock, so listeners see the
    changes in order and a change has reached every listener when it returns.
    """

    def __init__(self) -> None:
        # name -> versions sorted ascending by version key. Copied on the first
        # change after a state() handed the dict out (states never see a change).
        self._flows: dict[str, tuple[Flow, ...]] = {}
        self._shared = False
        self._sequence = 0
        self._state: RegistryState | None = None
        self._lock = threading.RLock()
        self._listeners: dict[object, Listener] = {}

    # ------------------------------------------------------------------ changes

    def register_flow(self, flow: Flow) -> Flow:
        """Add ``flow``; the same name and version (as versions: 1.0 == 1.0.0) is an error."""
        if not isinstance(flow, Flow):
            raise TypeError(f"register_flow expects a Flow, got {type(flow).__name__}")
        with self._lock:
            versions = self._flows.get(flow.name, ())
            key = flow.version_key
            if any(existing.version_key == key for existing in versions):
                raise DuplicateFlowError(
                    f"flow {flow.name!r} version {flow.version!r} is already registered"
                )
            self._apply("registered", flow.name, flow.version,
                        tuple(sorted((*versions, flow), key=lambda f: f.version_key)))
        return flow

    def set_lifecycle(self, name: str, lifecycle: FlowLifecycle | str,
                      version: str | None = None) -> Flow:
        """Move a flow version (the latest when ``version`` is None) to ``lifecycle``.

        The move must be allowed (``draft -> reviewed -> active -> archived``, see
        :data:`~chainweaver.flows.ALLOWED_TRANSITIONS`), else
        :class:`~chainweaver.errors.LifecycleTransitionError`. Flows are immutable: the
        version is replaced by a copy with the new governance, which is returned.
        """
        with self._lock:
            current = self.get_flow(name, version)
            moved = dataclasses.replace(
                current, governance=current.governance.transition(lifecycle))
            versions = tuple(moved if f is current else f for f in self._flows[name])
            self._apply("lifecycle", name, current.version, versions)
        return moved

    def unregister(self, name: str, version: str | None = None) -> None:
        """Remove one version of ``name``, or every version when ``version`` is None."""
        with self._lock:
            removed = self.get_flow(name, version)  # raises when there is none
            versions = () if version is None else tuple(
                f for f in self._flows[name] if f is not removed)
            self._apply("unregistered", name, version, versions)

    def govern(self, name: str, versions: tuple[Flow, ...]) -> None:
        """Replace every version of ``name`` at once, as shared governance decided
        (:mod:`chainweaver.governance`): applied as written, like a flow file edit, so
        the lifecycle transition rules do not apply. One change (``"lifecycle"``), or
        none when nothing differs; no versions left removes the name."""
        if any(flow.name != name for flow in versions):
            raise ValueError(f"govern({name!r}) takes versions of that flow only")
        with self._lock:
            ordered = tuple(sorted(versions, key=lambda f: f.version_key))
            current = self._flows.get(name, ())
            if len(ordered) == len(current) and all(
                    a is b for a, b in zip(ordered, current, strict=True)):
                return
            self._apply("lifecycle", name, None, ordered)

    def _apply(self, kind: ChangeKind, name: str, version: str | None,
               versions: tuple[Flow, ...]) -> None:
        """Replace ``name``'s versions, then tell every listener (lock held).

        A listener that raises refuses the change: it is undone (as a change of its
        own, so listeners that took it follow the undo too) and the error is raised.
        """
        before = self._flows.get(name, ())
        self._replace(name, versions)
        change = RegistryChange(kind, name, version, self._sequence)
        try:
            self._notify(change)
        except Exception:
            self._replace(name, before)
            try:
                self._notify(RegistryChange(kind, name, version, self._sequence))
            except Exception:  # the undo restores a state listeners accepted before
                logger.exception("a registry listener refused undoing a refused change")
            raise

    def _replace(self, name: str, versions: tuple[Flow, ...]) -> None:
        if self._shared:
            self._flows = dict(self._flows)
            self._shared = False
        if versions:
            self._flows[name] = versions
        else:
            self._flows.pop(name, None)
        self._sequence += 1
        self._state = None

    def _notify(self, change: RegistryChange) -> None:
        for listener in list(self._listeners.values()):
            listener(change)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(change)`` after each change; returns an unsubscribe callable.

        Listeners run in the thread that made the change, while it holds the
        registry's lock: keep them short. One that raises refuses the change.
        """
        token = object()
        with self._lock:
            self._listeners[token] = listener

        def unsubscribe() -> None:
            with self._lock:
                self._listeners.pop(token, None)

        return unsubscribe

    # ------------------------------------------------------------------ reading

    @property
    def sequence(self) -> int:
        """The number of changes so far: a point in the registry's history."""
        return self._sequence

    def state(self) -> RegistryState:
        """The registry as it stands now, as an immutable :class:`RegistryState`."""
        with self._lock:
            if self._state is None:
                self._shared = True
                self._state = RegistryState(self._sequence, MappingProxyType(self._flows))
            return self._state

    def get_flow(self, name: str, version: str | None = None) -> Flow:
        """The flow ``name`` at ``version``, or its latest version when ``version`` is None."""
        versions = self._flows.get(name)
        if not versions:
            raise FlowNotFoundError(f"no flow named {name!r} is registered")
        if version is None:
            return versions[-1]
        key = version_key(version)
        for flow in versions:
            if flow.version_key == key:
                return flow
        raise FlowVersionNotFoundError(
            f"flow {name!r} has no version {version!r} (registered: "
            f"{', '.join(f.version for f in versions)})"
        )

    def latest_active(self, name: str) -> Flow | None:
        """The latest version of ``name`` whose lifecycle is active (None: there is none).

        Sub-flow steps run this version: only reviewed-and-active flows run inside others.
        """
        for flow in reversed(self._flows.get(name, ())):
            if flow.governance.lifecycle is FlowLifecycle.ACTIVE:
                return flow
        return None

    def list_flows(self) -> list[Flow]:
        """Every registered flow, all versions, ordered by name then version."""
        flows = self._flows
        return [flow for name in sorted(flows) for flow in flows[name]]

    def names(self) -> list[str]:
        """Registered flow names, in registration order (cheaper than :meth:`flow_names`)."""
        return list(self._flows)

    def flow_names(self) -> list[str]:
        """Registered flow names, sorted."""
        return sorted(self._flows)

    def versions(self, name: str) -> list[str]:
        """Version strings of ``name``, oldest first."""
        if name not in self._flows:
            raise FlowNotFoundError(f"no flow named {name!r} is registered")
        return [flow.version for flow in self._flows[name]]

    def __contains__(self, name: object) -> bool:
        return name in self._flows

    def __len__(self) -> int:
        return len(self._flows)
