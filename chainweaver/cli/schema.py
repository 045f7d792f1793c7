"""``chainweaver schema``: print the JSON Schema that flow files follow, for editors and
CI checks."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .errors import EXIT_OK
from .output import json_text


def add_parser(subparsers: Any) -> None:
    subparsers.add_parser("schema", help="print the JSON Schema of flow files",
                          description="Print the JSON Schema that flow files follow, for "
                                      "editors and CI checks.")


def run(args: argparse.Namespace) -> int:
    from ..flow_format import flow_file_schema

    try:
        print(json_text(flow_file_schema()), flush=True)
    except BrokenPipeError:
        # `chainweaver schema | head`: the reader has all it wanted. Point stdout at
        # devnull so that the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK
