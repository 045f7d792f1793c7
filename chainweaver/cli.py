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
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from . import __version__
from .errors import ChainWeaverError, DuplicateToolError
from .executor import FlowExecutor
from .files import find_flow_files, load_flows
from .flows import FlowLifecycle
from .registry import FlowRegistry
from .safety import SideEffectLevel
from .tools import Tool

PROG = "chainweaver"
EXIT_OK, EXIT_INVALID, EXIT_MISSING, EXIT_SERVE_FAILED = 0, 1, 2, 3
EXIT_USAGE = 2  # argparse's code for a command line that does not make sense
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: how a shell reports a reader that went away


class CommandError(Exception):
    """A problem to report as one line on stderr, with the exit code it deserves."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


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
    _add_http_options(common)

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


def _values(raw: list[str] | None, flag: str, enum: type[Enum] | None = None) -> list[str] | None:
    """Repeated and comma-separated flag values; checked against ``enum`` when given."""
    if raw is None:
        return None
    values = [part.strip() for item in raw for part in item.split(",") if part.strip()]
    if not values:
        raise CommandError(EXIT_INVALID, f"{flag} needs at least one value")
    if enum is not None:
        choices = [member.value for member in enum]
        for value in values:
            if value not in choices:
                raise CommandError(EXIT_INVALID, f"{flag}: {value!r} is not one of "
                                   f"{', '.join(choices)}")
    return values


# ------------------------------------------------------------------ tools modules


def _import_tools_module(spec: str) -> ModuleType:
    """Import ``spec``: a path to a .py file, or a dotted module name."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return _import_file(Path(spec), spec)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as error:
        if error.name and (spec == error.name or spec.startswith(f"{error.name}.")):
            raise CommandError(EXIT_MISSING, f"--tools {spec}: no module named "
                               f"{error.name!r}") from None
        raise _import_failed(spec, error, _module_file(spec)) from None
    except (Exception, SystemExit) as error:  # the module's own code failed
        raise _import_failed(spec, error, _module_file(spec)) from None


def _module_file(spec: str) -> str | None:
    """Where a dotted module lives, found without running it again."""
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        return None
    return found.origin if found is not None else None


def _import_failed(spec: str, error: BaseException, module_file: str | None = None
                   ) -> CommandError:
    """One line naming where the import failed: the line of the tools module that was
    running, and the place the exception came from when that is elsewhere."""
    where = _failure_location(error, module_file)
    message = str(error.msg) if isinstance(error, SyntaxError) else str(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return CommandError(EXIT_MISSING, f"--tools {spec}: importing it failed"
                        f"{f' at {where}' if where else ''}: {text}")


def _failure_location(error: BaseException, module_file: str | None) -> str:
    """``file:line`` of the failure, for a person to open in an editor."""
    frames = [(frame.f_code.co_filename, line) for frame, line in
              traceback.walk_tb(error.__traceback__)]
    if isinstance(error, SyntaxError) and error.filename:
        frames.append((error.filename, error.lineno or 0))  # the file that did not parse
    frames = [(name, line) for name, line in frames if not _is_import_machinery(name)]
    if not frames:
        return ""
    origin = frames[-1]
    here = next((f for f in reversed(frames) if module_file and _same_file(f[0], module_file)),
                None)
    if here is None or here == origin:
        return f"{_shown(origin[0])}:{origin[1]}"
    return f"{_shown(here[0])}:{here[1]} (raised at {_shown(origin[0])}:{origin[1]})"


def _shown(filename: str) -> str:
    """A path relative to the current directory when it is inside it, as typed."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
    except (OSError, ValueError):
        return filename


def _is_import_machinery(filename: str) -> bool:
    return filename.startswith("<frozen ") or filename == __file__


def _same_file(first: str, second: str) -> bool:
    try:
        return Path(first).resolve() == Path(second).resolve()
    except OSError:
        return first == second


def _import_file(path: Path, spec: str) -> ModuleType:
    """Import a file as the module named after it, with its directory on sys.path so it
    can import its neighbours and flow files can reference its models."""
    if not path.is_file():
        raise CommandError(EXIT_MISSING, f"--tools {spec}: no such file")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        loaded_file = getattr(loaded, "__file__", None)
        if loaded_file and Path(loaded_file).resolve() == path.resolve():
            return loaded
        raise CommandError(EXIT_MISSING, f"--tools {spec}: a different module named "
                           f"{name!r} is already imported; rename the file")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise CommandError(EXIT_MISSING, f"--tools {spec}: cannot be imported as a module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # pydantic resolves postponed annotations through it
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # SystemExit too: sys.exit() while importing
        del sys.modules[name]
        raise _import_failed(spec, error, str(path)) from None
    return module


def register_tools(executor: FlowExecutor, specs: Sequence[str]) -> None:
    """Register every public module-level Tool of each module."""
    owners: dict[str, str] = {}
    for spec in specs:
        module = _import_tools_module(spec)
        found = [v for k, v in vars(module).items()
                 if isinstance(v, Tool) and not k.startswith("_")]
        if not found:
            raise CommandError(EXIT_MISSING, f"--tools {spec}: the module defines no "
                               "chainweaver Tool objects")
        for found_tool in found:
            if executor.tools.get(found_tool.name) is found_tool:
                continue  # the same object, re-exported by another module
            try:
                executor.register_tool(found_tool)
            except DuplicateToolError:
                raise CommandError(EXIT_INVALID, f"--tools {spec}: a different tool named "
                                   f"{found_tool.name!r} already came from "
                                   f"{owners[found_tool.name]}") from None
            owners[found_tool.name] = spec


# ------------------------------------------------------------------ building


@contextmanager
def _quiet_exposure_log() -> Iterator[None]:
    """The CLI reports exclusions itself; the server's per-flow warnings would repeat them."""
    logger = logging.getLogger("chainweaver.mcp")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


class Built(NamedTuple):
    server: Any  # a chainweaver.mcp.FlowServer (imported lazily: it needs the mcp extra)
    files: int
    tools: int


def build_server(args: argparse.Namespace) -> Built:
    """Load tools, flow files and policy, and decide the exposure. Serves nothing."""
    try:
        from .mcp import ExposurePolicy, FlowServer, SecurityConfig, ServingConfig
    except ImportError as error:
        raise CommandError(EXIT_MISSING, str(error)) from None
    instructions = _instructions(args)
    auth = load_token_file(args.auth_token_file) if args.auth_token_file else None
    lifecycles = _values(args.lifecycle, "--lifecycle", FlowLifecycle)
    side_effects = _values(args.side_effects, "--side-effects", SideEffectLevel)
    owners = _values(args.owner, "--owner")
    if os.getcwd() not in sys.path:  # like `python -m`: modules next to you import
        sys.path.insert(0, os.getcwd())

    registry = FlowRegistry()
    executor = FlowExecutor(registry)
    register_tools(executor, args.tools)
    files = find_flow_files(args.paths)
    for flow in load_flows(files, tools=executor.tools):
        registry.register_flow(flow)
    with _quiet_exposure_log():
        server = FlowServer(
            executor,
            name=args.name,
            expose_schemas=args.expose_schemas,
            expose_prompts=args.expose_prompts,
            policy=ExposurePolicy(
                server_prefix=args.prefix,
                allowed_lifecycles=lifecycles,
                allowed_side_effects=side_effects,
                owners=owners,
                allow_requires_approval=args.allow_requires_approval,
            ),
            security=SecurityConfig(auth=auth, **_given(error_detail=args.error_detail)),
            serving=ServingConfig(flow_timeout=args.flow_timeout, page_size=args.page_size,
                                  allowed_hosts=args.allowed_host,
                                  allowed_origins=args.allowed_origin),
            instructions=instructions,
        )
        # Judge every flow now: the command prints its own report of them, so the
        # library's per-flow log lines would only repeat it.
        server.exposure_report()
    return Built(server, len(files), len(executor.tools))


def _given(**settings: Any) -> dict[str, Any]:
    """The settings whose flag was given; the others keep the library's default."""
    return {name: value for name, value in settings.items() if value is not None}


def _instructions(args: argparse.Namespace) -> str | None:
    if args.instructions_file is None:
        return args.instructions
    if args.instructions is not None:
        raise CommandError(EXIT_USAGE, "--instructions and --instructions-file cannot be "
                           "used together")
    text = _read_text(args.instructions_file, "--instructions-file").strip()
    if not text:
        raise CommandError(EXIT_INVALID, f"--instructions-file {args.instructions_file}: "
                           "the file is empty")
    return text


def _read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandError(EXIT_MISSING, f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise CommandError(EXIT_MISSING, f"{flag} {path}: cannot be read: {reason}") from None


# RFC 6750's token68 alphabet: what may follow "Bearer " in an Authorization header.
BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def load_token_file(path: str) -> Any:
    """A FastMCP ``StaticTokenVerifier`` accepting the tokens listed in ``path``.

    One token per line; blank lines and lines starting with ``#`` are skipped. The
    caller of line N is ``token-N`` (the line, never the token, identifies it in logs).
    """
    from fastmcp.server.auth import StaticTokenVerifier

    tokens: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(_read_text(path, "--auth-token-file").splitlines(), 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if not BEARER_TOKEN.fullmatch(token):
            raise CommandError(EXIT_INVALID, f"--auth-token-file {path}, line {number}: not "
                               "a bearer token (letters, digits and -._~+/ then any '=', "
                               "no spaces)")
        tokens.setdefault(token, {"client_id": f"token-{number}", "scopes": []})
    if not tokens:
        raise CommandError(EXIT_INVALID, f"--auth-token-file {path}: the file lists no "
                           "tokens")
    return StaticTokenVerifier(tokens=tokens)


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
            (e.flow_name, e.version, e.tool_name or "-", ", ".join(e.resource_uris) or "-",
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


def _serve_warnings(args: argparse.Namespace) -> list[str]:
    """What an operator should know before the server listens."""
    from .mcp.http_guard import is_loopback

    warnings = []
    if args.transport == "streamable-http" and not is_loopback(args.host):
        if args.auth_token_file is None:
            warnings.append(f"{args.host} is not a loopback address and no "
                            "--auth-token-file is set: anyone who can reach "
                            f"port {args.port} can call the published flows")
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
