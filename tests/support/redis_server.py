"""A private, throwaway Redis server on a random loopback port, for the Redis tests.

Real Redis (Debian's ``redis-server``, which ``.ci/run`` installs), never a mock:
no persistence, bound to 127.0.0.1, killed when the test session ends.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from support.procs import STARTUP_TIMEOUT, free_port, stop


@contextmanager
def redis_server() -> Iterator[str]:
    """Start ``redis-server`` and yield its URL (``redis://127.0.0.1:PORT/0``)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="cw-redis-") as workdir:
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_pong(process, port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop(process)


def _wait_for_pong(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited early with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not answer on port {port}")
