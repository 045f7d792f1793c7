"""Tools for the three-step flows in this directory: the MCP conformance suite's
progress and logging scenarios, an approval flow and a flow that hangs (cancellation).

    chainweaver serve tests/servers/runs --tools tests/servers/runs/run_tools.py \
        --side-effects none,read,write --approval elicit
"""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel

from chainweaver import ToolSafetyContract, tool

READ = ToolSafetyContract("read")
PAYMENT = ToolSafetyContract("write", requires_approval=True, approval_reason="charges a card")
DELAY = 0.05  # the conformance scenarios ask for ~50 ms between notifications


class Work(BaseModel):
    stage: int = 0


@tool(safety=READ)
def load(work: Work) -> Work:
    """Step 1: load the data."""
    time.sleep(DELAY)
    return Work(stage=1)


@tool(safety=READ)
async def process(work: Work) -> Work:
    """Step 2: process it."""
    await asyncio.sleep(DELAY)
    return Work(stage=work.stage + 1)


@tool(safety=READ)
def finish(work: Work) -> Work:
    """Step 3: finish."""
    return Work(stage=work.stage + 1)


@tool(safety=PAYMENT)
def charge(work: Work) -> Work:
    """Charge the card (needs the user's approval). Prints a marker on stderr."""
    import sys

    print(f"CHARGED stage={work.stage}", file=sys.stderr, flush=True)
    return Work(stage=work.stage + 1)


@tool(safety=READ)
async def wait_long(work: Work) -> Work:
    """Hangs until cancelled."""
    import sys

    print("WAITING", file=sys.stderr, flush=True)
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        print("CANCELLED", file=sys.stderr, flush=True)
        raise
    return work
