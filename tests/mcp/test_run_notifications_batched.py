"""A run's progress and log events reach the loop in batches (issue 36, item 4): events
a worker thread reports wake the event loop once per batch, not once per event; they
are sent in the order they happened, and every one of them before the call's result."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from fastmcp import Client
from pydantic import BaseModel

from chainweaver import Flow, FlowExecutor, FlowRegistry, FlowStep, Tool, ToolSafetyContract
from chainweaver.mcp import FlowServer
from chainweaver.mcp.runs.reporting import RunReporter
from chainweaver.results import StepRecord


class Sent:
    """What a reporter sends through a request's context: logs and progress, in order."""

    request_id = "1"
    request_context = None  # no progress token of its own: report_progress is used
    is_background_task = False

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.session = self

    async def send_notification(self, notification: Any, related_request_id: Any) -> None:
        self.events.append(("log", notification.params.data["msg"]))

    async def report_progress(self, progress: float, total: float | None,
                              message: str) -> None:
        self.events.append(("progress", progress, total))


@pytest.mark.anyio
async def test_a_worker_threads_events_wake_the_loop_once_and_keep_their_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent = Sent()
    reporter = RunReporter(sent, "flow", progress=True,  # type: ignore[arg-type]
                           levels=frozenset({"info", "warning", "error"}),
                           show_error_type=True)
    loop = asyncio.get_running_loop()
    wake_ups: list[Any] = []
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any) -> Any:
        wake_ups.append(callback)
        return call_soon_threadsafe(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)

    def steps() -> None:
        reporter.run_started("flow", "1.0", 3)
        for index in range(3):
            record = StepRecord(index, f"t{index}", step_id=f"s{index}")
            reporter.step_started(record)
            record.status = "completed"
            reporter.step_finished(record)

    worker = threading.Thread(target=steps)
    worker.start()
    worker.join()  # the loop is held meanwhile: all six events wait for one wake-up
    assert len(wake_ups) == 1
    await reporter.close()
    expected: list[tuple[Any, ...]] = []
    for index in range(3):
        expected += [("log", f"step 's{index}' started"),
                     ("log", f"step 's{index}' completed"), ("progress", index + 1, 3)]
    assert sent.events == expected


PURE = ToolSafetyContract("none")


class Text(BaseModel):
    text: str


def step(model: Text) -> dict:
    return {"text": model.text + "."}


def server(blocking: bool, middle: Tool | None = None) -> FlowServer:
    """Three steps a, b, c of ``dot`` (``middle``: b runs that tool instead)."""
    executor = FlowExecutor(FlowRegistry())
    executor.register_tool(Tool("dot", "Add a dot.", Text, Text, step, PURE,
                                blocking=blocking))
    if middle is not None:
        executor.register_tool(middle)
    executor.registry.register_flow(Flow("dots", "Three dots.", [
        FlowStep("dot", id="a"), FlowStep(middle.name if middle else "dot", id="b"),
        FlowStep("dot", id="c")]))
    return FlowServer(executor)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("blocking", [True, False])
async def test_every_event_arrives_in_order_before_the_result(mode: str,
                                                              blocking: bool) -> None:
    events: list[tuple[Any, ...]] = []

    async def on_log(message: Any) -> None:
        events.append(("log", message.data["msg"]))

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append(("progress", progress))

    async with Client(server(blocking).fastmcp, mode=mode, log_handler=on_log,
                      progress_handler=on_progress) as client:
        if mode == "legacy":
            await client.set_logging_level("debug")
        for _ in range(5):
            events.clear()
            result = await client.call_tool("dots", {"text": "x"})
            events.append(("result", result.structured_content["text"]))
            expected: list[tuple[Any, ...]] = []
            for done, name in enumerate("abc", 1):
                expected += [("log", f"step {name!r} started"),
                             ("log", f"step {name!r} completed"), ("progress", done)]
            assert events == [*expected, ("result", "x...")]


def waiting_server(blocking: bool, seen: Any) -> FlowServer:
    """Step ``b`` finishes only once the client has seen step ``a``'s end: its events
    must go out while the run is still under way (in a worker thread, or awaiting)."""
    if blocking:
        def wait(model: Text) -> dict:
            return {"text": model.text + ("." if seen.wait(10) else "!")}
        return server(True, Tool("wait", "Wait for the client.", Text, Text, wait, PURE))

    async def wait_async(model: Text) -> dict:
        try:
            await asyncio.wait_for(seen.wait(), 10)
        except TimeoutError:
            return {"text": model.text + "!"}
        return {"text": model.text + "."}
    return server(True, Tool("wait", "Wait for the client.", Text, Text, wait_async, PURE))


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("blocking", [True, False])
async def test_events_go_out_while_a_later_step_still_runs(mode: str, blocking: bool) -> None:
    seen: Any = threading.Event() if blocking else asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if progress == 1:
            seen.set()

    async with Client(waiting_server(blocking, seen).fastmcp, mode=mode,
                      progress_handler=on_progress) as client:
        result = await client.call_tool("dots", {"text": "x"})
    assert result.structured_content == {"text": "x..."}  # "!": step a's end never came


@pytest.mark.anyio
async def test_a_run_that_never_yields_starts_no_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    send_all = RunReporter._send_all

    def counted(self: RunReporter) -> Any:
        started.append(self)
        return send_all(self)

    monkeypatch.setattr(RunReporter, "_send_all", counted)
    events: list[Any] = []

    async def on_log(message: Any) -> None:
        events.append(message.data["msg"])

    async with Client(server(blocking=False).fastmcp, log_handler=on_log) as client:
        await client.call_tool("dots", {"text": "x"})
        assert len(events) == 6 and not started  # sent by close(), in order
        async with Client(server(blocking=True).fastmcp, log_handler=on_log) as other:
            await other.call_tool("dots", {"text": "x"})
        # The thread hop lets the loop turn: at most one sender for the run (none when
        # the hop ended before its events were handed over, and close() sent them).
        assert len(events) == 12 and len(started) <= 1
