"""Helpers for tests that run a server in a subprocess: free ports, readiness, clean-up."""

from __future__ import annotations

import socket
import subprocess
import time

# Generous bounds that only stop a broken test from hanging; never a speed requirement.
STARTUP_TIMEOUT = 60.0
EXIT_TIMEOUT = 30.0


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_listening(process: subprocess.Popen, port: int) -> None:
    """Block until ``process`` accepts connections on ``port``; fail if it exits first."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early with code {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on port {port}")


def stop(process: subprocess.Popen) -> None:
    """Kill a server process we started, and reap it."""
    if process.poll() is None:
        process.kill()
    process.wait(timeout=EXIT_TIMEOUT)
