"""The test helpers' ports: each one a process is given is its own while it lives, so
tests running side by side (both xdist workers, another checkout's run) never meet on a
port, and none is in the kernel's ephemeral range, where outgoing connections take
their local ports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.procs import PORTS, STARTUP_TIMEOUT, free_port, lease

TESTS = Path(__file__).resolve().parents[1]


def test_a_process_never_gets_the_same_port_twice() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(port in PORTS and port < 32_768 for port in ports)


# Run in another process: try to lease this process's ports, then take 300 of its own.
OTHER = """
import json, sys
from support.procs import free_port, lease
print(json.dumps([[lease(int(port)) for port in sys.argv[1:]],
                  [free_port() for _ in range(300)]]))
"""


def test_a_port_leased_here_is_never_given_to_another_process() -> None:
    mine = [free_port() for _ in range(20)]
    other = subprocess.run([sys.executable, "-c", OTHER, *map(str, mine)], cwd=TESTS,
                           capture_output=True, text=True, timeout=STARTUP_TIMEOUT)
    assert other.returncode == 0, other.stderr
    refused, theirs = json.loads(other.stdout)
    assert refused == [False] * len(mine)
    assert not set(theirs) & set(mine)
    # That process has ended: its leases ended with it.
    assert all(lease(port) for port in theirs[:5])
