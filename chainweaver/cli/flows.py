"""``chainweaver flows``: operators' governance commands against the shared state.

    chainweaver flows archive|activate|deprecate|withdraw NAME [PATH...] [--version V]
        [--wait S] [--force]
    chainweaver flows status [--json]

Both take ``--governance URL`` (default: ``$CHAINWEAVER_GOVERNANCE``) and ``--prefix``.
A change is refused for a name that no live process reports in its heartbeat, no shared
entry holds and no flow file under ``PATH...`` defines (with a "did you mean"), unless
``--force``. It returns once Redis holds it (and, with ``--wait``, once every live
process has applied it); ``status`` shows the decisions, what each live replica and
worker applied and when, and the last changes with who made them. ``serve`` and
``worker`` follow the same state with ``--governance URL`` (:mod:`chainweaver.cli.options`).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import getpass
import os
import sys
import time
from typing import Any

from ..errors import ChainWeaverError, FlowFileError, needs_extra
from ..files import find_flow_files, read_flow_data
from ..governance.state import (
    GovernanceSettings,
    UnreadableEntry,
    check_version,
    masked_reason,
    masked_url,
)
from ..governance.store import UNREADABLE_HEARTBEAT, GovernanceStateError, GovernanceStore, seen
from .errors import EXIT_INVALID, EXIT_MISSING, EXIT_OK, EXIT_USAGE, CommandError
from .output import PROG, json_text, printed, shown, table, when

ENV_URL = "CHAINWEAVER_GOVERNANCE"
VERBS = {"archive": "archived", "activate": "active", "deprecate": "deprecated",
         "withdraw": "withdrawn"}
EXIT_NOT_APPLIED = 1  # --wait ran out before every live process applied the change


def add_parser(subparsers: Any) -> None:
    flows = subparsers.add_parser(
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
        change.add_argument("paths", nargs="*", metavar="PATH",
                            help="flow files or directories: the names they define are "
                                 "known too, even with no process running them")
        change.add_argument("--force", action="store_true",
                            help="decide on NAME even when no live process, shared entry "
                                 "or given flow file knows it")
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


def run(args: argparse.Namespace) -> int:
    """Run ``chainweaver flows ACTION``; the exit code."""
    if not args.governance:
        raise CommandError(EXIT_USAGE, f"flows needs --governance redis://HOST:PORT/DB "
                           f"(or ${ENV_URL})")
    try:
        settings = GovernanceSettings(url=args.governance, **(
            {"prefix": args.prefix} if args.prefix else {}))
        if args.flows_command != "status":
            check_version(args.flow_version)
    except ChainWeaverError as error:
        raise CommandError(EXIT_INVALID, str(error)) from None
    where = masked_url(settings.url)
    try:
        store = GovernanceStore(settings.url, settings.prefix)
    except ImportError:
        raise CommandError(EXIT_MISSING, needs_extra(f"{PROG} flows", "tasks")) from None
    except ValueError as error:  # a URL redis-py cannot read
        raise CommandError(EXIT_USAGE, f"--governance {where}: "
                           f"{masked_reason(error, settings.url)}") from None
    from redis.exceptions import ConnectionError as Unreachable
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as TimedOut

    try:
        return asyncio.run(_flows(store, args))
    except (OSError, Unreachable, TimedOut) as error:
        raise CommandError(EXIT_MISSING, f"cannot reach the governance state at {where}: "
                           f"{masked_reason(error, settings.url)}") from None
    except (RedisError, GovernanceStateError) as error:
        raise CommandError(EXIT_MISSING, f"cannot use the governance state at {where}: "
                           f"{masked_reason(error, settings.url)}") from None


async def _flows(store: Any, args: argparse.Namespace) -> int:
    try:
        if args.flows_command == "status":
            return await _status(store, args)
        return await _change(store, args)
    finally:
        await store.aclose()


async def _change(store: Any, args: argparse.Namespace) -> int:
    action = VERBS[args.flows_command]
    if not args.force:
        await _check_known(store, args.flow, _file_names(args.paths))
    try:
        change = await store.change(args.flow, args.flow_version, action,
                                    by=args.by or _os_user(), reason=args.reason)
    except UnreadableEntry as error:
        raise CommandError(EXIT_INVALID, f"{args.flow}: its entry cannot be read: "
                                         f"{error}") from None
    except ValueError as error:  # a name or action this release does not know
        raise CommandError(EXIT_INVALID, str(error)) from None
    which = f"version {args.flow_version.strip()}" if args.flow_version else "all versions"
    print(f"{args.flow} ({which}): {action}; shared version {change.version}", flush=True)
    if change.unreadable:
        print(f"warning: {args.flow} is {change.unreadable}: every process withholds "
              f"it; a decision without --version replaces the entry", file=sys.stderr,
              flush=True)
    if args.wait is None:
        return EXIT_OK
    return await _wait(store, args.flow, change.version, args.wait)


async def _check_known(store: Any, name: str, in_files: set[str]) -> None:
    """Refuse a decision on a name no live process reports, no shared entry holds and no
    given flow file defines: a typo would otherwise be applied, and reported applied,
    while the flow meant goes on being served."""
    heartbeats = await store.heartbeats()
    live = _live(heartbeats)
    known = set(in_files)
    for record in live.values():
        flows = record.get("flows")
        if isinstance(flows, list):
            known |= {flow for flow in flows if isinstance(flow, str)}
    try:
        state = await store.read()
        known |= set(state.decisions) | set(state.unreadable)
    except GovernanceStateError:
        pass  # decisions lost: deciding again is how operators restore them
    if name in known:
        return
    close = difflib.get_close_matches(name, sorted(known), n=3)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise CommandError(EXIT_INVALID, f"no flow named {name!r} is known{hint}: no live "
                       f"process reports it ({len(live)} live), no shared entry holds it "
                       "and no given flow file defines it; give the flow files that "
                       "define it, or --force")


def _file_names(paths: list[str]) -> set[str]:
    """The flow names the files under ``paths`` define (read, not built: no tools)."""
    if not paths:
        return set()
    try:
        files = find_flow_files(paths)
        datas = [read_flow_data(path) for path in files]
    except FileNotFoundError as error:
        raise CommandError(EXIT_MISSING, str(error)) from None
    except ModuleNotFoundError as error:  # PyYAML, for a YAML file
        raise CommandError(EXIT_MISSING, str(error)) from None
    except FlowFileError as error:
        raise CommandError(EXIT_INVALID, str(error)) from None
    return {data["name"] for data in datas
            if isinstance(data, dict) and isinstance(data.get("name"), str)}


async def _wait(store: Any, flow: str, version: int, seconds: float) -> int:
    """Until every live process applied ``version`` (and governs ``flow`` by it)."""
    deadline = time.monotonic() + seconds
    expected: set[str] = set()  # every process live at some point while waiting
    while True:
        heartbeats = await store.heartbeats()
        live = _live(heartbeats)
        expected |= set(live)
        behind = {process: _why_behind(heartbeats.get(process), process in live, flow,
                                       version) for process in sorted(expected)}
        behind = {process: why for process, why in behind.items() if why}
        if expected and not behind:
            print(f"applied by {len(expected)} live process(es)", flush=True)
            return EXIT_OK
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.05)
    if not expected:
        print(f"not confirmed: no live process reported (none has a recent heartbeat), "
              f"so none confirmed applying version {version}", file=sys.stderr, flush=True)
    else:
        print(f"not applied by {len(behind)} of {len(expected)} live process(es):",
              file=sys.stderr)
        for process, why in behind.items():
            print(f"  {shown(process)}: {why}", file=sys.stderr)
    unreadable = [shown(p) for p, r in heartbeats.items() if UNREADABLE_HEARTBEAT in r]
    if unreadable:
        print(f"  (heartbeats that cannot be read, not counted: {', '.join(unreadable)})",
              file=sys.stderr)
    sys.stderr.flush()
    return EXIT_NOT_APPLIED


def _why_behind(record: dict[str, Any] | None, live: bool, flow: str, version: int
                ) -> str | None:
    """Why a process has not applied ``version`` to ``flow`` (None: it has)."""
    if record is None or not live:
        ago = f"{time.time() - seen(record):.1f}s ago" if record and seen(record) else "-"
        return f"stopped reporting (last heartbeat {ago})"
    applied = _number(record.get("version"))
    unreadable = record.get("unreadable")
    if isinstance(unreadable, dict) and flow in unreadable:
        return printed(unreadable[flow])
    not_applied = record.get("not_applied")
    if isinstance(not_applied, dict) and flow in not_applied:
        return f"at version {applied}; could not apply {flow} ({printed(not_applied[flow])})"
    if applied >= version:
        return None
    if isinstance(not_applied, dict) and not_applied:
        return (f"at version {applied}; version {shown(record.get('pending'))} read but "
                f"not applied: could not apply {', '.join(map(shown, sorted(not_applied)))}")
    return f"at version {applied}"


def _number(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _live(heartbeats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Processes whose last heartbeat is recent (three of their intervals, plus 1 s)."""
    now = time.time()
    live = {}
    for process, record in heartbeats.items():
        interval = record.get("interval")
        if not isinstance(interval, (int, float)) or isinstance(interval, bool):
            interval = 2.0
        if UNREADABLE_HEARTBEAT not in record and now - seen(record) <= 3 * interval + 1.0:
            live[process] = record
    return live


async def _status(store: Any, args: argparse.Namespace) -> int:
    state = await store.read()
    heartbeats = await store.heartbeats()
    changes = await store.audit(args.changes)
    live = _live(heartbeats)
    readable = {name: d for name, d in state.decisions.items() if d.withheld is None}
    if args.json:
        print(json_text({
            "version": state.version,
            "decisions": {name: d.to_dict() for name, d in readable.items()},
            "unreadable": state.unreadable,
            "processes": {p: {**r, "live": p in live} for p, r in heartbeats.items()},
            "changes": changes}), flush=True)
        return EXIT_OK
    print(f"shared version {state.version}")
    rows: list[tuple[str, ...]] = [("FLOW", "VERSIONS", "DECISION")]
    # Everything below was read back from Redis: names, reasons and audit text are
    # printed as literals when they hold anything a terminal would act on.
    for name, decision in sorted(state.decisions.items()):
        if decision.withheld is not None:
            why = decision.withheld.removeprefix("withheld by shared governance: ")
            rows.append((shown(name), "-", f"NOT SERVED: {printed(why)}"))
        if decision.all is not None:
            rows.append((shown(name), "all", decision.all))
        rows.extend((shown(name), shown(version), action)
                    for version, action in decision.versions.items())
    print("\n".join(table(rows)) if len(rows) > 1 else "no decisions")
    print()
    print(_processes(heartbeats, live))
    if changes:
        print()
        for change in changes:
            which = change.get("flow_version") or "all versions"
            reason = f" ({printed(change['reason'])})" if change.get("reason") else ""
            print(f"{shown(change.get('version', '?')):>6} "
                  f"{when(_float(change.get('at')), millis=True)} "
                  f"{shown(change.get('by', '?'))}: {shown(change.get('name', '?'))} "
                  f"{printed(which)} -> {shown(change.get('action', '?'))}{reason}")
    return EXIT_OK


def _processes(heartbeats: dict[str, dict[str, Any]], live: dict[str, Any]) -> str:
    """The processes table, then what each live one could not read or apply."""
    rows: list[tuple[str, ...]] = [
        ("PROCESS", "ROLE", "APPLIED", "APPLIED AT", "SEEN", "STATE", "LAST OUTAGE")]
    notes = []
    now = time.time()
    for process, record in heartbeats.items():
        if UNREADABLE_HEARTBEAT in record:
            rows.append((shown(process), "?", "?", "-", "-",
                         f"heartbeat unreadable ({record[UNREADABLE_HEARTBEAT]})", "-"))
            continue
        outage = record.get("last_outage")
        applied = shown(record.get("version"))
        if record.get("pending") is not None:
            applied += f" (read {shown(record['pending'])})"
        try:
            last_outage = "-" if not outage else (
                f"{outage['to'] - outage['from']:.1f}s, ended "
                f"{when(outage['to'], millis=True)}")
        except (KeyError, TypeError, ValueError):
            last_outage = "?"
        rows.append((shown(process), shown(record.get("role", "?")), applied,
                     when(_float(record.get("applied_at")), millis=True),
                     f"{now - seen(record):.1f}s ago",
                     shown(record.get("state", "?")) if process in live else "gone",
                     last_outage))
        if process not in live:
            continue
        for name, why in _entries(record.get("unreadable")):
            notes.append(f"{shown(process)}: {shown(name)} is {printed(why)}")
        for name, why in _entries(record.get("not_applied")):
            notes.append(f"{shown(process)}: could not apply the decision on {shown(name)} "
                         f"({printed(why)}); withheld")
    listed = "\n".join(table(rows)) if len(rows) > 1 else "no process has reported"
    return "\n".join([listed, *notes])


def _entries(value: object) -> list[tuple[str, object]]:
    """A heartbeat's ``{flow: why}`` map as sorted pairs (none when it is not a map)."""
    return sorted((str(k), v) for k, v in value.items()) if isinstance(value, dict) else []


def _float(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"
