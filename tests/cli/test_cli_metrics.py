"""`chainweaver serve --metrics-port`: a real server over streamable HTTP, called by a
real client, scraped by HTTP as Prometheus would; the duration histograms have buckets
that resolve this server's latencies (sub-millisecond to minutes) in seconds."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from support.procs import STARTUP_TIMEOUT, free_port, stop, wait_until_listening

ROOT = Path(__file__).resolve().parents[2]
CHAINWEAVER = str(Path(sys.executable).parent / "chainweaver")
CALLS = 5


def buckets(body: str, metric: str, labels: str) -> dict[float, int]:
    """The cumulative counts of one histogram series, by upper bound (+Inf as inf)."""
    found = {}
    pattern = re.compile(rf'^{metric}_bucket\{{{re.escape(labels)},le="([^"]+)"\}} (\d+)$',
                         re.MULTILINE)
    for bound, count in pattern.findall(body):
        found[float(bound)] = int(count)
    return found


@pytest.mark.anyio
async def test_duration_buckets_resolve_sub_millisecond_to_minutes_in_a_scrape(
    tmp_path: Path,
) -> None:
    port, metrics_port = free_port(), free_port()
    with open(tmp_path / "server.log", "w") as log:
        process = subprocess.Popen(
            [CHAINWEAVER, "serve", "examples/flows", "--tools", "examples/flow_tools.py",
             "--transport", "streamable-http", "--port", str(port),
             "--metrics-port", str(metrics_port)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_listening(process, port)
            wait_until_listening(process, metrics_port)
            url = f"http://127.0.0.1:{port}/mcp"
            async with Client(StreamableHttpTransport(url)) as client:
                for _ in range(CALLS):
                    await client.call_tool("help_search", {"query": "refund"})
            scrape = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(scrape, timeout=STARTUP_TIMEOUT) as response:
                body = response.read().decode()
        finally:
            stop(process)
    tool = 'kind="tool",outcome="ok",name="help_search"'
    requests = buckets(body, "chainweaver_request_duration_seconds", tool)
    runs = buckets(body, "chainweaver_run_duration_seconds",
                   'tool="help_search",status="completed"')
    assert sorted(requests) == sorted(runs)
    bounds = sorted(requests)
    assert bounds[-1] == float("inf")
    for histogram in (requests, runs):
        assert histogram[float("inf")] == CALLS
    # Sub-millisecond resolution, buckets of a few seconds, and minutes at the top.
    assert bounds[0] <= 0.0001 and bounds[-2] >= 3600
    assert len([b for b in bounds if b < 1]) >= 10
    assert len([b for b in bounds if 1 <= b <= 300]) >= 6
    # Calls of an in-memory flow on loopback take far less than a minute: they are told
    # apart from slow ones instead of all sharing a first bucket of 0 to 5 s.
    assert requests[60.0] == CALLS and runs[60.0] == CALLS
    from chainweaver.mcp.runs.metrics import DURATION_BUCKETS  # what docs/mcp-server.md lists

    assert bounds[:-1] == list(DURATION_BUCKETS)
