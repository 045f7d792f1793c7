"""``chainweaver server-json PATH... --tools MODULE --registry-name NAME [options]``:
print (or write) the MCP registry entry (``server.json``) of the server ``serve``
would run.

Built from the same exposure decision as the server card: it names (without schemas)
only what a caller without credentials may list (with ``--governance``, as the shared
state allows now: see :func:`.card.governed_server`). ``--url`` adds the remote endpoint,
``--pypi NAME==VERSION`` a PyPI package started over stdio.
"""

from __future__ import annotations

import argparse
from typing import Any

from .card import add_document_options, emit, endpoint_url, governed_server
from .errors import EXIT_OK, EXIT_USAGE, CommandError
from .options import http_defaults, server_options


def add_parser(subparsers: Any) -> None:
    entry = subparsers.add_parser(
        "server-json", parents=[server_options()],
        help="print the MCP registry entry (server.json)",
        description="Print the MCP registry entry of the server serve would run. Takes "
                    "every serve option; --registry-name is required.")
    add_document_options(entry)
    entry.add_argument("--pypi", metavar="NAME==VERSION",
                       help="also list a PyPI package that starts this server over stdio")


def run(args: argparse.Namespace) -> int:
    if args.registry_name is None:
        raise CommandError(EXIT_USAGE, "server-json needs --registry-name (the reverse-DNS "
                                       "name the registry knows the server by, "
                                       "io.github.me/orders)")
    http_defaults(args)
    pypi = _package(args.pypi) if args.pypi is not None else None
    url = endpoint_url(args) if args.url is not None or pypi is None else None
    server = governed_server(args)
    emit(server.registry_entry(url=url, pypi=pypi), args.output, "the registry entry")
    return EXIT_OK


def _package(text: str) -> tuple[str, str]:
    name, _, version = text.partition("==")
    if not name.strip() or not version.strip() or version.strip() == "latest":
        raise CommandError(EXIT_USAGE, f"--pypi {text!r}: give NAME==VERSION (an exact "
                                       "version)")
    return name.strip(), version.strip()
