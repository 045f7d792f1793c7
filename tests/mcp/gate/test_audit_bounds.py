"""Audit events are bounded, and no flood of refused requests can rotate earlier
records out of a JsonlAuditLog (issue 22, item 5)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainweaver import FlowExecutor, FlowRegistry
from chainweaver.mcp import AuditEvent, FlowServer, SecurityConfig
from chainweaver.mcp.gate.audit_log import MAX_AUDIT_LINE_BYTES, JsonlAuditLog
from chainweaver.mcp.hooks import AUDIT_TEXT_LIMIT, MAX_AUDIT_EVENT_BYTES, bounded_text

pytestmark = pytest.mark.anyio

TEXT_FIELDS = ("name", "flow_name", "flow_version", "caller_id", "reason", "error_type",
               "result_sha256", "step_id", "task_id", "task_status")

# Long text of every kind: control characters, astral characters, lone surrogates.
huge = st.one_of(
    st.text(min_size=0, max_size=2000),
    st.builds(lambda c, n: c * n, st.characters(), st.integers(0, 50_000)),
    st.just("\x00" * 10_000), st.just("\ud800" * 3000), st.just("😀" * 5000),
)


def event(**texts: Any) -> AuditEvent:
    base: dict[str, Any] = {
        "timestamp": 1.0, "phase": "decision", "kind": "tool", "name": "x",
        "flow_name": None, "flow_version": None, "caller_id": None,
        "decision": "denied", "reason": "unauthenticated"}
    base.update(texts)
    return AuditEvent(**base)


def line_of(value: AuditEvent) -> bytes:
    return (json.dumps(dataclasses.asdict(value), ensure_ascii=False,
                       separators=(",", ":")) + "\n").encode("utf-8")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({name: huge for name in TEXT_FIELDS}))
def test_one_event_is_bounded_whatever_the_caller_sent(texts: dict[str, str]) -> None:
    bounded = event(**texts)
    assert len(line_of(bounded)) <= MAX_AUDIT_EVENT_BYTES
    for name, value in texts.items():
        kept = getattr(bounded, name)
        assert len(kept) <= max(AUDIT_TEXT_LIMIT, 0)
        if kept != value:  # the prefix, the whole length and the whole digest
            digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
            assert kept.endswith(f"…[{len(value)} chars, sha256:{digest}]")


def test_short_text_is_kept_as_sent() -> None:
    assert bounded_text("chainweaver://flows/a/schema") == "chainweaver://flows/a/schema"
    assert event(name="é" * AUDIT_TEXT_LIMIT).name == "é" * AUDIT_TEXT_LIMIT
    assert event(name="x" * (AUDIT_TEXT_LIMIT + 1)).name.startswith("x" * 100)


def records(path: Path) -> list[dict[str, Any]]:
    files = sorted(path.parent.glob(path.name + "*"), reverse=True)  # oldest first
    return [json.loads(line) for file in files for line in file.read_text().splitlines()]


async def test_a_flood_of_huge_refused_names_keeps_the_first_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    # Small files, so that four unbounded 1.1 MB lines would have rotated everything.
    log = JsonlAuditLog(path, max_bytes=64 * 1024, backups=2)
    server = FlowServer(FlowExecutor(FlowRegistry()), security=SecurityConfig(
        authenticator=lambda gate: None, audit_hook=log))
    name = "n" * 1_100_000
    sent = 60
    async with Client(server.fastmcp) as client:
        with pytest.raises(Exception):  # noqa: B017 - any refusal will do
            await client.call_tool("first", {})
        for _ in range(sent):
            with pytest.raises(Exception):  # noqa: B017
                await client.call_tool(name, {})
    log.close()
    kept = records(path)
    assert kept[0]["name"] == "first" and kept[0]["reason"] == "unauthenticated"
    assert all(len(json.dumps(r, ensure_ascii=False)) <= MAX_AUDIT_LINE_BYTES for r in kept)
    # Every refusal is accounted for: one line each, or counted in a summary line.
    assert sum(r.get("repeated", 1) for r in kept) == sent + 1
    assert len(kept) <= log.refusals_per_window + 1
    assert not list(tmp_path.glob("audit.jsonl.*"))  # nothing even rotated


def test_refusals_beyond_the_window_budget_are_counted_per_caller_and_reason(
        tmp_path: Path) -> None:
    now = [0.0]
    log = JsonlAuditLog(tmp_path / "a.jsonl", refusal_window=10, refusals_per_window=2,
                        refusal_keys=2, clock=lambda: now[0])
    for caller in ["a", "a", "a", "a", "b", "c", "d"]:
        log(event(caller_id=caller, timestamp=now[0]))
    log(event(decision="allowed", reason="ok", caller_id="e"))  # always written
    now[0] = 10.0  # the window is over: the next event writes the counts first
    log(event(caller_id="a", name="later", timestamp=10.0))
    log.close()
    lines = records(tmp_path / "a.jsonl")
    assert [(r["caller_id"], r.get("repeated")) for r in lines] == [
        ("a", None), ("a", None), ("e", None),
        ("a", 2), ("b", 1), ("*", 2),  # two keys kept, the rest under "*"
        ("a", None)]
    assert lines[3]["name"] is None and lines[3]["first_timestamp"] == 0.0
    assert lines[-1]["name"] == "later"


def test_the_default_refusal_budget_is_what_the_docs_state(tmp_path: Path) -> None:
    log = JsonlAuditLog(tmp_path / "a.jsonl")
    try:
        per_window = log.max_refusal_bytes_per_window
        assert (log.refusal_window, log.refusals_per_window, log.refusal_keys) == (10, 20, 16)
        assert MAX_AUDIT_EVENT_BYTES == 16_384 and per_window == 610_944
        assert log.max_bytes is not None
        # The oldest retained record goes once backups * max_bytes more are written.
        hours = log.backups * log.max_bytes / per_window * log.refusal_window / 3600
        assert hours > 2.3  # docs/security.md: "more than 2 hours"
    finally:
        log.close()


@pytest.mark.skipif(not hasattr(__import__("os"), "getuid"), reason="POSIX file modes")
def test_the_files_the_log_creates_are_its_owners_only(tmp_path: Path) -> None:
    """Audit lines hold caller ids and what they asked for: a file the log creates, and
    each one after a rotation, is mode 0600 whatever the umask; one that exists keeps its
    mode (the operator's choice)."""
    import os
    import stat

    previous = os.umask(0o022)
    try:
        path = tmp_path / "audit.jsonl"
        log = JsonlAuditLog(path, max_bytes=100, backups=2)
        for _ in range(3):  # each line after the first passes the bound: a rotation
            log(event(decision="allowed", reason=None))
        log.close()
        rotated = sorted(tmp_path.iterdir())
        assert [p.name for p in rotated] == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
        assert {stat.S_IMODE(p.stat().st_mode) for p in rotated} == {0o600}
        shared = tmp_path / "shared.jsonl"
        shared.touch(mode=0o640)
        shared.chmod(0o640)
        JsonlAuditLog(shared).close()
        assert stat.S_IMODE(shared.stat().st_mode) == 0o640
    finally:
        os.umask(previous)
