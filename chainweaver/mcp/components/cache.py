"""The components a server's provider built: each on first use, kept by kind and
name, and reused only for the very decision it was built from.

Built before the provider and the change notifier, and given to both: the provider
builds through it, the notifier drops what a new snapshot no longer publishes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chainweaver.mcp.gate.composition import stamp_owner
from chainweaver.mcp.publish.exposure import ExposedFlow, Exposure


class ComponentCache:
    """Components by (kind, name), each with what it was built from (an exposed flow,
    an authored prompt, a snapshot), marked as published by the server of ``owner``."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._built: dict[tuple[str, str], tuple[object, Any]] = {}

    def __len__(self) -> int:
        return len(self._built)

    def keys(self) -> list[tuple[str, str]]:
        """The kind and name of every component kept."""
        return list(self._built)

    def get(self, kind: str, key: str, source: object, build: Callable[[], Any]) -> Any:
        """The component of ``kind`` named ``key`` built from ``source``, built now if
        there is none (a name may be published from another decision after a change:
        a component is reused only for the decision it was built from)."""
        cached = self._built.get((kind, key))
        if cached is not None and cached[0] is source:
            return cached[1]
        component = build()
        stamp_owner(component, self.owner)
        self._built[(kind, key)] = (source, component)
        return component

    def forget_unpublished(self, exposure: Exposure) -> None:
        """Drop the components of flows ``exposure`` no longer publishes as they were
        (after a snapshot swap; safe from any thread). A request still on an older
        snapshot rebuilds what it needs."""
        published = {id(exposed) for exposed in exposure.tools.values()}
        for key, entry in list(self._built.items()):
            source = entry[0]
            if isinstance(source, ExposedFlow) and id(source) not in published:
                if self._built.get(key) is entry:
                    self._built.pop(key, None)
