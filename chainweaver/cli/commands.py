"""The list of ``chainweaver`` commands: the parser is built from it and every command
line runs through it.

A command is a module of this package with two functions: ``add_parser(subparsers)``
adds its parser (named as its key below) and ``run(args)`` runs it and returns the exit
code. Adding a command is a module and a line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

from .. import __version__
from . import flows, inspect, migrate, run, runs, schema, serve, validate, worker
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
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Serve ChainWeaver flow files to MCP clients.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(subparsers)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; its exit code."""
    return COMMANDS[args.command].run(args)
