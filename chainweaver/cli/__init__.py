"""The ``chainweaver`` command: serve flow files over MCP, inspect what would be served,
run a flow once, validate flow files, and govern and follow flows being served.

    chainweaver serve PATH... --tools MODULE [options]
    chainweaver worker PATH... --tools MODULE --tasks redis://... [options]
    chainweaver inspect PATH... --tools MODULE [options] [--json] [--graph FLOW] [--strict]
    chainweaver run FLOW PATH... --tools MODULE [--input JSON | --input-file FILE]
    chainweaver validate PATH... [--tools MODULE] [--json]
    chainweaver migrate SRC... --out DIR [--partial]
    chainweaver schema
    chainweaver flows archive|activate|deprecate|withdraw|status ...
    chainweaver runs list|show ... --store redis://...
    chainweaver install claude-desktop|cursor|vscode|json PATH... --tools MODULE [options]
    chainweaver dev PATH... --tools MODULE [options]

Everything (tools, flow files, policy, token and instructions files, the exposure
decision) is loaded and checked before anything is served, so a bad file never starts a
half-configured server. Exit codes: 0 success, 1 invalid flow file, tool set, policy or
setting, 2 a missing (or unloadable) file or module, and argparse's usual 2 for a
malformed command line (an HTTP-only flag with stdio too), 3 an HTTP server that could
not listen or a Redis store not reached within --store-wait, 141 output into a closed
pipe (``run``: 1 the flow failed, 2 a usage or loading error; ``validate``: 1 a flow
file has a problem). Errors are one line on stderr; under stdio, stdout carries nothing
but MCP.

Each command is a module of this package; :mod:`chainweaver.cli.commands` lists them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ..errors import printable
from .commands import build_parser, run_command
from .errors import EXIT_BROKEN_PIPE, EXIT_MISSING, CommandError
from .output import PROG

__all__ = ["main"]


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
        return run_command(args)
    except CommandError as error:
        message = printable(" ".join(str(error).split("\n")))  # one line, no escapes
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return error.code
