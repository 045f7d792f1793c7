"""`chainweaver run` shows each step on stderr as it starts and ends, while the flow runs:
plain lines into a pipe, one line rewritten in place on a terminal, nothing with
`--no-progress` (or with `--json` without a terminal)."""

from __future__ import annotations

import json
import os
import pty
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.cli import run
from support.procs import STARTUP_TIMEOUT

pytestmark = pytest.mark.usefixtures("in_repository")

CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")
FLOWS = "examples/flows"
TOOLS = "examples/flow_tools.py"
ORDER = ["run", "order_status", FLOWS, "--tools", TOOLS, "--input", '{"order_id": "A-1001"}']

# The second step waits (at most 60 s) for a file the test writes once it has seen,
# on stderr, that the first step ended and the second started.
GATED_TOOLS = '''\
import time
from pathlib import Path

from chainweaver import ToolSafetyContract, tool

GO = Path(__file__).with_name("go")


@tool(safety=ToolSafetyContract("none"))
def prepare(order_id: str) -> dict:
    """Prepare."""
    return {"prepared": order_id}


@tool(safety=ToolSafetyContract("none"))
def wait_for_go(prepared: str) -> dict:
    """Wait until the test says go."""
    deadline = time.monotonic() + 60
    while not GO.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"done": GO.exists()}
'''
GATED_FLOW = {"name": "gated", "description": "Two steps.", "steps": ["prepare", "wait_for_go"]}


def lines_of(stream: object, into: queue.Queue) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.rstrip("\n"))
    into.put(None)


def test_each_step_is_shown_as_it_starts_and_ends_while_the_flow_runs(tmp_path: Path
                                                                      ) -> None:
    (tmp_path / "gated_tools.py").write_text(GATED_TOOLS)
    (tmp_path / "gated.flow.json").write_text(json.dumps(GATED_FLOW))
    process = subprocess.Popen(
        [CHAINWEAVER, "run", "gated", str(tmp_path / "gated.flow.json"), "--tools",
         str(tmp_path / "gated_tools.py"), "--input", '{"order_id": "A-1"}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: queue.Queue = queue.Queue()
    threading.Thread(target=lines_of, args=(process.stderr, seen), daemon=True).start()
    before_go = []
    deadline = time.monotonic() + STARTUP_TIMEOUT
    try:
        while time.monotonic() < deadline:
            try:
                line = seen.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            before_go.append(line)
            if line == "chainweaver: step 2/2 wait_for_go: started":
                break
    finally:
        (tmp_path / "go").write_text("")  # the flow ends either way
        out = process.stdout.read()  # type: ignore[union-attr]  (stderr: the thread's)
        process.wait(timeout=STARTUP_TIMEOUT)
    # Printed while the second step was still waiting, in order.
    assert [line.split(" in ")[0] for line in before_go] == [
        "chainweaver: running flow gated 1.0.0: 2 step(s)",
        "chainweaver: step 1/2 prepare: started",
        "chainweaver: step 1/2 prepare: completed",
        "chainweaver: step 2/2 wait_for_go: started"]
    assert process.returncode == 0
    assert json.loads(out) == {"done": True}
    rest = []
    while (line := seen.get(timeout=STARTUP_TIMEOUT)) is not None:
        rest.append(line)
    assert rest[0].startswith("chainweaver: step 2/2 wait_for_go: completed in "), rest
    assert rest[1].startswith("STEP ")  # then the step table, as before


def test_a_failing_step_is_shown_failed_with_its_error_type(capsys: pytest.CaptureFixture
                                                            ) -> None:
    code, _, err = run(capsys, "run", "order_status", FLOWS, "--tools", TOOLS,
                       "--input", '{"order_id": "A-1009"}')
    assert code == 1
    progress = [line for line in err.splitlines() if line.startswith("chainweaver: step")]
    assert progress[0] == "chainweaver: step 1/3 find_order: started"
    assert progress[1].startswith("chainweaver: step 1/3 find_order: failed in ")
    assert progress[1].endswith(" (LookupError)")
    assert len(progress) == 2  # the steps after it never started


@pytest.mark.parametrize("flags", [["--no-progress"], ["--json"]])
def test_no_progress_lines_when_asked_or_for_json_into_a_pipe(
    capsys: pytest.CaptureFixture, flags: list[str],
) -> None:
    code, _, err = run(capsys, *ORDER, *flags)
    assert code == 0
    assert "chainweaver: step" not in err


def test_on_a_terminal_the_running_step_is_one_line_rewritten_in_place() -> None:
    main_fd, terminal_fd = pty.openpty()
    try:
        process = subprocess.Popen([CHAINWEAVER, *ORDER], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=terminal_fd)
        os.close(terminal_fd)
        written = b""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main_fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(main_fd, 4096)
                except OSError:  # the process closed the terminal
                    break
                if not chunk:
                    break
                written += chunk
            elif process.poll() is not None:
                break
        process.communicate(timeout=STARTUP_TIMEOUT)
    finally:
        os.close(main_fd)
    text = written.decode().replace("\r\n", "\n")
    assert process.returncode == 0
    assert ("chainweaver: step 1/3 find_order: running\r\x1b[Kchainweaver: step 1/3 "
            "find_order: completed in ") in text
    assert "find_order: started" not in text
