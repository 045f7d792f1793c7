"""``chainweaver card PATH... --tools MODULE [options]``: print (or write) the server
card ``serve`` would answer an anonymous caller at ``<endpoint>/server-card``.

Takes every serve option, and builds the card from the same exposure decision: only
what a caller without credentials may list is named (nothing, when the server wants a
token). ``--url`` is the endpoint clients reach (default: the serve options' own).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .building import build_server, loading_errors
from .errors import EXIT_OK, EXIT_USAGE, CommandError
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


def run(args: argparse.Namespace) -> int:
    http_defaults(args)
    url = endpoint_url(args)
    with loading_errors():
        server = build_server(args).server
    emit(server.server_card(url), args.output, "the server card")
    return EXIT_OK
