"""Under a file watcher, an edit the server refuses to publish changes nothing that
serves: the last good version keeps answering, marked stale with the reason, and a
fixed edit then goes live (issue 22, item 4)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from chainweaver import (
    DefinitionError,
    Flow,
    FlowExecutor,
    FlowPrompt,
    FlowRegistry,
    FlowStep,
    ToolSafetyContract,
    tool,
)
from chainweaver.mcp import FlowServer
from chainweaver.prompts import PromptMessage
from chainweaver.watch import FlowFileWatcher

pytestmark = pytest.mark.anyio


@tool(safety=ToolSafetyContract("read"))
def echo(text: str) -> dict:
    """Echo."""
    return {"text": text}


_clock = iter(range(time.time_ns(), 2**63, 10**9))


def write(path: Path, *, version: str, prompt: str | None = None) -> None:
    data: dict[str, Any] = {
        "name": "shop", "version": version, "description": f"shop {version}",
        "governance": {"lifecycle": "active"}, "steps": [{"tool": "echo"}]}
    if prompt is not None:
        data["prompts"] = [{"name": prompt, "messages": [{"role": "user", "text": "Hi."}]}]
    path.write_text(json.dumps(data))
    stamp = next(_clock)  # a later modification time each write, whatever the fs
    os.utime(path, ns=(stamp, stamp))


def serving(tmp_path: Path) -> tuple[FlowServer, FlowFileWatcher, Path]:
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(echo)
    # Publishes the prompt "shop__deals__summary".
    executor.registry.register_flow(Flow(
        "shop__deals", "Deals.", [FlowStep("echo")],
        prompts=[FlowPrompt("summary", messages=[PromptMessage("user", "Sum up.")])]))
    path = tmp_path / "shop.flow.json"
    write(path, version="1.0.0")
    server = FlowServer(executor, expose_prompts=True)
    watcher = FlowFileWatcher(executor.registry, tmp_path, tools=executor.tools,
                              interval=3600)  # polled by hand below
    server.watch(watcher)
    assert watcher.check() is True
    return server, watcher, path


async def test_a_refused_edit_leaves_the_last_good_version_serving(tmp_path: Path) -> None:
    server, watcher, path = serving(tmp_path)
    try:
        # The edit loads, but its prompt "shop__deals__summary" is another flow's.
        write(path, version="2.0.0", prompt="deals__summary")
        assert watcher.check() is False
        registry = server.executor.registry
        assert registry.versions("shop") == ["1.0.0"]
        report = {entry.flow_name: entry for entry in server.exposure_report()}
        assert report["shop"].exposed and report["shop"].version == "1.0.0"
        assert "collides" in (report["shop"].stale or "")
        assert str(path) in watcher.stale
        async with Client(server.fastmcp) as client:
            result = await client.call_tool("shop", {"text": "still here"})
            assert not result.is_error
            assert json.loads(result.content[0].text) == {"text": "still here"}  # type: ignore[union-attr]
            assert "shop" in {t.name for t in await client.list_tools()}
        # Nothing else changing does not clear the mark: the edit is still not served.
        assert watcher.check() is False
        assert server.exposure_report() == list(report.values())
        # The fixed edit goes live.
        write(path, version="2.0.0", prompt="deals_summary")
        assert watcher.check() is True
        assert registry.versions("shop") == ["2.0.0"]
        report = {entry.flow_name: entry for entry in server.exposure_report()}
        assert report["shop"].version == "2.0.0" and report["shop"].stale is None
        assert watcher.stale == {}
        async with Client(server.fastmcp) as client:
            prompts = {p.name for p in await client.list_prompts()}
            assert {"shop__deals_summary", "shop__deals__summary"} <= prompts
    finally:
        server.close()


async def test_a_refused_edit_is_retried_with_the_next_reload(tmp_path: Path) -> None:
    server, watcher, path = serving(tmp_path)
    try:
        write(path, version="2.0.0", prompt="deals__summary")
        assert watcher.check() is False
        # The flow it collided with goes away; another file's edit triggers a reload,
        # and the refused edit is tried again with it.
        server.executor.registry.unregister("shop__deals")
        other = tmp_path / "other.flow.json"
        other.write_text(json.dumps({"name": "other", "description": "Other.",
                                     "steps": [{"tool": "echo"}]}))
        assert watcher.check() is True
        assert server.executor.registry.versions("shop") == ["2.0.0"]
        assert "other" in server.executor.registry and watcher.stale == {}
    finally:
        server.close()


def test_an_edit_taking_a_registered_name_and_version_is_refused_first(
        tmp_path: Path) -> None:
    server, watcher, path = serving(tmp_path)
    try:
        registry = server.executor.registry
        registry.register_flow(Flow("taken", "Taken.", [FlowStep("echo")]))
        path.write_text(json.dumps({"name": "taken", "description": "Mine.",
                                    "steps": [{"tool": "echo"}]}))
        os.utime(path, ns=(next(_clock),) * 2)
        changes: list[Any] = []
        registry.subscribe(changes.append)
        assert watcher.check() is False
        assert changes == []  # refused before anything was unregistered
        assert "already registered" in watcher.stale[str(path)]
        assert registry.versions("shop") == ["1.0.0"]
    finally:
        server.close()


def test_a_registration_refused_after_vetting_restores_the_last_good_version(
        tmp_path: Path) -> None:
    server, watcher, path = serving(tmp_path)
    try:
        registry = server.executor.registry

        def refuse_v2(change: Any) -> None:  # e.g. another server on this registry
            if change.kind == "registered" and change.version == "2.0.0":
                raise DefinitionError("refused by another listener")

        registry.subscribe(refuse_v2)
        write(path, version="2.0.0")
        assert watcher.check() is True  # the old one left and came back
        assert registry.versions("shop") == ["1.0.0"]
        assert watcher.stale_flows() == {"shop": "refused by another listener"}
    finally:
        server.close()
