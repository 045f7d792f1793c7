"""What serving does to the process: freezing the heap once a server is built, and
keeping stray printed text off the stdio channel."""

from __future__ import annotations

import gc
import os
import sys


def freeze_gc() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach.

    Done here, at the end of construction, because this is the one point every way
    of running the server passes (``serve``, ``serve_async``, an in-memory client,
    mounting). What is alive is mostly long-lived: the catalogue, the exposure
    snapshot, the executor. A large list creates enough objects to trigger full
    collections, and each one walked all of that again: frozen, it is skipped.
    The cost: cyclic garbage among frozen objects is never freed. Collect first, so
    no garbage is frozen; components built later (on first use) are not frozen.
    """
    gc.collect()
    gc.freeze()


def flush_stray_stdout() -> None:
    """Send text still buffered in ``sys.stdout`` (a tool's ``print``) to stderr.

    While it serves, mcp's stdio transport points fd 1 at stderr, so printed text
    cannot reach the client; when it stops it points fd 1 back at the MCP channel,
    where anything the buffer still held would land at interpreter exit.
    """
    stream = sys.stdout
    try:
        if stream is None or stream.fileno() != 1:
            return
        channel = os.dup(1)
    except (OSError, ValueError):
        return
    try:
        os.dup2(2, 1)
        stream.flush()
    except (OSError, ValueError):
        pass
    finally:
        os.dup2(channel, 1)
        os.close(channel)
