"""``chainweaver flows``: operators' governance commands against the shared state.

    chainweaver flows archive|activate|deprecate|withdraw NAME [--version V] [--wait S]
    chainweaver flows status [--json]

Both take ``--governance URL`` (default: ``$CHAINWEAVER_GOVERNANCE``) and ``--prefix``.
A change returns once Redis holds it (and, with ``--wait``, once every live process has
applied it); ``status`` shows the decisions, what each live replica and worker applied
and when, and the last changes with who made them. ``serve`` and ``worker`` follow the
same state with ``--governance URL`` (:func:`add_governance_options`).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import sys
import time
from typing import Any

from .cli_errors import EXIT_INVALID, EXIT_MISSING, EXIT_OK, EXIT_USAGE, CommandError
from .errors import ChainWeaverError

ENV_URL = "CHAINWEAVER_GOVERNANCE"
VERBS = {"archive": "archived", "activate": "active", "deprecate": "deprecated",
         "withdraw": "withdrawn"}
EXIT_NOT_APPLIED = 1  # --wait ran out before every live process applied the change


def add_governance_options(parser: argparse.ArgumentParser) -> None:
    """``serve`` / ``worker`` (and ``inspect``, which ignores them): follow the state."""
    group = parser.add_argument_group("shared governance (needs the tasks extra)")
    group.add_argument("--governance", metavar="URL",
                       help="follow the governance state operators share on this Redis "
                            "(redis://HOST:PORT/DB; see chainweaver flows)")
    group.add_argument("--governance-prefix", metavar="PREFIX",
                       help="its Redis key prefix (default: chainweaver:governance)")
    group.add_argument("--governance-stop-after", type=float, metavar="SECONDS",
                       help="serve no flow while the state could not be confirmed for "
                            "longer than this (default: keep serving the last state)")


def governance_settings(args: argparse.Namespace) -> Any:
    """``ServingConfig(governance=...)`` from the flags (None without --governance)."""
    if args.governance is None:
        if args.governance_prefix or args.governance_stop_after:
            raise CommandError(EXIT_USAGE, "--governance-prefix and "
                               "--governance-stop-after need --governance")
        return None
    from .governance import GovernanceSettings

    logger = logging.getLogger("chainweaver.governance")
    if args.command != "inspect" and not logger.handlers:  # applies and outages
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("chainweaver: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    options: dict[str, Any] = {"url": args.governance}
    if args.governance_prefix:
        options["prefix"] = args.governance_prefix
    if args.governance_stop_after is not None:
        options["stop_serving_after"] = args.governance_stop_after
    return GovernanceSettings(**options)


def add_flows_command(commands: Any) -> None:
    """``chainweaver flows ...``."""
    flows = commands.add_parser(
        "flows", help="govern flows on every replica and worker (shared on Redis)",
        description="Change or show the governance state every replica and worker "
                    "started with --governance applies.")
    actions = flows.add_subparsers(dest="flows_command", metavar="ACTION", required=True)
    for verb, lifecycle in VERBS.items():
        change = actions.add_parser(verb, help=f"make NAME {lifecycle} everywhere")
        change.add_argument("flow", metavar="NAME", help="the flow's name")
        change.add_argument("--version", dest="flow_version", metavar="V",
                            help="only this version (default: every version)")
        change.add_argument("--by", help="who makes the change, for the audit (default: "
                                         "the OS user)")
        change.add_argument("--reason", default="", help="why, for the audit")
        change.add_argument("--wait", type=float, metavar="SECONDS",
                            help="wait until every live process applied the change; exit "
                                 "1 if one has not after SECONDS")
        _connection(change)
    status = actions.add_parser("status", help="the shared state and what each process "
                                               "applied")
    status.add_argument("--json", action="store_true", help="print JSON for scripts")
    status.add_argument("--changes", type=int, default=10, metavar="N",
                        help="show the last N changes (default: 10)")
    _connection(status)


def _connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--governance", metavar="URL", default=os.environ.get(ENV_URL),
                        help=f"the Redis holding the state (default: ${ENV_URL})")
    parser.add_argument("--prefix", default=None, help="its key prefix (default: "
                                                       "chainweaver:governance)")


def flows_command(args: argparse.Namespace) -> int:
    """Run ``chainweaver flows ACTION``; the exit code."""
    if not args.governance:
        raise CommandError(EXIT_USAGE, f"flows needs --governance redis://HOST:PORT/DB "
                           f"(or ${ENV_URL})")
    try:
        from .governance import GovernanceSettings, GovernanceStore
        from .governance.state import check_version

        settings = GovernanceSettings(url=args.governance, **(
            {"prefix": args.prefix} if args.prefix else {}))
        if args.flows_command != "status":
            check_version(args.flow_version)
        store = GovernanceStore(settings.url, settings.prefix)
    except ImportError as error:
        raise CommandError(EXIT_MISSING, str(error)) from None
    except ChainWeaverError as error:
        raise CommandError(EXIT_INVALID, str(error)) from None
    try:
        return asyncio.run(_flows(store, args))
    except (OSError, ConnectionError) as error:
        raise CommandError(EXIT_MISSING, f"cannot reach {args.governance}: {error}") from None
    except Exception as error:
        if type(error).__module__.startswith("redis"):
            raise CommandError(EXIT_MISSING, f"cannot reach {args.governance}: "
                               f"{error}") from None
        raise


async def _flows(store: Any, args: argparse.Namespace) -> int:
    try:
        if args.flows_command == "status":
            return await _status(store, args)
        return await _change(store, args)
    finally:
        await store.aclose()


async def _change(store: Any, args: argparse.Namespace) -> int:
    action = VERBS[args.flows_command]
    change = await store.change(args.flow, args.flow_version, action,
                                by=args.by or _os_user(), reason=args.reason)
    which = f"version {args.flow_version}" if args.flow_version else "all versions"
    print(f"{args.flow} ({which}): {action}; shared version {change.version}", flush=True)
    if args.wait is None:
        return EXIT_OK
    deadline = time.monotonic() + args.wait
    while True:
        live = _live(await store.heartbeats())
        behind = [p for p, r in live.items() if r.get("version", 0) < change.version]
        if not behind:
            print(f"applied by {len(live)} live process(es)", flush=True)
            return EXIT_OK
        if time.monotonic() >= deadline:
            print(f"not applied yet by: {', '.join(behind)}", file=sys.stderr, flush=True)
            return EXIT_NOT_APPLIED
        await asyncio.sleep(0.02)


def _live(heartbeats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Processes whose last heartbeat is recent (three of their intervals, plus 1 s)."""
    now = time.time()
    return {p: r for p, r in heartbeats.items()
            if now - r.get("seen", 0) <= 3 * r.get("interval", 2.0) + 1.0}


async def _status(store: Any, args: argparse.Namespace) -> int:
    state = await store.read()
    heartbeats = await store.heartbeats()
    changes = await store.audit(args.changes)
    live = _live(heartbeats)
    if args.json:
        print(json.dumps({
            "version": state.version,
            "decisions": {name: {"all": d.all, "versions": dict(d.versions)}
                          for name, d in sorted(state.decisions.items())},
            "processes": {p: {**r, "live": p in live} for p, r in heartbeats.items()},
            "changes": changes}, indent=2), flush=True)
        return EXIT_OK
    print(f"shared version {state.version}")
    rows: list[tuple[str, ...]] = [("FLOW", "VERSIONS", "DECISION")]
    for name, decision in sorted(state.decisions.items()):
        if decision.all is not None:
            rows.append((name, "all", decision.all))
        rows.extend((name, version, action) for version, action in decision.versions.items())
    print("\n".join(_table(rows)) if len(rows) > 1 else "no decisions")
    print()
    rows = [("PROCESS", "ROLE", "APPLIED", "APPLIED AT", "SEEN", "STATE", "LAST OUTAGE")]
    now = time.time()
    for process, record in heartbeats.items():
        outage = record.get("last_outage")
        rows.append((process, str(record.get("role", "?")), str(record.get("version")),
                     _when(record.get("applied_at")), f"{now - record['seen']:.1f}s ago",
                     str(record.get("state", "?")) if process in live else "gone",
                     "-" if not outage else
                     f"{outage['to'] - outage['from']:.1f}s, ended {_when(outage['to'])}"))
    print("\n".join(_table(rows)) if len(rows) > 1 else "no process has reported")
    if changes:
        print()
        for change in changes:
            which = change.get("flow_version") or "all versions"
            reason = f" ({change['reason']})" if change.get("reason") else ""
            print(f"{change['version']:>6} {_when(float(change['at']))} {change['by']}: "
                  f"{change['name']} {which} -> {change['action']}{reason}")
    return EXIT_OK


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"
