"""The options ``chainweaver`` commands share: where flows and tools come from (PATH...
and --tools), every server setting that ``serve``, ``inspect`` and ``worker`` take, and the
argument types that check values as they are read."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from ..errors import ChainWeaverError
from .errors import EXIT_USAGE, CommandError


def server_options() -> argparse.ArgumentParser:
    """The options of a command that loads and judges flows as a server would (``serve``,
    ``inspect`` and ``worker``): a parent parser for ``add_parser(parents=[...])``."""
    common = argparse.ArgumentParser(add_help=False)
    add_flow_sources(common)
    common.add_argument("--expose-schemas", action="store_true",
                        help="publish schema resources")
    common.add_argument("--expose-prompts", action="store_true", help="publish prompts")
    common.add_argument("--prompt-kinds", action="append", metavar="KIND",
                        help="publish only these prompt kinds: invocation, authored, "
                             "server, guide (default: all); repeatable or comma-separated")
    common.add_argument("--prompt-flow", action="append", metavar="FLOW",
                        help="publish the invocation and authored prompts of these flows "
                             "only (default: every published flow's); repeatable or "
                             "comma-separated")
    common.add_argument("--prefix", default="", help="publish tools as PREFIX__flow_name")
    common.add_argument("--name", default="chainweaver", help="the MCP server name")
    common.add_argument("--lifecycle", action="append", metavar="LIFECYCLE",
                        help="allowed lifecycles (default: active); repeatable or "
                             "comma-separated")
    common.add_argument("--side-effects", action="append", metavar="LEVEL",
                        help="allowed side effects (default: none,read); repeatable or "
                             "comma-separated")
    common.add_argument("--owner", action="append", metavar="OWNER",
                        help="publish only flows with these owners; repeatable or "
                             "comma-separated")
    common.add_argument("--allow-requires-approval", action="store_true",
                        help="also publish flows whose safety requires approval")
    common.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio",
                        help="how to serve (default: stdio)")
    common.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                        help="FastMCP's log level while serving (logs go to stderr)")
    _add_server_options(common)
    _add_run_options(common)
    _add_http_options(common)
    _add_access_options(common)
    _add_watch_options(common)
    _add_task_options(common)
    _add_run_history_options(common)
    _add_governance_options(common)
    return common


def add_flow_sources(parser: argparse.ArgumentParser, *, tools_required: bool = True
                     ) -> None:
    """PATH... and --tools: where flows and their tools are loaded from."""
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a flow file, or a directory searched for *.flow.yaml, "
                             "*.flow.yml and *.flow.json")
    parser.add_argument("--tools", action="append", required=tools_required,
                        metavar="MODULE", default=None if tools_required else [],
                        help="a module (package.module) or a .py file whose Tool objects "
                             "are registered; repeatable")


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    """The FlowServer settings that apply to every transport."""
    group = parser.add_argument_group("server settings")
    group.add_argument("--error-detail", choices=("full", "type_only", "generic"),
                       help="how much of a failing tool's error text clients see "
                            "(default: full)")
    group.add_argument("--flow-timeout", type=_seconds, metavar="SECONDS",
                       help="stop a flow call after this many seconds (default: none)")
    group.add_argument("--page-size", type=_positive_int, metavar="N",
                       help="list results per page (default: all in one page)")
    # Not an argparse mutually exclusive group: those leave their argument group when
    # copied through parents=, and the help would list these two elsewhere.
    group.add_argument("--max-body-bytes", type=_positive_int, metavar="N",
                       help="refuse (-32602) a rendered prompt or resource read above N "
                            "bytes (default: 16 MiB)")
    group.add_argument("--max-listen-streams-per-caller", type=_positive_int, metavar="N",
                       help="2026-07-28 listen streams one caller may hold open at once; "
                            "anonymous callers are one caller (default: 100)")
    group.add_argument("--max-listen-streams", type=_positive_int, metavar="N",
                       help="listen streams open at once on the server (default: 10000)")
    group.add_argument("--metrics-port", type=_port, metavar="PORT",
                       help="serve Prometheus metrics on http://HOST:PORT/metrics (needs "
                            "the metrics extra)")
    group.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                       help="the address --metrics-port binds (default: 127.0.0.1)")
    group.add_argument("--store-wait", type=_wait_seconds, default=30.0, metavar="SECONDS",
                       help="serve, worker: how long to wait at start-up for each Redis "
                            "store (--tasks, --run-history, --governance, "
                            "--rate-limit-redis) to answer before exiting with 3 "
                            "(default: 30; 0: try once)")
    group.add_argument("--registry-name", metavar="NAME",
                       help="the server's reverse-DNS name (io.github.me/orders) in its "
                            "server card and server.json (default: chainweaver.local/NAME)")
    group.add_argument("--cache-ttl", type=_wait_seconds, default=0.0, metavar="SECONDS",
                       help="how long 2026-07-28 clients and card readers may reuse a list, "
                            "read or server card (default: 0, ask again every time)")
    group.add_argument("--instructions", metavar="TEXT",
                       help="instructions clients receive when they connect")
    group.add_argument("--instructions-file", metavar="FILE",
                       help="read the instructions from a UTF-8 text file (not with "
                            "--instructions)")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """How a run talks to its client: progress and log messages, approval at run time."""
    group = parser.add_argument_group("runs")
    group.add_argument("--approval", choices=("exclude", "elicit"),
                       help="flows that require approval: exclude them (default), or "
                            "publish them and ask the user before each run (elicit)")
    group.add_argument("--approval-timeout", type=_seconds, metavar="SECONDS",
                       help="how long to wait for the user's answer (default: 300)")
    group.add_argument("--request-state-key-file", metavar="FILE",
                       help="keys (one per line, 32+ characters; the first seals, all "
                            "unseal) protecting the approval state a 2026-07-28 client "
                            "echoes; give every replica the same file")
    group.add_argument("--no-run-notifications", dest="run_notifications",
                       action="store_false",
                       help="send no per-step progress or log messages, even to clients "
                            "that ask for them")


def _add_watch_options(parser: argparse.ArgumentParser) -> None:
    """``serve --watch``: follow edits of the flow files while serving (``inspect``
    accepts and ignores them, as it takes every serve option)."""
    group = parser.add_argument_group("live reload (serve)")
    group.add_argument("--watch", action="store_true",
                       help="reload flow files when they change; a bad edit keeps the "
                            "last good flows serving and is logged")
    group.add_argument("--watch-interval", type=_seconds, default=1.0, metavar="SECONDS",
                       help="how often --watch looks at the files (default: 1)")


def _add_task_options(parser: argparse.ArgumentParser) -> None:
    """Background tasks (docs/tasks.md): serve, inspect and worker take these."""
    group = parser.add_argument_group("background tasks (needs the tasks extra)")
    group.add_argument("--tasks", metavar="URL",
                       help="let clients run flows as MCP background tasks: memory:// "
                            "(one process) or redis://HOST:PORT/DB (replicas and workers)")
    group.add_argument("--task-mode", choices=("forbidden", "optional", "required"),
                       default="optional",
                       help="task mode of flows whose file sets none (default: optional)")
    group.add_argument("--task-concurrency", type=_non_negative_int, metavar="N",
                       help="flows this process runs at once for tasks; 0: enqueue only, "
                            "workers run them (default: 10)")
    group.add_argument("--task-redelivery", type=_seconds, metavar="SECONDS",
                       help="give a task whose worker stopped to another worker after "
                            "this long (default: 300)")


def _add_http_options(parser: argparse.ArgumentParser) -> None:
    """Options that only streamable HTTP uses. Their defaults are applied after parsing
    (see http_defaults), so that giving one with stdio can be told apart and refused."""
    group = parser.add_argument_group("streamable HTTP (an error with --transport stdio)")
    group.add_argument("--host", help=f"HTTP host (default: {HTTP_DEFAULTS['host']})")
    group.add_argument("--port", type=_port,
                       help=f"HTTP port (default: {HTTP_DEFAULTS['port']})")
    group.add_argument("--stateless", action="store_true", default=None,
                       help="HTTP without per-session state (for several processes "
                            "behind one load balancer)")
    group.add_argument("--allowed-host", action="append", metavar="HOST",
                       type=_header_value("allowed_hosts"),
                       help="also accept this Host header (NAME, NAME:PORT or NAME:*); "
                            "repeatable")
    group.add_argument("--allowed-origin", action="append", metavar="ORIGIN",
                       type=_header_value("allowed_origins"),
                       help="also accept this Origin header (http[s]://NAME[:PORT|:*]); "
                            "repeatable")
    group.add_argument("--auth-token-file", metavar="FILE",
                       help="require 'Authorization: Bearer TOKEN' with a token listed in "
                            "FILE (one per line; for development)")


def _add_access_options(parser: argparse.ArgumentParser) -> None:
    """Who may call, what each caller sees, how often, and what is recorded."""
    group = parser.add_argument_group("access: tokens, views, limits, audit")
    group.add_argument("--auth-jwks-uri", metavar="URL",
                       help="require a JWT bearer token signed by a key from this JWKS "
                            "URL (streamable HTTP)")
    group.add_argument("--auth-public-key", metavar="FILE",
                       help="require a JWT bearer token signed by the PEM public key in "
                            "FILE (streamable HTTP)")
    group.add_argument("--auth-issuer", metavar="ISSUER",
                       help="the JWT 'iss' the token must carry")
    group.add_argument("--auth-audience", metavar="AUDIENCE",
                       help="the JWT 'aud' the token must carry")
    group.add_argument("--visible-claim", metavar="CLAIM",
                       help="each caller sees only the flows whose owner its token lists "
                            "in CLAIM (a list or a space-separated string)")
    group.add_argument("--rate-limit", type=_positive_int, metavar="N",
                       help="at most N requests per caller per --rate-window")
    group.add_argument("--rate-window", type=_seconds, metavar="SECONDS",
                       help="the rate-limit window (default: 60)")
    group.add_argument("--rate-limit-redis", metavar="URL",
                       help="count --rate-limit in this Redis, shared by every replica "
                            "(needs the tasks extra)")
    group.add_argument("--audit-log", metavar="FILE",
                       help="append an audit record per request to FILE (JSON Lines, "
                            "rotated at 100 MB)")
    group.add_argument("--resources-as-tools", action="store_true",
                       help="also publish schema resources as tools (list_resources, "
                            "read_resource) for tools-only clients")
    group.add_argument("--prompts-as-tools", action="store_true",
                       help="also publish prompts as tools (list_prompts, get_prompt)")


def _add_run_history_options(parser: argparse.ArgumentParser) -> None:
    """``serve``'s flags for ``FlowServer(run_history=RunHistory(...))``."""
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


def _add_governance_options(parser: argparse.ArgumentParser) -> None:
    """``serve`` / ``worker`` (``card`` and ``server-json`` apply it once; ``inspect``
    ignores it): follow the governance state operators change with ``chainweaver
    flows``."""
    group = parser.add_argument_group("shared governance (needs the tasks extra)")
    group.add_argument("--governance", metavar="URL",
                       help="follow the governance state operators share on this Redis "
                            "(redis://HOST:PORT/DB; see chainweaver flows)")
    group.add_argument("--governance-prefix", metavar="PREFIX",
                       help="its Redis key prefix (default: chainweaver:governance)")
    group.add_argument("--governance-stop-after", type=float, metavar="SECONDS",
                       help="serve no flow while the state could not be confirmed for "
                            "longer than this (default: keep serving the last state; "
                            "none is served before the state was first read)")


HTTP_DEFAULTS: dict[str, Any] = {"host": "127.0.0.1", "port": 8000, "stateless": False,
                                 "allowed_host": None, "allowed_origin": None,
                                 "auth_token_file": None}


def http_defaults(args: argparse.Namespace) -> None:
    """Refuse HTTP options given with stdio (they would be silently ignored), then fill
    in the defaults of those not given."""
    given = [name for name in HTTP_DEFAULTS if getattr(args, name) is not None]
    if args.transport != "streamable-http" and given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise CommandError(EXIT_USAGE, f"{flags} only appl{'ies' if len(given) == 1 else 'y'}"
                           f" to --transport streamable-http, not {args.transport}")
    for name, default in HTTP_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def _seconds(text: str) -> float:
    """argparse type for a duration: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def _wait_seconds(text: str) -> float:
    """argparse type for a wait: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _whole_number(minimum: int) -> Callable[[str], int]:
    """argparse type for a whole number of at least ``minimum`` (0 or 1)."""
    bound = "> 0" if minimum == 1 else f">= {minimum}"

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number {bound}")
        return value

    return check


_positive_int = _whole_number(1)
_non_negative_int = _whole_number(0)


def _header_value(setting: str) -> Any:
    """argparse type for --allowed-host / --allowed-origin, checked by SecurityConfig."""
    def check(text: str) -> str:
        try:
            from ..mcp import SecurityConfig
        except ImportError:
            return text  # reported by build_server, with the install hint
        try:
            if setting == "allowed_hosts":
                SecurityConfig(allowed_hosts=[text])
            else:
                SecurityConfig(allowed_origins=[text])
        except ChainWeaverError as error:
            raise argparse.ArgumentTypeError(str(error).split(": ", 1)[-1]) from None
        return text

    return check


def _port(text: str) -> int:
    """argparse type for --port: an integer from 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)")
    return port


port_number = _port  # the same check for other commands' port options
