"""``chainweaver serve PATH... --tools MODULE [options]``: serve the flows the policy
allows over MCP (stdio, or streamable HTTP), until interrupted.

Everything is loaded and judged, and every Redis store answers (:mod:`.stores`), before
anything is served, and reported on stderr: under stdio, stdout carries nothing but MCP.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .building import Built, build_server, loading_errors
from .errors import EXIT_OK, EXIT_SERVE_FAILED, CommandError
from .options import http_defaults, server_options
from .output import PROG
from .stores import check_stores, name_queue_outages


def add_parser(subparsers: Any) -> None:
    subparsers.add_parser("serve", parents=[server_options()], help="serve flows over MCP",
                          description="Serve the flows the policy allows over MCP.")


def run(args: argparse.Namespace) -> int:
    http_defaults(args)
    with loading_errors():
        built = build_server(args)
    check_stores(args)
    name_queue_outages(args.tasks)
    where = (f"http://{args.host}:{args.port}/mcp" if args.transport == "streamable-http"
             else "stdio")
    server = built.server
    summary = [*built.report(),
               f"{PROG}: serving {len(server.registered_tool_names)} tool(s), "
               f"{len(server.resource_uris)} resource(s), {len(server.prompt_names)} "
               f"prompt(s) on {where}"]
    print("\n".join(summary), file=sys.stderr, flush=True)
    for warning in _serve_warnings(args):
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    endpoint = _metrics_endpoint(built, args)
    try:
        server.serve(args.transport, host=args.host, port=args.port,
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
    from ..mcp.runs.prometheus import MetricsEndpoint

    try:
        endpoint = MetricsEndpoint(built.metrics, args.metrics_host, args.metrics_port)
    except OSError as error:
        raise CommandError(EXIT_SERVE_FAILED, f"--metrics-port: cannot listen on "
                           f"{args.metrics_host}:{args.metrics_port}: "
                           f"{error.strerror or error}") from None
    print(f"{PROG}: metrics on http://{args.metrics_host}:{endpoint.port}/metrics",
          file=sys.stderr, flush=True)
    return endpoint.start()


def _serve_warnings(args: argparse.Namespace) -> list[str]:
    """What an operator should know before the server listens."""
    from ..mcp.gate.http_guard import is_loopback

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
