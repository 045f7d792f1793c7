"""The list of ``chainweaver`` commands: the parser is built from it and every command
line runs through it.

A command is a module of this package with two functions: ``add_parser(subparsers)``
adds its parser (named as its key below) and ``run(args)`` runs it and returns the exit
code. Adding a command is a module and a line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from typing import Any, Protocol

from .. import __version__
from . import (
    card,
    dev,
    flows,
    inspect,
    install,
    migrate,
    run,
    runs,
    schema,
    serve,
    server_json,
    validate,
    worker,
)
from .loading import import_from_cwd
from .output import PROG


class Command(Protocol):
    """What a command module provides."""

    def add_parser(self, subparsers: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# In the order ``chainweaver --help`` lists them.
COMMANDS: dict[str, Command] = {
    "serve": serve,
    "inspect": inspect,
    "worker": worker,
    "schema": schema,
    "run": run,
    "validate": validate,
    "migrate": migrate,
    "flows": flows,
    "runs": runs,
    "install": install,
    "dev": dev,
    "card": card,
    "server-json": server_json,
}


class VersionAction(argparse.Action):
    """``--version``: ChainWeaver's version and each extra's packages in use."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_report(__version__), flush=True)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Serve ChainWeaver flow files to MCP clients.")
    parser.add_argument("--version", action=VersionAction,
                        help="show ChainWeaver's version and those of FastMCP and the MCP "
                             "SDK in use (or 'not installed'), then exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(subparsers)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; its exit code. Every command imports tools
    modules and the models flow files name by the same rules (:mod:`.loading`)."""
    import_from_cwd()
    return COMMANDS[args.command].run(args)


# The packages of each extra a user would ask about, as (import name, distribution).
EXTRA_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "mcp": (("fastmcp", "fastmcp"), ("mcp", "mcp")),
    "tasks": (("fastmcp_tasks", "fastmcp-tasks"), ("redis", "redis")),
    "yaml": (("yaml", "pyyaml"),),
}


def installed_version(module: str, distribution: str) -> str | None:
    """The version of ``distribution`` when ``module`` can be imported here (None when it
    cannot). Looks the module up without importing it: cheap enough for ``--version``."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def version_report(version: str) -> str:
    """What ``chainweaver --version`` prints: ChainWeaver's ``version``, then each
    extra's packages with the version in use, or "not installed"."""
    lines = [f"chainweaver {version}"]
    for extra, packages in EXTRA_PACKAGES.items():
        for module, distribution in packages:
            found = installed_version(module, distribution)
            lines.append(f"{distribution} {found or 'not installed'} ({extra} extra)")
    return "\n".join(lines)
