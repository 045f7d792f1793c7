"""FlowFileWatcher: flow file edits reach the registry; a bad edit changes nothing."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from chainweaver import (
    DefinitionError,
    FlowExecutor,
    FlowLifecycle,
    FlowRegistry,
    RegistryChange,
    tool,
)
from chainweaver.files import load_flows_by_file
from chainweaver.watch import FlowFileWatcher


@tool
def echo(text: str) -> dict:
    """Echo."""
    return {"text": text}


def flow_file(directory: Path, name: str, *, version: str = "1.0.0",
              lifecycle: str = "active", step: str = "echo") -> Path:
    path = directory / f"{name}.flow.json"
    path.write_text(json.dumps({
        "name": name, "version": version, "description": f"{name} {version}",
        "governance": {"lifecycle": lifecycle}, "steps": [{"tool": step}]}))
    touch(path)
    return path


# Every write gets a later modification time, one second apart, so an edit is seen
# even on file systems with coarse timestamps.
_clock = iter(range(time.time_ns(), 2**63, 10**9))


def touch(path: Path) -> None:
    stamp = next(_clock)
    os.utime(path, ns=(stamp, stamp))


@pytest.fixture
def executor() -> FlowExecutor:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    return executor


def test_edits_additions_and_removals_reach_the_registry(
        tmp_path: Path, executor: FlowExecutor) -> None:
    registry = executor.registry
    first = flow_file(tmp_path, "alpha")
    watcher = FlowFileWatcher(registry, tmp_path, tools=executor.tools, interval=0.1)
    assert watcher.check() is True  # nothing adopted: the first poll registers
    assert registry.versions("alpha") == ["1.0.0"]
    assert watcher.check() is False  # nothing changed
    flow_file(tmp_path, "alpha", version="1.1.0", lifecycle="archived")
    flow_file(tmp_path, "beta")
    assert watcher.check() is True
    assert registry.versions("alpha") == ["1.1.0"]
    assert registry.get_flow("alpha").governance.lifecycle is FlowLifecycle.ARCHIVED
    assert registry.versions("beta") == ["1.0.0"]
    first.unlink()
    assert watcher.check() is True
    assert "alpha" not in registry and "beta" in registry


def test_a_bad_edit_keeps_the_last_good_flows_and_names_the_file(
        tmp_path: Path, executor: FlowExecutor, caplog: pytest.LogCaptureFixture) -> None:
    registry = executor.registry
    good = flow_file(tmp_path, "alpha")
    other = flow_file(tmp_path, "beta")
    loaded = load_flows_by_file(tmp_path, tools=executor.tools)
    for flow in loaded.values():
        registry.register_flow(flow)
    watcher = FlowFileWatcher(registry, tmp_path, tools=executor.tools, loaded=loaded)
    assert watcher.check() is False  # adopted: nothing to do
    before = registry.state()
    good.write_text('{"name": "alpha",\n "version": }')
    touch(good)
    flow_file(tmp_path, "beta", version="2.0.0")  # a good edit in the same poll waits
    with caplog.at_level(logging.ERROR, logger="chainweaver.watch"):
        assert watcher.check() is False
    assert registry.state() is before
    assert set(watcher.stale) == {str(good), str(other)}
    assert "line 2" in watcher.stale[str(good)]
    assert watcher.stale_flows().keys() == {"alpha", "beta"}
    assert str(good) in caplog.text and "last good flows keep serving" in caplog.text
    # A step naming an unknown tool is as bad, and named by field.
    flow_file(tmp_path, "alpha", step="nope")
    assert watcher.check() is False
    assert "steps[0].tool" in watcher.stale[str(good)]
    flow_file(tmp_path, "alpha", version="1.0.1")  # fixed: both edits go live
    assert watcher.check() is True
    assert watcher.stale == {} and watcher.stale_flows() == {}
    assert registry.versions("alpha") == ["1.0.1"] and registry.versions("beta") == ["2.0.0"]


def test_a_version_past_pythons_digit_limit_is_a_bad_edit_like_any_other(
        tmp_path: Path, executor: FlowExecutor, caplog: pytest.LogCaptureFixture) -> None:
    # int() refuses more than 4300 digits: once a ValueError escaped check(), which then
    # marked nothing stale and never looked at the files again.
    registry = executor.registry
    good = flow_file(tmp_path, "alpha")
    other = flow_file(tmp_path, "beta")
    watcher = FlowFileWatcher(registry, tmp_path, tools=executor.tools)
    assert watcher.check() is True
    before = registry.state()
    flow_file(tmp_path, "alpha", version="1." + "9" * 5000 + ".0")
    flow_file(tmp_path, "beta", version="2.0.0")  # a good edit in the same poll waits
    with caplog.at_level(logging.ERROR, logger="chainweaver.watch"):
        assert watcher.check() is False
    assert registry.state() is before
    assert set(watcher.stale) == {str(good), str(other)}
    assert watcher.stale[str(good)].startswith(f"{good}: version: version '1.999")
    assert "at most 256 are allowed" in watcher.stale[str(good)]
    assert watcher.stale_flows().keys() == {"alpha", "beta"}
    assert str(good) in caplog.text and not [r for r in caplog.records if r.exc_info]
    flow_file(tmp_path, "alpha", version="1.0.1")  # fixed: both edits go live
    assert watcher.check() is True
    assert watcher.stale == {}
    assert registry.versions("alpha") == ["1.0.1"] and registry.versions("beta") == ["2.0.0"]


def test_an_unexpected_loader_failure_still_marks_the_edit_stale(
        tmp_path: Path, executor: FlowExecutor, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    registry = executor.registry
    path = flow_file(tmp_path, "alpha")
    watcher = FlowFileWatcher(registry, tmp_path, tools=executor.tools)
    assert watcher.check() is True

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("loader bug")

    monkeypatch.setattr("chainweaver.watch.load_flows_by_file", broken)
    flow_file(tmp_path, "alpha", version="1.1.0")
    with caplog.at_level(logging.ERROR, logger="chainweaver.watch"):
        assert watcher.check() is False  # reported, never raised
    assert watcher.stale == {str(path): "cannot be loaded: RuntimeError: loader bug"}
    assert registry.versions("alpha") == ["1.0.0"]
    assert any(r.exc_info for r in caplog.records)  # a bug: its traceback is logged
    monkeypatch.undo()
    flow_file(tmp_path, "alpha", version="1.2.0")
    assert watcher.check() is True and registry.versions("alpha") == ["1.2.0"]


def test_a_missing_path_keeps_everything(tmp_path: Path, executor: FlowExecutor) -> None:
    directory = tmp_path / "flows"
    directory.mkdir()
    flow_file(directory, "alpha")
    watcher = FlowFileWatcher(executor.registry, [directory], tools=executor.tools)
    watcher.check()
    (directory / "alpha.flow.json").unlink()
    assert watcher.check() is False  # an empty directory is an error, not "remove all"
    assert "alpha" in executor.registry and str(directory) in watcher.stale


def test_a_refused_registration_is_stale(tmp_path: Path, executor: FlowExecutor) -> None:
    registry = executor.registry

    def refuse_beta(change: RegistryChange) -> None:
        if "beta" in registry:
            raise DefinitionError("refused")

    registry.subscribe(refuse_beta)
    flow_file(tmp_path, "alpha")
    flow_file(tmp_path, "beta")
    watcher = FlowFileWatcher(registry, tmp_path, tools=executor.tools)
    assert watcher.check() is True
    assert "alpha" in registry and "beta" not in registry
    assert watcher.stale == {str(tmp_path / "beta.flow.json"): "refused"}


def test_the_thread_polls_until_stopped(tmp_path: Path, executor: FlowExecutor) -> None:
    flow_file(tmp_path, "alpha")
    watcher = FlowFileWatcher(executor.registry, tmp_path, tools=executor.tools,
                              interval=0.01)
    watcher.start()
    try:
        for _ in range(500):  # bounded: 5 s at most
            if "alpha" in executor.registry:
                break
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert "alpha" in executor.registry
    with pytest.raises(ValueError, match="interval"):
        FlowFileWatcher(executor.registry, tmp_path, interval=0)
