"""``chainweaver runs``: the run history an operator reads (list, show; filter by flow,
status and caller; ``--json`` for scripts), and ``serve``'s run-history flags."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

import anyio

from .cli_errors import EXIT_OK, EXIT_USAGE, CommandError

EXIT_NOT_FOUND = 1  # show: no such run (unknown, another prefix, or expired)
EXIT_STORE = 3  # the store could not be reached or read
FOREVER = 100 * 365 * 86400.0
STATUSES = ("running", "waiting_approval", "completed", "failed", "cancelled")


def add_run_history_options(parser: argparse.ArgumentParser) -> None:
    """``serve``'s flags for ``ServingConfig(run_history=RunHistory(...))``."""
    group = parser.add_argument_group("run history (docs/run-history.md)")
    group.add_argument("--run-history", metavar="URL",
                       help="keep a record of every run: memory:// or redis://... (replicas "
                            "share it); runs readable as chainweaver://runs/... resources")
    group.add_argument("--run-history-max-runs", type=int, metavar="N",
                       help="keep at most N runs (default: 10000; memory: the caller "
                            "holding the most gives up its oldest)")
    group.add_argument("--run-history-max-age", type=float, metavar="SECONDS",
                       help="forget runs older than this (default: 604800, 7 days)")
    group.add_argument("--output-limit", type=int, metavar="BYTES",
                       help="larger outputs travel as a resource link (default: 65536)")


HISTORY_FLAGS = (("--run-history-max-runs", "run_history_max_runs", "max_runs"),
                 ("--run-history-max-age", "run_history_max_age", "max_age"),
                 ("--output-limit", "output_limit", "output_limit"))


def run_history_settings(args: argparse.Namespace) -> Any:
    """The ``RunHistory`` the flags ask for (None: no --run-history). A bound without
    --run-history is refused: without a history, runs keep no record and outputs are
    sent whole."""
    given = {field: getattr(args, name) for _, name, field in HISTORY_FLAGS
             if getattr(args, name, None) is not None}
    url = getattr(args, "run_history", None)
    if url is None:
        if given:
            flags = [flag for flag, name, _ in HISTORY_FLAGS
                     if getattr(args, name, None) is not None]
            raise CommandError(EXIT_USAGE, f"{', '.join(flags)} need"
                               f"{'s' if len(flags) == 1 else ''} --run-history URL")
        return None
    from .mcp.config import RunHistory

    return RunHistory(store=url, **given)


def add_runs_command(commands: Any) -> None:
    """``chainweaver runs list|show``."""
    runs = commands.add_parser(
        "runs", help="read the run history servers keep (--run-history redis://...)",
        description="List or show the runs that servers started with --run-history "
                    "recorded (never argument or output values). Exit codes: 0 success, "
                    "1 no such run (show), 2 a malformed command line, 3 the store "
                    "could not be read.")
    actions = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="runs, newest first")
    show = actions.add_parser("show", help="one run's record")
    show.add_argument("run_id", metavar="RUN_ID")
    for parser in (listing, show):
        parser.add_argument("--store", required=True, metavar="URL",
                            help="the servers' --run-history URL (redis://...)")
        parser.add_argument("--prefix", default="chainweaver:runs",
                            help="the Redis key prefix (default: chainweaver:runs)")
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.add_argument("--flow", help="only runs of this flow")
    listing.add_argument("--status", choices=STATUSES, help="only runs in this status")
    listing.add_argument("--caller", help="only runs this caller started (its gate id)")
    listing.add_argument("--limit", type=int, default=50, help="at most N runs (default: 50)")
    listing.add_argument("--cursor", help="continue after the page that printed it")


def runs_command(args: argparse.Namespace) -> int:
    if not args.store.startswith(("redis://", "rediss://")):
        raise CommandError(EXIT_USAGE, "--store must be a redis:// URL: a memory:// history lives "
                              "only inside its server")
    if args.runs_command == "list":
        _check_list(args)
    from .mcp.runs.records import RunStoreError
    from .mcp.runs.redis_records import masked

    try:
        store = _store(args)
    except ValueError as error:  # a URL redis-py cannot read
        raise CommandError(EXIT_USAGE, f"--store: {error}") from None
    # The store logs a failure for servers' operators; here the one line below says it.
    logging.getLogger("chainweaver.mcp.runs").addHandler(logging.NullHandler())
    try:
        return anyio.run(_show if args.runs_command == "show" else _list, args, store)
    except RunStoreError as error:
        raise CommandError(EXIT_STORE, f"cannot read the run history at "
                           f"{masked(args.store)}: {error.reason}") from None


def _check_list(args: argparse.Namespace) -> None:
    from .mcp.runs.records import parse_cursor

    if args.limit < 1:
        raise CommandError(EXIT_USAGE, "--limit must be at least 1")
    if args.cursor is not None:
        try:
            parse_cursor(args.cursor)
        except ValueError:
            raise CommandError(EXIT_USAGE, f"--cursor {args.cursor!r} is not one a page "
                               "printed") from None


def _store(args: argparse.Namespace) -> Any:
    from .mcp.runs.redis_records import RedisRunStore

    # Redis expires records as the servers' --run-history-max-age says: no age here.
    return RedisRunStore(args.store, prefix=args.prefix, max_age=FOREVER)


def shown(value: object) -> str:
    """``value`` as a cell a terminal prints as it is: text that is empty, or holds
    whitespace, quotes, backslashes or characters that do not print (a caller id
    from a token may hold an escape sequence, a newline or a lone surrogate) is shown
    as a Python string literal, so no record can move the cursor, colour the
    terminal or print a row of its own."""
    text = str(value)
    plain = text.isprintable() and not any(c.isspace() or c in "'\"\\" for c in text)
    return text if text and plain else repr(text)


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


async def _show(args: argparse.Namespace, store: Any) -> int:
    try:
        record = await store.get(args.run_id)
    finally:
        await store.close()
    if record is None:
        raise CommandError(EXIT_NOT_FOUND, f"no run {args.run_id!r} in the history at "
                           f"{args.prefix} (unknown, or expired)")
    data = record.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    for key, value in data.items():
        if key not in ("steps", "approvals"):
            when = key in ("started_at", "ended_at")
            print(f"{key:>14}: {_when(value) if when else shown(value)}")
    for step in record.steps:  # deliveries (above): a redelivered task's legs
        restored = " restored" if step.get("restored") else ""  # from its checkpoint
        error = shown(step["error"]) if step.get("error") else ""
        print(f"{'step':>14}: {shown(step['id'])} {shown(step['status'])}{restored} "
              f"attempts={step['attempts']} {step['duration_ms']} ms {error}".rstrip())
    for decision in record.approvals:
        print(f"{'approval':>14}: {shown(decision['decision'])} at "
              f"{_when(decision['at'])} ({', '.join(map(shown, decision['steps']))})")
    return EXIT_OK


async def _list(args: argparse.Namespace, store: Any) -> int:
    from .mcp.runs.records import RunQuery

    try:
        records, cursor = await store.page(RunQuery(
            caller=args.caller, flow=args.flow, status=args.status, cursor=args.cursor,
            limit=args.limit))
    finally:
        await store.close()
    if args.json:
        print(json.dumps({"runs": [record.to_dict() for record in records],
                          "next_cursor": cursor}, indent=2))
        return EXIT_OK
    rows = [("RUN", "STARTED", "STATUS", "FLOW", "VERSION", "CALLER", "ERROR")]
    rows += [(shown(r.run_id), _when(r.started_at), shown(r.status), shown(r.flow),
              shown(r.version), shown(r.caller), shown(r.error_type or "-"))
             for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows if records else []:
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)),
                         row[-1]]))
    if not records:
        print("chainweaver: no runs match", file=sys.stderr)
    if cursor is not None:
        print(f"chainweaver: more runs: --cursor {cursor}", file=sys.stderr)
    return EXIT_OK
