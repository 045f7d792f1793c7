"""Helpers for the shared-governance tests: a Redis that can be stopped and started
again on the same port with its data (``SHUTDOWN SAVE``, then the same directory), and
reading what processes applied from the shared heartbeats."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from support.procs import STARTUP_TIMEOUT, free_port, stop


class RestartableRedis:
    """A private ``redis-server`` on 127.0.0.1 whose data survives a stop and start."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="cw-redis-gov-"))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--dbfilename", "dump.rdb"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if self.command(b"PING").startswith(b"+PONG"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def command(self, *words: bytes) -> bytes:
        """One inline command; b'' when nothing answers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
                conn.sendall(b" ".join(words) + b"\r\n")
                return conn.recv(4096)
        except OSError:
            return b""

    def stop(self) -> None:
        """Save the data and stop (connections are cut, as in a real outage)."""
        if self.process is None:
            return
        self.command(b"SHUTDOWN", b"SAVE")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stop(self.process)
        self.process = None

    def close(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)
