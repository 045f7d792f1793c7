"""``chainweaver worker PATH... --tools MODULE --tasks redis://...``: run the flows of
background tasks that server replicas put on a shared Redis queue (docs/tasks.md).

A worker loads tools and flow files and takes the options ``serve`` takes, but serves
no MCP transport: it runs tasks until interrupted (Ctrl-C or SIGTERM: it finishes
the runs it holds first), logging each one on stderr.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from .building import build_server, loading_errors
from .errors import EXIT_OK, EXIT_USAGE, CommandError, redacted
from .options import http_defaults, server_options
from .output import PROG
from .stores import check_stores, name_queue_outages


def add_parser(subparsers: Any) -> None:
    subparsers.add_parser(
        "worker", parents=[server_options()],
        help="run flows for background tasks (needs --tasks)",
        description="Run the flows of background tasks that any server replica on the same "
                    "Redis queue (--tasks redis://...) created. Loads flows and tools as "
                    "serve does; serves no MCP transport.")


def run(args: argparse.Namespace) -> int:
    http_defaults(args)
    _check_worker(args)
    with loading_errors():
        built = build_server(args)
    check_stores(args)
    name_queue_outages(args.tasks)
    summary = [*built.report(), f"{PROG}: running task flows from {redacted(args.tasks)}"]
    print("\n".join(summary), file=sys.stderr, flush=True)
    return run_worker(built.server, args)


def _check_worker(args: argparse.Namespace) -> None:
    """Refuse a worker that could not work, before anything is loaded or printed."""
    if not args.tasks or args.tasks.startswith("memory://"):
        raise CommandError(EXIT_USAGE, "worker needs --tasks redis://HOST:PORT/DB: a worker "
                           "runs tasks that server replicas put on a shared Redis queue")
    if args.watch:
        # A worker serves no clients and keeps the flows it loaded: restart workers to
        # pick up edited flow files (docs/tasks.md).
        raise CommandError(EXIT_USAGE, "worker does not take --watch: restart workers "
                           "after editing flow files")


def run_worker(server: Any, args: argparse.Namespace) -> int:
    """Run task flows until interrupted, logging each task it picks up, resumes and ends
    to stderr (``--log-level``, INFO by default)."""
    worker_log = logging.getLogger("chainweaver.worker")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    worker_log.addHandler(handler)
    worker_log.setLevel((args.log_level or "info").upper())
    previous = signal.signal(signal.SIGTERM, _stop_as_on_ctrl_c)
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        # Started with Ctrl-C ignored (a script's background job): the event loop puts
        # its graceful Ctrl-C handler, which SIGTERM stops the worker with, only over
        # the default one; without it a SIGTERM would abandon the runs under way.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Imported here: the command module loads on a core-only install too (the mcp
    # extra, which brings anyio, is needed once a server was built).
    import anyio

    try:
        anyio.run(_working, server, ignored)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    return EXIT_OK


async def _working(server: Any, ctrl_c_ignored: bool) -> None:
    """``server.run_worker()``, on the loop whose graceful Ctrl-C handler SIGTERM uses.
    Started with Ctrl-C ignored, the worker keeps ignoring it (the shell asked for a
    background job a terminal's Ctrl-C does not reach); SIGTERM keeps the handler."""
    if ctrl_c_ignored:
        graceful = signal.signal(signal.SIGINT, signal.SIG_IGN)
        if callable(graceful):
            signal.signal(signal.SIGTERM, lambda signum, frame: graceful(signal.SIGINT, frame))
    await server.run_worker_async()


def _stop_as_on_ctrl_c(signum: int, frame: Any) -> None:
    """SIGTERM, which service and container managers stop a process with, does what
    Ctrl-C does: the worker finishes the runs it holds and exits with 0, instead of
    dying mid-run and leaving its tasks to wait for redelivery."""
    on_ctrl_c = signal.getsignal(signal.SIGINT)
    if callable(on_ctrl_c):  # the event loop's own handler: it stops the worker cleanly
        on_ctrl_c(signal.SIGINT, frame)
    else:  # no handler of the loop to call (see _working): stop anyway
        raise KeyboardInterrupt
