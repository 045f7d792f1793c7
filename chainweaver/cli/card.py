"""``chainweaver card PATH... --tools MODULE [options]``: print (or write) the server
card ``serve`` would answer an anonymous caller at ``<endpoint>/server-card``.

Takes every serve option, and builds the card from the same exposure decision: only
what a caller without credentials may list is named (nothing, when the server wants a
token). ``--url`` is the endpoint clients reach (default: the serve options' own).
With ``--governance`` the shared state is read and applied first, as serve does before
its first request, or nothing is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from ..governance.state import masked_reason, masked_url
from .building import build_server, loading_errors
from .errors import EXIT_OK, EXIT_SERVE_FAILED, EXIT_USAGE, CommandError
from .options import http_defaults, server_options
from .output import PROG, json_text


def add_parser(subparsers: Any) -> None:
    card = subparsers.add_parser(
        "card", parents=[server_options()], help="print the server card",
        description="Print the server card serve answers an anonymous caller (what it may "
                    "list, and where to connect). Takes every serve option.")
    add_document_options(card)


def add_document_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the MCP endpoint clients reach (default: "
                                      "http://HOST:PORT/mcp from the serve options)")
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="write the document to FILE instead of printing it")


def endpoint_url(args: argparse.Namespace) -> str:
    """``--url``, or the endpoint serve would listen on."""
    url: str | None = args.url
    if url is None:
        return f"http://{args.host}:{args.port}/mcp"
    if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
        raise CommandError(EXIT_USAGE, f"--url {url!r} is not an http:// or https:// URL")
    return url


def emit(document: Any, output: str | None, what: str) -> None:
    """Print ``document`` as JSON, or write it to ``output`` (and say so on stderr)."""
    text = json_text(document)
    if output is None:
        print(text, flush=True)
        return
    try:
        Path(output).write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        raise CommandError(EXIT_USAGE, f"--output {output}: {error.strerror or error}"
                           ) from None
    print(f"{PROG}: wrote {what} to {output}", file=sys.stderr, flush=True)


def governed_server(args: argparse.Namespace) -> Any:
    """The server serve would run, with the shared governance state (``--governance``)
    applied as serve applies it before its first request, so that a document built
    from it names nothing an operator withdrew. When the state cannot be read, exit 3
    and print nothing: the document could name a withdrawn flow."""
    with loading_errors():
        server = build_server(args).server
    try:
        asyncio.run(server.apply_shared_governance())
    except Exception as error:  # unreachable, or a state that cannot be read
        url = args.governance
        raise CommandError(EXIT_SERVE_FAILED, f"cannot read the governance state at "
                           f"{masked_url(url)}: {masked_reason(error, url)}; nothing "
                           "printed (it could name flows governance withdrew)") from None
    return server


def run(args: argparse.Namespace) -> int:
    http_defaults(args)
    url = endpoint_url(args)
    server = governed_server(args)
    emit(server.server_card(url), args.output, "the server card")
    return EXIT_OK
