"""Durable runs: each step's validated output is checkpointed, and a run started again
with the same run id resumes where it stopped.

``execute_flow_async(..., run_id=..., checkpoints=store)`` stores, before any step that
depends on it starts, what each completed (or skipped) step gave. Run again with the
same id (after its process died, say), the run takes those steps from the checkpoint
(their records say ``restored``) and runs only the others; parallel branches keep what
each completed. A step that was running when the run stopped is run again only when
its tools are idempotent or take an :data:`~chainweaver.IdempotencyKey`; otherwise the
run fails with ``InterruptedStepError`` ("interrupted while running a non-idempotent
step") and nothing runs. A run id whose checkpoints were written by another flow
version, another plan or another input, or that it cannot read (damaged, edited by
hand, written by another release), refuses to resume (:class:`CheckpointMismatchError`).

A :class:`CheckpointStore` keeps a few byte strings per run id; this module has the
in-memory one, :mod:`chainweaver.checkpoints_redis` the Redis one. How a run writes,
reads and resumes from them is the engine's (:mod:`chainweaver.engine.durable`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from .errors import ChainWeaverError

INTERRUPTED = "InterruptedStepError"


class CheckpointMismatchError(ChainWeaverError):
    """A run id's checkpoints belong to another flow version, plan or input."""


class CheckpointStoreError(ChainWeaverError):
    """The checkpoint store failed to load or save (down, or closed under the run as
    its process shuts down): the run stopped at a step boundary, and nothing says the
    flow failed. Its checkpoints are as the store last acknowledged them, so the same
    run id resumes once the store is back. ``__cause__`` is the store's error."""


@runtime_checkable
class CheckpointStore(Protocol):
    """Where a run's checkpoints live: a few named byte strings per run id.

    ``save`` adds (or replaces) entries; ``load`` returns every entry of a run (empty:
    none); ``discard`` forgets a run. Stores may expire runs; they must not lose an
    entry they acknowledged while its run may still be resumed.
    """

    async def load(self, run_id: str) -> Mapping[str, bytes]: ...

    async def save(self, run_id: str, entries: Mapping[str, bytes]) -> None: ...

    async def discard(self, run_id: str) -> None: ...


class MemoryCheckpointStore:
    """Checkpoints in this process (tests, or resuming a run after an exception)."""

    def __init__(self) -> None:
        self._runs: dict[str, dict[str, bytes]] = {}

    async def load(self, run_id: str) -> Mapping[str, bytes]:
        return dict(self._runs.get(run_id, {}))

    async def save(self, run_id: str, entries: Mapping[str, bytes]) -> None:
        self._runs.setdefault(run_id, {}).update(entries)

    async def discard(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
