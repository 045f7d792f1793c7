"""``chainweaver runs``: the run history an operator reads (list, show; filter by flow,
status and caller; ``--json`` for scripts). ``serve`` keeps it with ``--run-history``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ..errors import needs_extra
from .errors import EXIT_MISSING, EXIT_OK, EXIT_USAGE, CommandError
from .output import PROG, json_text, shown, table, when

EXIT_NOT_FOUND = 1  # show: no such run (unknown, another prefix, or expired)
EXIT_STORE = 3  # the store could not be reached or read
FOREVER = 100 * 365 * 86400.0
STATUSES = ("running", "waiting_approval", "completed", "failed", "cancelled")


def add_parser(subparsers: Any) -> None:
    runs = subparsers.add_parser(
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


def run(args: argparse.Namespace) -> int:
    if not args.store.startswith(("redis://", "rediss://")):
        raise CommandError(EXIT_USAGE, "--store must be a redis:// URL: a memory:// history lives "
                              "only inside its server")
    try:
        import anyio

        from ..mcp.runs.records import RunStoreError
        from ..mcp.runs.redis_records import masked
    except ImportError:
        raise CommandError(EXIT_MISSING, needs_extra("chainweaver runs", "mcp", "tasks")
                           ) from None
    if args.runs_command == "list":
        _check_list(args)

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
    from ..mcp.runs.records import parse_cursor

    if args.limit < 1:
        raise CommandError(EXIT_USAGE, "--limit must be at least 1")
    if args.cursor is not None:
        try:
            parse_cursor(args.cursor)
        except ValueError:
            raise CommandError(EXIT_USAGE, f"--cursor {args.cursor!r} is not one a page "
                               "printed") from None


def _store(args: argparse.Namespace) -> Any:
    from ..mcp.runs.redis_records import RedisRunStore

    # Redis expires records as the servers' --run-history-max-age says: no age here.
    return RedisRunStore(args.store, prefix=args.prefix, max_age=FOREVER)


async def _show(args: argparse.Namespace, store: Any) -> int:
    try:
        record = await store.get(args.run_id)
    finally:
        await store.close()
    if record is None:
        raise CommandError(EXIT_NOT_FOUND, f"no run {args.run_id!r} in the history at "
                           f"{args.prefix} (unknown, or expired)")
    data = _shown_record(record)
    if args.json:
        print(json_text(data))
        return EXIT_OK
    for key, value in data.items():
        if key not in ("steps", "approvals"):
            timed = key in ("started_at", "ended_at")
            print(f"{key:>14}: {when(value) if timed else shown(value)}")
    # Entries as stored: a key a damaged or hand-written record lacks reads as "?".
    for step in record.steps:  # deliveries (above): a redelivered task's legs
        restored = " restored" if step.get("restored") else ""  # from its checkpoint
        error = shown(step["error"]) if step.get("error") else ""
        print(f"{'step':>14}: {shown(step.get('id', '?'))} {shown(step.get('status', '?'))}"
              f"{restored} attempts={shown(step.get('attempts', '?'))} "
              f"{shown(step.get('duration_ms', '?'))} ms {error}".rstrip())
    for decision in record.approvals:
        steps = decision.get("steps")
        print(f"{'approval':>14}: {shown(decision.get('decision', '?'))} at "
              f"{when(decision.get('at'))} "
              f"({', '.join(map(shown, steps)) if isinstance(steps, list) else '?'})")
    return EXIT_OK


async def _list(args: argparse.Namespace, store: Any) -> int:
    from ..mcp.runs.records import RunQuery

    try:
        records, cursor = await store.page(RunQuery(
            caller=args.caller, flow=args.flow, status=args.status, cursor=args.cursor,
            limit=args.limit))
    finally:
        await store.close()
    if args.json:
        print(json_text({"runs": [_shown_record(record) for record in records],
                          "next_cursor": cursor}))
        return EXIT_OK
    rows = [("RUN", "STARTED", "STATUS", "FLOW", "VERSION", "CALLER", "ERROR")]
    rows += [(shown(r.run_id), when(r.started_at), shown(r.status), shown(r.flow),
              shown(r.version), shown(r.caller), shown(r.error_type or "-"))
             for r in records]
    for line in table(rows) if records else []:
        print(line)
    if not records:
        print(f"{PROG}: no runs match", file=sys.stderr)
    if cursor is not None:
        print(f"{PROG}: more runs: --cursor {cursor}", file=sys.stderr)
    return EXIT_OK


def _shown_record(record: Any) -> dict[str, Any]:
    """A stored record as operators read it: every field but the bookkeeping that masks
    sub-flows for callers (``subflows``)."""
    data: dict[str, Any] = record.to_dict()
    data.pop("subflows", None)
    return data
