"""``chainweaver migrate SRC... --out DIR``: reference-package flow files to ChainWeaver.

Each source file (``.yaml``, ``.yml`` or ``.json``; directories are searched
recursively) is read with ChainWeaver's own reader and limits, converted by
:mod:`chainweaver.migrate`, checked with ChainWeaver's loader (:func:`flow_from_data`,
which imports the schema and exception classes it names) and written to
``DIR/<stem>.flow.yaml`` (or ``.flow.json`` for JSON sources).

What is written: every file that converts completely and loads. A file with fields
ChainWeaver cannot express is not written (``--partial`` writes it without them); a file
that is not a reference flow, or whose result does not load, is never written. Every
left-out field is reported on stderr as ``FILE: FIELD: why``. Exit status: 0 when every
file was written completely, 1 when anything was left out or invalid, 2 for usage
errors (no such source, no flow files in a directory, ``--out`` is a file).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FlowFileError
from ..files import YAML_INSTALL_HINT, flow_from_data, read_flow_data
from ..migrate import Finding, MigrationError, convert
from .errors import EXIT_OK, EXIT_USAGE

EXIT_PROBLEMS = 1  # a field left out, or a file not written
SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class Outcome:
    """What became of one source file."""

    source: Path
    target: Path | None = None  # written here (None: not written)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None  # why nothing could be written


def add_parser(subparsers: Any) -> None:
    migrate = subparsers.add_parser(
        "migrate", help="convert reference-package (chainweaver 0.14) flow files",
        description="Convert flow files of the reference package (chainweaver 0.14 on "
                    "PyPI: Flow and DAGFlow, YAML or JSON) into ChainWeaver flow files. "
                    "Every field that cannot be expressed is reported; results are "
                    "checked with ChainWeaver's loader before they are written. Exit "
                    "status: 0 all converted, 1 anything left out or invalid, 2 usage.")
    migrate.add_argument("sources", nargs="+", metavar="SRC",
                         help="reference flow files, or directories to search for "
                              "*.yaml, *.yml and *.json files")
    migrate.add_argument("--out", required=True, metavar="DIR", type=Path,
                         help="the directory to write ChainWeaver flow files to "
                              "(created if missing)")
    migrate.add_argument("--partial", action="store_true",
                         help="also write files with fields that cannot be expressed, "
                              "without those fields (they are still reported, exit 1)")


def source_files(sources: list[str], out: Path | None = None) -> list[Path]:
    """The files to convert; FileNotFoundError names a missing source. Directories are
    searched outside ``out`` (a second run must not read the first one's results)."""
    found: list[Path] = []
    skip = None if out is None else out.resolve()
    for raw in sources:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                           and (skip is None or skip not in p.resolve().parents))
            if not files:
                raise FileNotFoundError(f"{path}: no .yaml, .yml or .json files in this "
                                        "directory")
            found.extend(f for f in files if f not in found)
        elif path.is_file():
            if path not in found:
                found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    return found


def target_name(source: Path) -> str:
    """``orders.flow.yaml`` and ``orders.yml`` become ``orders.flow.yaml``."""
    stem = source.name
    for suffix in (*SUFFIXES, ".flow"):
        stem = stem.removesuffix(suffix)
    return f"{stem or 'flow'}.flow.{'json' if source.suffix == '.json' else 'yaml'}"


def migrate_file(source: Path, out: Path, *, partial: bool = False) -> Outcome:
    """Convert, check and (unless something is left out, or with ``partial``) write one
    file."""
    outcome = Outcome(source)
    try:
        data = read_flow_data(source)
        converted, outcome.findings = convert(data)
    except FlowFileError as error:
        outcome.error = error.problem if error.field is None \
            else f"{error.field}: {error.problem}"
        return outcome
    except MigrationError as error:
        outcome.error = f"not a reference flow: {error}"
        return outcome
    except ModuleNotFoundError:
        outcome.error = f"YAML files need PyYAML: {YAML_INSTALL_HINT}"
        return outcome
    except Exception as error:  # a converter bug must not cost the other files' report
        outcome.error = f"cannot be converted ({type(error).__name__}: {error})"
        return outcome
    target = out / target_name(source)
    try:
        flow_from_data(converted, target, imports=True)  # migrate imports, as documented
    except FlowFileError as error:
        where = f"{error.field}: " if error.field else ""
        hint = (" (the reference returned the whole context: give the source an "
                "output_schema_ref, which becomes the output_schema)"
                if "all end the flow" in error.problem else "")
        outcome.error = f"the converted flow does not load: {where}{error.problem}{hint}"
        return outcome
    except Exception as error:  # a loader bug must not cost the other files' report
        outcome.error = (f"the converted flow does not load ({type(error).__name__}: "
                         f"{str(error)[:200]})")
        return outcome
    if outcome.findings and not partial:
        return outcome
    text = (json.dumps(converted, indent=2) + "\n" if target.suffix == ".json"
            else _yaml(converted))
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as error:
        outcome.error = f"{target} cannot be written: {error.strerror or error}"
        return outcome
    outcome.target = target
    return outcome


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True,
                              default_flow_style=False, width=4096))


def run(args: argparse.Namespace) -> int:
    """Run ``chainweaver migrate``; the exit status."""
    out: Path = args.out
    try:
        files = source_files(args.sources, out)
    except FileNotFoundError as error:
        print(f"chainweaver migrate: {error}", file=sys.stderr)
        return EXIT_USAGE
    if out.exists() and not out.is_dir():
        print(f"chainweaver migrate: --out {out}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    status = EXIT_OK
    for source in files:
        name = target_name(source)
        if name in written:
            print(f"{source}: not written: {out / name} is already written for "
                  f"{written[name]} (rename one of them)", file=sys.stderr)
            status = EXIT_PROBLEMS
            continue
        outcome = migrate_file(source, out, partial=args.partial)
        for finding in outcome.findings:
            print(f"{source}: {finding.field}: {finding.message}", file=sys.stderr)
        if outcome.error is not None:
            print(f"{source}: not written: {outcome.error}", file=sys.stderr)
        elif outcome.target is None:
            print(f"{source}: not written: {len(outcome.findings)} field(s) cannot be "
                  "expressed (--partial writes the rest)", file=sys.stderr)
        else:
            written[name] = source
            left = f" without {len(outcome.findings)} field(s)" if outcome.findings else ""
            print(f"{source} -> {outcome.target}{left}")
        if outcome.error is not None or outcome.findings:
            status = EXIT_PROBLEMS
    print(f"chainweaver migrate: {len(written)} of {len(files)} file(s) written to {out}",
          file=sys.stderr)
    return status
