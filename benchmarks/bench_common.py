"""What the benchmark scripts share."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"  # loopback only


async def ignore_log(message: object) -> None:
    """A client log handler that drops a run's log message.

    The server still sends it, and that cost is measured; FastMCP's default client
    handler would render it with rich, which is the client's cost, not the server's.
    """


def free_port() -> int:
    """A free TCP port on the loopback address."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def start_server(script: str | Path, kind: str, *options: str
                 ) -> tuple[subprocess.Popen, int]:
    """Run ``script --serve KIND --port N OPTIONS...`` on a free loopback port; return
    the process and port once it accepts connections (within 60 s)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(Path(script).resolve()), "--serve", kind,
                                "--port", str(port), *options],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{kind} server exited with code {process.returncode}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{kind} server did not start")


def stop_servers(processes: dict[str, subprocess.Popen]) -> None:
    """Terminate the server processes, then reap them (killed after 15 s)."""
    for process in processes.values():
        process.terminate()
    for process in processes.values():
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def machine_line() -> str:
    """When and where a benchmark ran, for its report's first line."""
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.machine()}, "
            f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{platform.platform(terse=True)}")


def percentile(values: list[float], fraction: float) -> float:
    """The value at ``fraction`` (0..1) of the sorted values; 0.0 for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def load_test_parser(description: str, per_round: str) -> argparse.ArgumentParser:
    """The options every HTTP load test takes (clients, requests, rounds, eras, a quick
    mode, and the hidden ``--serve``/``--port`` its server subprocess is started with);
    ``per_round`` says what one of ``--requests`` is."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000,
                        help=f"{per_round} per target per round")
    parser.add_argument("--duration", type=float, default=60.0,
                        help="time limit per target per round, seconds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--mode", choices=["auto", "legacy"], default="auto")
    parser.add_argument("--quick", action="store_true", help="a small run, for the tests")
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser


async def drive(url: str, tokens: list[str], clients: int, count: int, seconds: float,
                mode: str, request: Callable[[Any, int], Awaitable[bool]]
                ) -> tuple[list[float], int, float]:
    """``clients`` concurrent clients (client i sends ``tokens[i % len(tokens)]`` as its
    bearer token) sending ``count`` requests in all, at most ``seconds`` long;
    ``request(client, n)`` sends the n-th and says whether it succeeded. Returns
    (latencies in seconds, errors, elapsed seconds)."""
    from fastmcp import Client
    from fastmcp.client.transports import StreamableHttpTransport

    issued = itertools.count()
    latencies: list[float] = []
    errors = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def worker(token: str) -> None:
        nonlocal errors
        transport = StreamableHttpTransport(url, headers={"Authorization": f"Bearer {token}"})
        async with Client(transport, mode=mode, log_handler=ignore_log) as client:
            while time.perf_counter() < deadline:
                n = next(issued)
                if n >= count:
                    return
                sent = time.perf_counter()
                ok = await request(client, n)
                latencies.append(time.perf_counter() - sent)
                errors += not ok

    await asyncio.gather(*(worker(tokens[i % len(tokens)]) for i in range(clients)))
    return latencies, errors, time.perf_counter() - started
