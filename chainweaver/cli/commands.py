"""The list of ``chainweaver`` commands: the parser is built from it and every command
line runs through it.

A command is a module of this package with two functions: ``add_parser(subparsers)``
adds its parser (named as its key below) and ``run(args)`` runs it and returns the exit
code. Adding a command is a module and a line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

from ..extras import version_report
from . import (
    dev,
    flows,
    inspect,
    install,
    migrate,
    run,
    runs,
    schema,
    serve,
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
}


class VersionAction(argparse.Action):
    """``--version``: ChainWeaver's version and each extra's packages in use."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_report(), flush=True)
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
