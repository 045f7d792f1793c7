"""Helpers for tests that run a server in a subprocess or in this process: free ports,
readiness, clean-up."""

from __future__ import annotations

import asyncio
import fcntl
import os
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

# Generous bounds that only stop a broken test from hanging; never a speed requirement.
STARTUP_TIMEOUT = 60.0
EXIT_TIMEOUT = 30.0
# Ports are picked below Linux's ephemeral range (32768-60999), where the kernel never
# puts the local end of an outgoing connection: between the pick and the server's bind,
# no client of this or any other test can take the port.
PORTS = range(20_000, 32_768)
# A port handed out is leased until the process ends: an exclusive lock on a file named
# after it, which the kernel drops when the process exits however it exits. Every test
# process on the machine (both xdist workers, other checkouts' runs) skips a leased port.
LEASES = Path(tempfile.gettempdir()) / "chainweaver-test-ports"
_held: dict[int, int] = {}  # port -> the descriptor holding its lease


def free_port() -> int:
    """A loopback TCP port nothing listens on, leased to this process until it ends."""
    for port in random.sample(PORTS, len(PORTS)):
        if port not in _held and _bindable(port) and lease(port):
            return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


def lease(port: int) -> bool:
    """Take ``port``'s lease for this process; False when another live process holds it."""
    if port in _held:
        return True
    LEASES.mkdir(mode=0o777, exist_ok=True)
    try:
        descriptor = os.open(LEASES / str(port), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return False
    _held[port] = descriptor
    return True


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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


@asynccontextmanager
async def serving_http(server: Any, **options: Any) -> AsyncIterator[str]:
    """A ``FlowServer`` on streamable HTTP in this process, on a free loopback port, once
    it accepts connections: its endpoint URL (``options`` go to ``serve_async``)."""
    port = free_port()
    task = asyncio.create_task(server.serve_async("streamable-http", port=port, **options))
    try:
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
