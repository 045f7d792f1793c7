"""The ``chainweaver`` command: serve flow files over MCP, or inspect what would be served.

    chainweaver serve PATH... --tools MODULE [options]
    chainweaver inspect PATH... --tools MODULE [options] [--json | --graph FLOW]
    chainweaver schema

Everything (tools, flow files, policy, token and instructions files, the exposure
decision) is loaded and checked before anything is served, so a bad file never starts a
half-configured server. Exit codes: 0 success, 1 invalid flow file, tool set, policy or
setting, 2 a missing (or unloadable) file or module, and argparse's usual 2 for a
malformed command line (an HTTP-only flag with stdio too), 3 an HTTP server that could
not listen, 141 output into a closed pipe. Errors are one line on stderr; under stdio,
stdout carries nothing but MCP.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from contextlib import redirect_stdout
from typing import Any

from . import __version__
from .cli_build import (
    EXIT_BROKEN_PIPE,
    EXIT_INVALID,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_SERVE_FAILED,
    EXIT_USAGE,
    Built,
    CommandError,
    build_server,
    register_tools,
)
from .errors import ChainWeaverError
from .executor import FlowExecutor
from .files import find_flow_files, load_flows
from .registry import FlowRegistry

PROG = "chainweaver"
# ------------------------------------------------------------------ arguments


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("paths", nargs="+", metavar="PATH",
                        help="a flow file, or a directory searched for *.flow.yaml, "
                             "*.flow.yml and *.flow.json")
    common.add_argument("--tools", action="append", required=True, metavar="MODULE",
                        help="a module (package.module) or a .py file whose Tool objects "
                             "are registered; repeatable")
    common.add_argument("--expose-schemas", action="store_true",
                        help="publish schema resources")
    common.add_argument("--expose-prompts", action="store_true", help="publish prompts")
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

    parser = argparse.ArgumentParser(
        prog=PROG, description="Serve ChainWeaver flow files to MCP clients.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("serve", parents=[common], help="serve flows over MCP",
                        description="Serve the flows the policy allows over MCP.")
    inspect = commands.add_parser(
        "inspect", parents=[common], help="show what serve would publish",
        description="Print the exposure decision and exit. Takes every serve option "
                    "and checks it as serve does, but serves nothing.")
    inspect.add_argument("--json", action="store_true", help="print JSON for scripts")
    inspect.add_argument("--graph", metavar="FLOW",
                         help="print FLOW's steps as a Mermaid flowchart instead")
    commands.add_parser(
        "worker", parents=[common], help="run flows for background tasks (needs --tasks)",
        description="Run the flows of background tasks that any server replica on the same "
                    "Redis queue (--tasks redis://...) created. Loads flows and tools as "
                    "serve does; serves no MCP transport.")
    commands.add_parser("schema", help="print the JSON Schema of flow files",
                        description="Print the JSON Schema that flow files follow, for "
                                    "editors and CI checks.")
    return parser


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
    group.add_argument("--instructions", metavar="TEXT",
                       help="instructions clients receive when they connect")
    group.add_argument("--instructions-file", metavar="FILE",
                       help="read the instructions from a UTF-8 text file (not with "
                            "--instructions)")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """How a run talks to its client: approval at run time."""
    group = parser.add_argument_group("runs")
    group.add_argument("--approval", choices=("exclude", "elicit"),
                       help="flows that require approval: exclude them (default), or "
                            "publish them and ask the user before each run (elicit)")
    group.add_argument("--approval-timeout", type=_seconds, metavar="SECONDS",
                       help="how long to wait for the user's answer (default: 300)")


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


def _non_negative_int(text: str) -> int:
    """argparse type for a count that may be 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _add_http_options(parser: argparse.ArgumentParser) -> None:
    """Options that only streamable HTTP uses. Their defaults are applied after parsing
    (see _http_defaults), so that giving one with stdio can be told apart and refused."""
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


HTTP_DEFAULTS: dict[str, Any] = {"host": "127.0.0.1", "port": 8000, "stateless": False,
                                 "allowed_host": None, "allowed_origin": None,
                                 "auth_token_file": None}


def _http_defaults(args: argparse.Namespace) -> None:
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number > 0")
    return value


def _header_value(setting: str) -> Any:
    """argparse type for --allowed-host / --allowed-origin, checked by ServingConfig."""
    def check(text: str) -> str:
        try:
            from .mcp import ServingConfig
        except ImportError:
            return text  # reported by build_server, with the install hint
        try:
            if setting == "allowed_hosts":
                ServingConfig(allowed_hosts=[text])
            else:
                ServingConfig(allowed_origins=[text])
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



# ------------------------------------------------------------------ output


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)),
                       row[-1]]) for row in rows]


def format_table(server: Any) -> str:
    """The exposure decision as two aligned tables: exposed flows, then excluded ones."""
    report = server.exposure_report()
    exposed = [e for e in report if e.exposed]
    excluded = [e for e in report if not e.exposed]
    lines = [f"Exposed: {len(exposed)} of {len(report)} flows"]
    if exposed:
        lines += _table([("FLOW", "VERSION", "TOOL", "RESOURCE", "PROMPTS")] + [
            (e.flow_name, e.version,
             f"{e.tool_name} (asks approval)" if e.needs_approval else e.tool_name or "-",
             ", ".join(e.resource_uris) or "-",
             ", ".join(e.prompt_names) or "-") for e in exposed])
    lines += ["", f"Excluded: {len(excluded)} of {len(report)} flows"]
    if excluded:
        lines += _table([("FLOW", "VERSION", "REASON")] + [
            (e.flow_name, e.version, e.reason or "-") for e in excluded])
    extras = []
    if server.resource_uris:
        extras.append(f"resource {server.resource_uris[0]} (index)")
    if "chainweaver_guide" in server.prompt_names:
        extras.append("prompt chainweaver_guide (guide)")
    if extras:
        lines += ["", "Also published: " + ", ".join(extras)]
    return "\n".join(lines)


def format_json(server: Any) -> str:
    return json.dumps({
        "flows": [entry.to_dict() for entry in server.exposure_report()],
        "tools": server.registered_tool_names,
        "resources": server.resource_uris,
        "prompts": server.prompt_names,
    }, indent=2)


def _summary(built: Built, args: argparse.Namespace) -> str:
    server, files, tools = built
    report = server.exposure_report()
    exposed = [entry.flow_name for entry in report if entry.exposed]
    lines = [f"{PROG}: loaded {files} flow file(s) and {tools} tool(s)",
             f"{PROG}: exposed {len(exposed)} of {len(report)} flows: "
             f"{', '.join(exposed) or 'none'}"]
    lines += [f"{PROG}: excluded {e.flow_name} v{e.version}: {e.reason}"
              for e in report if not e.exposed]
    if args.command == "worker":
        lines.append(f"{PROG}: running task flows from {_redacted(args.tasks)}")
        return "\n".join(lines)
    where = (f"http://{args.host}:{args.port}/mcp" if args.transport == "streamable-http"
             else "stdio")
    lines.append(f"{PROG}: serving {len(server.registered_tool_names)} tool(s), "
                 f"{len(server.resource_uris)} resource(s), {len(server.prompt_names)} "
                 f"prompt(s) on {where}")
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def graph(args: argparse.Namespace) -> str:
    """The latest version of flow ``args.graph`` in the flow files, as Mermaid (no server
    is built: only tools and flow files are loaded and checked)."""
    from .plan import mermaid

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    executor = FlowExecutor(FlowRegistry())
    register_tools(executor, args.tools)
    flows = [f for f in load_flows(find_flow_files(args.paths), tools=executor.tools)
             if f.name == args.graph]
    if not flows:
        raise CommandError(EXIT_INVALID, f"--graph: no flow named {args.graph!r} in the "
                           "flow files")
    return mermaid(max(flows, key=lambda flow: flow.version_key))


def run(args: argparse.Namespace) -> int:
    if args.command == "schema":
        from .flow_format import flow_file_schema

        try:
            print(json.dumps(flow_file_schema(), indent=2), flush=True)
        except BrokenPipeError:
            # `chainweaver schema | head`: the reader has all it wanted. Point stdout at
            # devnull so that the flush at exit does not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    _http_defaults(args)
    try:
        # Tools modules may print while importing; stdout is only for MCP or the report.
        with redirect_stdout(sys.stderr):
            if args.command == "inspect" and args.graph:
                text = graph(args)
            else:
                built = build_server(args)
    except CommandError:
        raise
    except (FileNotFoundError, ModuleNotFoundError) as error:
        raise CommandError(EXIT_MISSING, str(error)) from None
    except ChainWeaverError as error:  # flow files, duplicate flows, server policy
        raise CommandError(EXIT_INVALID, str(error)) from None
    if args.command == "inspect" and args.graph:
        print(text)
        return EXIT_OK
    if args.command == "inspect":
        print(format_json(built.server) if args.json else format_table(built.server))
        sys.stdout.flush()  # a closed pipe shows here, inside main's handler
        return EXIT_OK
    print(_summary(built, args), file=sys.stderr, flush=True)
    if args.command == "worker":
        return run_worker(built.server, args)
    for warning in _serve_warnings(args):
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    try:
        built.server.serve(args.transport, host=args.host, port=args.port,
                           stateless=args.stateless,
                           log_level=args.log_level.upper() if args.log_level else None)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how an operator stops a server: not an error
    except Exception as error:
        # Under stdio the client may close our stdout; anyio reports that as a group.
        if _broken_pipe(error):
            raise BrokenPipeError from None
        raise
    except SystemExit as stopped:
        # uvicorn exits this way when it cannot start, e.g. the port is in use; it has
        # already logged the cause.
        if stopped.code not in (None, 0):
            raise CommandError(EXIT_SERVE_FAILED, f"the server could not start on "
                               f"{args.host}:{args.port} (see the log above)") from None
    return EXIT_OK


def _redacted(url: str | None) -> str:
    """A queue URL without its password (redis://user:secret@host -> redis://user:***@host)."""
    text = url or "no queue"
    scheme, sep, rest = text.partition("://")
    auth, at, host = rest.rpartition("@")
    if not at or ":" not in auth:
        return text
    return f"{scheme}{sep}{auth.split(':', 1)[0]}:***@{host}"


def run_worker(server: Any, args: argparse.Namespace) -> int:
    """``chainweaver worker``: run task flows until interrupted."""
    if not args.tasks or args.tasks.startswith("memory://"):
        raise CommandError(EXIT_USAGE, "worker needs --tasks redis://HOST:PORT/DB: a worker "
                           "runs tasks that server replicas put on a shared Redis queue")
    try:
        server.run_worker()
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _serve_warnings(args: argparse.Namespace) -> list[str]:
    """What an operator should know before the server listens."""
    from .mcp.http_guard import is_loopback

    warnings = []
    if args.transport == "streamable-http" and not is_loopback(args.host):
        if args.auth_token_file is None and args.auth_jwks_uri is None \
                and args.auth_public_key is None:
            warnings.append(f"{args.host} is not a loopback address and no "
                            "--auth-token-file, --auth-jwks-uri or --auth-public-key is set: "
                            "anyone who can reach "
                            f"port {args.port} can call the published flows")
    if args.visible_claim is not None and args.auth_jwks_uri is None \
            and args.auth_public_key is None:
        # Only a JWT carries claims: token-file and anonymous callers have none.
        warnings.append(f"--visible-claim {args.visible_claim} without --auth-jwks-uri or "
                        "--auth-public-key: no caller has the claim, so none sees a flow")
    if args.auth_token_file is not None and _readable_by_others(args.auth_token_file):
        warnings.append(f"--auth-token-file {args.auth_token_file} is readable by other "
                        f"users (chmod 600 {args.auth_token_file})")
    return warnings


def _readable_by_others(path: str) -> bool:
    try:
        return os.name == "posix" and bool(os.stat(path).st_mode & 0o077)
    except OSError:
        return False


def _broken_pipe(error: BaseException) -> bool:
    """Whether ``error`` is a BrokenPipeError, or a group of nothing else."""
    group = getattr(error, "exceptions", None)
    if isinstance(group, tuple) and group:
        return all(_broken_pipe(inner) for inner in group)
    return isinstance(error, BrokenPipeError)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``chainweaver`` and ``python -m chainweaver``; returns the exit code.

    Output into a closed pipe (``chainweaver inspect ... | head -1``) ends the command
    quietly with 141, the status a shell shows for a program stopped by SIGPIPE. SIGPIPE
    itself stays ignored, as Python sets it: a server must survive clients that hang up.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        _discard_output()
        return EXIT_BROKEN_PIPE


def _discard_output() -> None:
    """Point stdout and stderr at /dev/null, so that flushing what is still buffered at
    exit cannot fail a second time (Python would print a warning about it)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (AttributeError, OSError, ValueError):
            pass  # not a real file (tests capture output): nothing left to flush
    os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_MISSING
    try:
        return run(args)
    except CommandError as error:
        message = " ".join(str(error).split("\n"))
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return error.code
