"""The tools list of a view that narrows nothing, with each flow decided when read.

Such a view lists every published tool, so which tools it lists, in what order, and
its cursor fingerprint come from :meth:`Exposure.published_tools` (the governance
filter's judgement of every flow, without building what each publishes). An item is
the flow's full decision, made when a page first reads it: a page of 100 tools builds
100 decisions, not the catalogue's.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from chainweaver.mcp.publish.exposure import ExposedFlow, Exposure


class PublishedTools(Sequence[ExposedFlow | None]):
    """The published tools of one snapshot, sorted by name.

    An item is None only when the flow's decision no longer publishes it (a tool it
    uses was removed from the executor since it was judged): it is then left out of
    the page, never listed.
    """

    def __init__(self, exposure: Exposure) -> None:
        # Weakly: this list is cached in a view kept per snapshot in a weak-keyed map,
        # and a strong reference back to the snapshot would keep both alive for ever.
        # A request serving the list pins its snapshot, so it is alive while read.
        self._exposure = weakref.ref(exposure)
        self._names = exposure.published_tools()

    def _flow(self, name: str) -> ExposedFlow | None:
        exposure = self._exposure()
        return exposure.flow(name) if exposure is not None else None

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, index: int) -> ExposedFlow | None: ...

    @overload
    def __getitem__(self, index: slice) -> list[ExposedFlow | None]: ...

    def __getitem__(self, index: int | slice) -> ExposedFlow | None | list[ExposedFlow | None]:
        if isinstance(index, slice):
            return [self._flow(flow) for _, _, flow in self._names[index]]
        return self._flow(self._names[index][2])

    def __iter__(self) -> Iterator[ExposedFlow | None]:
        return (self._flow(flow) for _, _, flow in self._names)

    def keys(self) -> Iterable[str]:
        """Each item's name and version, as the cursor fingerprint reads them."""
        return (f"{name} {version}" for name, version, _ in self._names)
