"""FlowRegistry: every registered flow, by name and version."""

from __future__ import annotations

from .errors import DuplicateFlowError, FlowNotFoundError, FlowVersionNotFoundError
from .flows import Flow, FlowLifecycle
from .versions import version_key


class FlowRegistry:
    """Holds flows by name; each name may have many versions, compared as versions."""

    def __init__(self) -> None:
        # name -> versions sorted ascending by version key
        self._flows: dict[str, list[Flow]] = {}
        # Every registration is numbered, so a reader can see the registry as it stood.
        self._sequence = 0
        self._registered_at: dict[tuple[str, tuple], int] = {}

    def register_flow(self, flow: Flow) -> Flow:
        """Add ``flow``; the same name and version (as versions: 1.0 == 1.0.0) is an error."""
        if not isinstance(flow, Flow):
            raise TypeError(f"register_flow expects a Flow, got {type(flow).__name__}")
        versions = self._flows.setdefault(flow.name, [])
        key = flow.version_key
        if any(existing.version_key == key for existing in versions):
            raise DuplicateFlowError(
                f"flow {flow.name!r} version {flow.version!r} is already registered"
            )
        versions.append(flow)
        versions.sort(key=lambda f: f.version_key)
        self._sequence += 1
        self._registered_at[(flow.name, key)] = self._sequence
        return flow

    @property
    def sequence(self) -> int:
        """The number of registrations so far: a point in the registry's history."""
        return self._sequence

    def get_flow_as_of(self, name: str, sequence: int) -> Flow | None:
        """The latest version of ``name`` among those registered by ``sequence`` (None:
        the name had no version then)."""
        for flow in reversed(self._flows.get(name, ())):
            if self._registered_at[(name, flow.version_key)] <= sequence:
                return flow
        return None

    def names_as_of(self, sequence: int) -> list[str]:
        """Flow names that had a version registered by ``sequence``, sorted."""
        return [name for name in sorted(self._flows)
                if self.get_flow_as_of(name, sequence) is not None]

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
        return [flow for name in sorted(self._flows) for flow in self._flows[name]]

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
