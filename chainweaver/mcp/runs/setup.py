"""Wiring a server's run history: its store, the gate's run lookup, and telling
subscribers of each status change (see ``docs/run-history.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.publish.run_uris import RUNS_URI, run_uri
from chainweaver.mcp.runs.recording import RunLog
from chainweaver.mcp.runs.records import MemoryRunStore, RunRecord, RunStore
from chainweaver.mcp.runs.spill import (
    SPILL_MAX_AGE,
    SPILL_MAX_BYTES,
    SPILL_MAX_OUTPUTS,
    SpillStore,
)

if TYPE_CHECKING:
    from chainweaver.mcp.components.provider import FlowProvider
    from chainweaver.mcp.gate.security import SecurityGate
    from chainweaver.mcp.live.notifications import ChangeNotifier


def open_run_log(settings: RunHistory | None) -> RunLog | None:
    """The run log a ``ServingConfig(run_history=...)`` asks for (None: no history)."""
    if settings is None:
        return None
    return RunLog(settings, open_store(settings.store, max_runs=settings.max_runs,
                                       max_age=settings.max_age,
                                       max_output_bytes=settings.max_output_bytes,
                                       prefix=settings.prefix))


def output_spill(*, task_links: bool = True) -> RunLog:
    """Where a server without a run history keeps outputs too large to send: its output
    spill (:mod:`.spill`). ``task_links`` False: its background tasks may run in
    other processes (a shared task backend), whose spills no client reaches."""
    spill = RunHistory(max_runs=SPILL_MAX_OUTPUTS, max_age=SPILL_MAX_AGE,
                       max_output_bytes=SPILL_MAX_BYTES)
    return RunLog(spill, SpillStore(SPILL_MAX_OUTPUTS, SPILL_MAX_AGE, SPILL_MAX_BYTES),
                  records=False, task_links=task_links)


def connect_run_log(log: RunLog, gate: SecurityGate, provider: FlowProvider,
                    notifier: ChangeNotifier) -> None:
    """Let the gate resolve run URIs, and (with a run history) tell subscribers of each
    status change."""
    resources = provider.run_resources
    if resources is None:
        return
    gate.run_target = resources.target
    if not log.records:
        return

    async def updated(record: RunRecord) -> None:
        await notifier.run_updated(record.caller, record.flow,
                                   [run_uri(record.run_id), RUNS_URI])

    log.updated = updated


def open_store(url: str, *, max_runs: int, max_age: float, max_output_bytes: int,
               prefix: str) -> RunStore:
    """The store a ``RunHistory(store=...)`` URL names."""
    if url.startswith("memory://"):
        return MemoryRunStore(max_runs, max_age, max_output_bytes)
    from chainweaver.mcp.runs.redis_records import RedisRunStore

    return RedisRunStore(url, max_runs=max_runs, max_age=max_age, prefix=prefix)
