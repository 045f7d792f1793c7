"""``chainweaver dev PATH... --tools MODULE [serve options]``: serve the flows and open
the MCP Inspector against them, for trying flows out while writing them.

Everything is loaded and judged first, as ``serve`` would; then the Inspector (the npm
package ``@modelcontextprotocol/inspector``, started with ``npx``, so Node.js is needed)
starts ``chainweaver serve`` over stdio with the same options, reloading edited flow
files (``--watch``, on unless ``--no-watch``). ``dev`` runs until the Inspector stops
(Ctrl-C), and exits with its status.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Any

from .building import build_server, loading_errors
from .clients import (
    add_client_options,
    given_environment,
    serve_command,
    server_environment,
)
from .errors import EXIT_MISSING, EXIT_OK, CommandError
from .options import http_defaults, port_number, server_options
from .output import PROG

INSPECTOR = "@modelcontextprotocol/inspector"


def add_parser(subparsers: Any) -> None:
    dev = subparsers.add_parser(
        "dev", parents=[server_options()],
        help="serve flows and open the MCP Inspector on them (needs Node.js)",
        description="Load and check the flows as serve does, then start the MCP "
                    f"Inspector ({INSPECTOR}, through npx) on chainweaver serve with the "
                    "same options, reloading edited flow files.")
    dev.set_defaults(watch=True)
    dev.add_argument("--no-watch", dest="watch", action="store_false",
                     help="do not reload edited flow files")
    add_client_options(dev)
    inspector = dev.add_argument_group("the MCP Inspector")
    inspector.add_argument("--inspector-version", metavar="VERSION",
                           help="the Inspector's npm version (default: the latest)")
    inspector.add_argument("--ui-port", type=port_number, metavar="PORT",
                           help="the Inspector's web page (CLIENT_PORT; its default: 6274)")
    inspector.add_argument("--server-port", type=port_number, metavar="PORT",
                           help="the Inspector's second port (SERVER_PORT: its proxy, or "
                                "its MCP Apps sandbox; its default: 6277)")


def run(args: argparse.Namespace) -> int:
    command = serve_command(args)
    given = given_environment(args)
    http_defaults(args)
    with loading_errors():
        built = build_server(args)
    npx = shutil.which("npx.cmd" if sys.platform == "win32" else "npx")
    if npx is None:
        raise CommandError(EXIT_MISSING, f"dev needs Node.js: npx is not on PATH (the MCP "
                           f"Inspector is the npm package {INSPECTOR}); without it, run "
                           f"{PROG} serve and connect any MCP client")
    env = server_environment(given, args.tools)
    inspector = INSPECTOR + (f"@{args.inspector_version}" if args.inspector_version else "")
    argv = [npx, "--yes", inspector]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv += ["--", *command]
    ports = {name: str(port) for name, port in (("CLIENT_PORT", args.ui_port),
                                                 ("SERVER_PORT", args.server_port))
             if port is not None}
    print("\n".join([*built.report(), f"{PROG}: starting the MCP Inspector ({inspector}) "
                     f"on: {' '.join(command)}"]), file=sys.stderr, flush=True)
    try:
        return subprocess.run(argv, env={**os.environ, **ports}, check=False).returncode
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C is how a developer stops it
    except OSError as error:
        raise CommandError(EXIT_MISSING, f"npx could not be started: "
                           f"{error.strerror or error}") from None
