"""Wiring a server's run history: its store, the gate's run lookup, and telling
subscribers of each status change (see ``docs/run-history.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainweaver.mcp.config import RunHistory
from chainweaver.mcp.publish.run_uris import RUNS_URI, run_uri
from chainweaver.mcp.runs.recording import RunLog
from chainweaver.mcp.runs.records import MemoryRunStore, RunRecord, RunStore

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


# Without a run history: only outputs too large to send in one message are kept, with
# the record of their run, for their callers to read in ranges (docs/run-history.md).
SPILL = RunHistory(max_runs=1_000, max_age=3600.0, max_output_bytes=256 * 2**20)


def output_spill() -> RunLog:
    """Where a server without a run history keeps outputs too large to send."""
    return RunLog(SPILL, MemoryRunStore(SPILL.max_runs, SPILL.max_age,
                                        SPILL.max_output_bytes), records=False)


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
