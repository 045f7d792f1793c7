"""The ``chainweaver`` command: serve flow files over MCP, inspect what would be served,
run a flow once, or validate flow files.

    chainweaver serve PATH... --tools MODULE [options]
    chainweaver inspect PATH... --tools MODULE [options] [--json] [--graph FLOW] [--strict]
    chainweaver run FLOW PATH... --tools MODULE [--input JSON | --input-file FILE]
    chainweaver validate PATH... [--tools MODULE] [--format text|json]
    chainweaver migrate SRC... --out DIR [--partial]
    chainweaver schema

Everything (tools, flow files, policy, token and instructions files, the exposure
decision) is loaded and checked before anything is served, so a bad file never starts a
half-configured server. Exit codes: 0 success, 1 invalid flow file, tool set, policy or
setting, 2 a missing (or unloadable) file or module, and argparse's usual 2 for a
malformed command line (an HTTP-only flag with stdio too), 3 an HTTP server that could
not listen, 141 output into a closed pipe (``run``: 1 the flow failed, 2 a usage or
loading error; ``validate``: 1 a flow file has a problem). Errors are one line on
stderr; under stdio, stdout carries nothing but MCP.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from contextlib import redirect_stdout
from typing import Any

from .cli_build import Built, build_server, load_executor
from .cli_errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INVALID,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_SERVE_FAILED,
    EXIT_USAGE,
    CommandError,
    redacted,
)
from .cli_flows import flows_command
from .cli_graph import graph_document
from .cli_options import PROG, build_parser, http_defaults
from .cli_prompts import format_prompts
from .cli_run import run_command
from .cli_runs import runs_command
from .cli_validate import static_problems, validate_command
from .errors import ChainWeaverError
from .migrate_cli import migrate_command

# ------------------------------------------------------------------ output


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)),
                       row[-1]]) for row in rows]


def format_table(server: Any, prompts: bool = False) -> str:
    """The exposure decision as two aligned tables: exposed flows, then excluded ones
    (with ``prompts``, then each published prompt as clients receive it)."""
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
    return "\n".join(lines + (format_prompts(server) if prompts else []))


def format_json(server: Any, prompts: bool = False) -> str:
    document: dict[str, Any] = {
        "flows": [entry.to_dict() for entry in server.exposure_report()],
        "tools": server.registered_tool_names,
        "resources": server.resource_uris,
        "prompts": server.prompt_names,
    }
    if prompts:
        document["prompt_templates"] = server.prompt_templates()
    return json.dumps(document, indent=2)


def _summary(built: Built, args: argparse.Namespace) -> str:
    server, files, tools = built.server, built.files, built.tools
    report = server.exposure_report()
    exposed = [entry.flow_name for entry in report if entry.exposed]
    lines = [f"{PROG}: loaded {files} flow file(s) and {tools} tool(s)",
             f"{PROG}: exposed {len(exposed)} of {len(report)} flows: "
             f"{', '.join(exposed) or 'none'}"]
    lines += [f"{PROG}: excluded {e.flow_name} v{e.version}: {e.reason}"
              for e in report if not e.exposed]
    if args.command == "worker":
        lines.append(f"{PROG}: running task flows from {redacted(args.tasks)}")
        return "\n".join(lines)
    where = (f"http://{args.host}:{args.port}/mcp" if args.transport == "streamable-http"
             else "stdio")
    lines.append(f"{PROG}: serving {len(server.registered_tool_names)} tool(s), "
                 f"{len(server.resource_uris)} resource(s), {len(server.prompt_names)} "
                 f"prompt(s) on {where}")
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def graph(args: argparse.Namespace) -> str:
    """The latest version of flow ``args.graph`` in the flow files, as Mermaid, or as
    JSON with ``--json`` (no server is built: only tools and flow files are loaded and
    checked)."""
    from .plan import mermaid

    executor, loaded = load_executor(args.paths, args.tools)
    flows = [flow for flow in loaded.values() if flow.name == args.graph]
    if not flows:
        raise CommandError(EXIT_INVALID, f"--graph: no flow named {args.graph!r} in the "
                           "flow files")
    flow = max(flows, key=lambda flow: flow.version_key)
    if args.json:
        return json.dumps(graph_document(flow), indent=2)
    return mermaid(flow)


def invalid_flows(server: Any) -> list[str]:
    """``--strict``: each excluded flow that is invalid (whatever the policy), with why."""
    executor = server.executor
    found = []
    for entry in server.exposure_report():
        if entry.exposed:
            continue
        flow = executor.registry.get_flow(entry.flow_name, entry.version)
        problems = static_problems(executor, flow)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            found.append(f"{entry.flow_name} v{entry.version}: {problems[0][1]}{more}")
    return found


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
    if args.command == "run":
        return run_command(args)
    if args.command == "validate":
        return validate_command(args)
    if args.command == "flows":
        return flows_command(args)
    if args.command == "migrate":
        return migrate_command(args)
    if args.command == "runs":
        return runs_command(args)
    http_defaults(args)
    try:
        # Tools modules may print while importing; stdout is only for MCP or the report.
        if args.command == "worker":
            _check_worker(args)
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
        print(format_json(built.server, args.prompts) if args.json
              else format_table(built.server, args.prompts))
        sys.stdout.flush()  # a closed pipe shows here, inside main's handler
        invalid = invalid_flows(built.server) if args.strict else []
        if invalid:
            raise CommandError(EXIT_INVALID, f"--strict: {len(invalid)} flow(s) excluded as "
                               f"invalid: {'; '.join(invalid)}")
        return EXIT_OK
    print(_summary(built, args), file=sys.stderr, flush=True)
    if args.command == "worker":
        return run_worker(built.server, args)
    for warning in _serve_warnings(args):
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    endpoint = _metrics_endpoint(built, args)
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
    finally:
        if endpoint is not None:
            endpoint.stop()
    return EXIT_OK


def _metrics_endpoint(built: Built, args: argparse.Namespace) -> Any:
    """``--metrics-port``: the Prometheus endpoint, started (None without the flag)."""
    if built.metrics is None:
        return None
    from .mcp.runs.prometheus import MetricsEndpoint

    try:
        endpoint = MetricsEndpoint(built.metrics, args.metrics_host, args.metrics_port)
    except OSError as error:
        raise CommandError(EXIT_SERVE_FAILED, f"--metrics-port: cannot listen on "
                           f"{args.metrics_host}:{args.metrics_port}: "
                           f"{error.strerror or error}") from None
    print(f"{PROG}: metrics on http://{args.metrics_host}:{endpoint.port}/metrics",
          file=sys.stderr, flush=True)
    return endpoint.start()


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
    """``chainweaver worker``: run task flows until interrupted, logging each task it
    picks up, resumes and ends to stderr (``--log-level``, INFO by default)."""
    import logging

    worker_log = logging.getLogger("chainweaver.worker")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    worker_log.addHandler(handler)
    worker_log.setLevel((args.log_level or "info").upper())
    try:
        server.run_worker()
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _serve_warnings(args: argparse.Namespace) -> list[str]:
    """What an operator should know before the server listens."""
    from .mcp.gate.http_guard import is_loopback

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
    for flag, path in (("--auth-token-file", args.auth_token_file),
                       ("--request-state-key-file", args.request_state_key_file)):
        if path is not None and _readable_by_others(path):
            warnings.append(f"{flag} {path} is readable by other users (chmod 600 {path})")
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
