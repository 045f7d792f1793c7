"""``chainweaver install CLIENT PATH... --tools MODULE [serve options]``: write the MCP
server entry that makes a client start ``chainweaver serve`` on these flows.

    chainweaver install claude-desktop PATH... --tools MODULE [--name NAME] [--env K=V]
    chainweaver install cursor PATH... --tools MODULE [--workspace DIR]
    chainweaver install vscode PATH... --tools MODULE [--workspace DIR | --user]
    chainweaver install json PATH... --tools MODULE      (print the entry)

Everything is loaded and judged first, as ``serve`` would (a flow file or tools module
that does not load writes nothing). The entry runs this environment's Python with
absolute paths (:mod:`.clients`); it is merged into the client's file, keeping every
other server, under ``--name`` (the MCP server name too; default ``chainweaver``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from .building import build_server, loading_errors
from .clients import (
    add_client_options,
    entry,
    given_environment,
    put_entry,
    read_config,
    serve_command,
    server_environment,
    write_json,
)
from .errors import EXIT_MISSING, EXIT_OK, EXIT_USAGE, CommandError
from .options import http_defaults, server_options
from .output import PROG


class Client(NamedTuple):
    title: str  # as messages name it
    section: str  # the key holding the servers in its file
    then: str  # what to do once the file is written


CLIENTS = {
    "claude-desktop": Client("Claude Desktop", "mcpServers",
                             "restart Claude Desktop to start it"),
    "cursor": Client("Cursor", "mcpServers", "Cursor starts it from its MCP settings"),
    "vscode": Client("VS Code", "servers", "start it from the MCP: List Servers command"),
    "json": Client("any client", "mcpServers", ""),
}


def add_parser(subparsers: Any) -> None:
    install = subparsers.add_parser(
        "install", help="add these flows to an MCP client's configuration",
        description="Load and check the flows as serve does, then write the client's MCP "
                    "server entry that starts chainweaver serve on them (this "
                    "environment's Python, absolute paths, the serve options given), "
                    "keeping the other servers of its file; 'json' prints the entry.")
    clients = install.add_subparsers(dest="client", metavar="CLIENT", required=True)
    for name, client in CLIENTS.items():
        parser = clients.add_parser(
            name, parents=[server_options()],
            help=f"print the server entry, for {client.title}" if name == "json"
            else f"write the server entry into {client.title}'s configuration")
        add_client_options(parser)
        if name in ("cursor", "vscode"):
            parser.add_argument("--workspace", metavar="DIR",
                                help="DIR/.cursor/mcp.json instead of ~/.cursor/mcp.json"
                                if name == "cursor" else "DIR/.vscode/mcp.json (default: "
                                "the current folder)")
        if name == "vscode":
            parser.add_argument("--user", action="store_true",
                                help="the user profile's mcp.json instead of a workspace's")
        if name != "json":
            parser.add_argument("--config", metavar="FILE",
                                help="write this file instead of the client's own (in its "
                                     "format)")


def run(args: argparse.Namespace) -> int:
    client = CLIENTS[args.client]
    command = serve_command(args)
    target = None if args.client == "json" else config_path(args)
    # Refused before anything is loaded: a file that is not a configuration stays as is.
    document = {} if target is None else read_config(target, client.section)
    given = given_environment(args)
    http_defaults(args)
    with loading_errors():
        built = build_server(args)
    env = server_environment(given, args.tools)
    print("\n".join(built.report()), file=sys.stderr, flush=True)
    new = entry(command, env, vscode=args.client == "vscode")
    if target is None:
        print(json.dumps({args.name: new}, indent=2), flush=True)
        return EXIT_OK
    done = put_entry(document, client.section, args.name, new)
    write_json(target, document, private=bool(env) and not target.exists())
    print(f"{PROG}: {done} server {args.name!r} in {client.title}'s configuration "
          f"{shown_path(target)}: {client.then}", file=sys.stderr, flush=True)
    return EXIT_OK


def config_path(args: argparse.Namespace) -> Path:
    """The file the entry goes into (checked before anything is loaded)."""
    workspace_dir = getattr(args, "workspace", None)
    user = getattr(args, "user", False)
    if user and workspace_dir is not None:
        raise CommandError(EXIT_USAGE, "give --workspace or --user, not both")
    if args.config is not None:
        return Path(args.config).absolute()
    if workspace_dir is not None or (args.client == "vscode" and not user):
        workspace = Path(workspace_dir or ".").absolute()
        if not workspace.is_dir():
            raise CommandError(EXIT_MISSING, f"--workspace {workspace}: no such folder")
        hidden = ".cursor" if args.client == "cursor" else ".vscode"
        return workspace / hidden / "mcp.json"
    folder, file = {"claude-desktop": (app_config_dir("Claude"), "claude_desktop_config.json"),
                    "cursor": (Path.home() / ".cursor", "mcp.json"),
                    "vscode": (app_config_dir("Code") / "User", "mcp.json")}[args.client]
    if not folder.is_dir():
        raise CommandError(EXIT_MISSING, f"{CLIENTS[args.client].title}'s configuration "
                           f"folder {folder} does not exist: is it installed, and has it "
                           "run once? (--config FILE writes another file)")
    return folder / file


def shown_path(path: Path) -> str:
    """``path`` as a person reads it: the shortest of its absolute form, its form
    relative to the current folder and its ``~/...`` form (the last two when it is
    inside those folders)."""
    forms = [str(path)]
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            forms.append(prefix + str(path.relative_to(base)))
        except ValueError:
            continue
    return min(forms, key=len)


def app_config_dir(app: str) -> Path:
    """Where a desktop application keeps its settings on this platform."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / app
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA", Path.home() / "AppData" / "Roaming")) / app
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / app
