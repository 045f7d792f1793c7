"""``chainweaver validate PATH... [--tools MODULE] [--json]``.

Every flow file is read and built on its own, so one bad file never hides the problems
of the next; each problem carries its file, line and flow. Without ``--tools`` the
checks are the loader's (syntax, keys, types, values, names, versions, model
references, inline schemas, prompts, step ids, ``after`` and ``when``) and duplicate
flows; with ``--tools`` also the static checks that keep a server from publishing a
flow (tools, fields and sub-flows exist, retries, concurrent writes, the data flow, a
publishable input and output schema). Never imports the MCP extra: fast enough for a
pre-commit hook.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import FlowFileError, printable
from ..executor import FlowExecutor
from ..files import find_flow_files, flow_from_data, read_flow_data
from ..flows import Flow
from ..registry import FlowRegistry
from ..schemas import model_json_schema
from .errors import EXIT_INVALID, EXIT_MISSING, EXIT_OK, CommandError
from .loading import register_tools
from .locate import line_of
from .options import add_flow_sources
from .output import json_text


def add_parser(subparsers: Any) -> None:
    validate = subparsers.add_parser(
        "validate", help="check flow files and report every problem",
        description="Check every flow file under PATH as serve would load and judge it, "
                    "and report every problem with its file, line and flow. With --tools, "
                    "the steps are also checked against the tools: tools and fields exist, "
                    "sub-flows, retries and the data flow. Exit codes: 0 no problem, 1 "
                    "problems found, 2 a usage or loading error.")
    add_flow_sources(validate, tools_required=False)
    validate.add_argument("--json", dest="format", action="store_const", const="json",
                          default="text", help="print one JSON document for scripts")
    # The older spelling, kept working: --json is how every command says it.
    validate.add_argument("--format", choices=("text", "json"), help=argparse.SUPPRESS)


@dataclass(frozen=True)
class Finding:
    """One problem: where (file, line, flow, field) and what (kind, message)."""

    file: str
    line: int | None
    flow: str | None
    field: str | None
    kind: str
    message: str

    def text(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        parts = [where, self.flow, self.field, self.message]
        return ": ".join(part for part in parts if part)


def static_problems(executor: FlowExecutor, flow: Flow) -> list[tuple[str, str, str | None]]:
    """(kind, message, field) of each reason a server would exclude ``flow`` as invalid,
    whatever its policy: the executor's static checks, then an input model that is
    unknown or a schema that cannot be generated (what ``FlowServer`` publishes)."""
    problems = executor.flow_problems(flow)
    found = [(problem.kind, problem.message, _step_field(flow, problem.step_id, problem.field))
             for problem in problems]
    if any(problem.fatal for problem in problems):
        return found  # the models below come from what is missing: said already
    input_model = executor.plan(flow).input_model  # what runs check and servers publish
    where = "input_schema" if flow.input_schema is not None else "steps[0]"
    if input_model is None:
        found.append(("ContractError", "its input model is unknown", where))
        return found
    models = [("input", input_model, where, "validation")]
    output_model = executor.output_model(flow)
    if output_model is not None:
        models.append(("output", output_model, "output_schema", "serialization"))
    for side, model, field, mode in models:
        try:
            schema = (model_json_schema(model) if mode == "validation"
                      else model.model_json_schema(mode="serialization"))
            json.dumps(schema, allow_nan=False)
        except Exception as error:  # pydantic raises several types; a NaN default, ...
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            found.append(("ContractError", f"its {side} JSON Schema cannot be published "
                          f"from {model.__name__}: {detail}", field))
    return found


def _step_field(flow: Flow, step_id: str | None, field: str | None) -> str | None:
    """The flow-file field a static problem is about: the step, or its mapping entry."""
    if step_id is None:
        return "output_schema" if field is not None and flow.output_schema else None
    if step_id not in flow.step_ids:
        return None
    index = flow.step_ids.index(step_id)
    if field is not None and field in flow.steps[index].input_mapping:
        return f"steps[{index}].input_mapping.{field}"
    return f"steps[{index}]"


class Validation:
    """The findings of one ``validate`` command, gathered file by file."""

    def __init__(self, executor: FlowExecutor | None) -> None:
        self.executor = executor
        self.findings: list[Finding] = []
        self.flows: dict[Path, Flow] = {}
        self.unchecked_models: set[str] = set()  # modules only --tools would provide

    def add(self, path: Path, field: str | None, kind: str, message: str,
            flow: str | None) -> None:
        self.findings.append(Finding(str(path), line_of(path, field, message), flow, field,
                                     kind, message))

    def load(self, path: Path) -> None:
        """Read and build one file; a problem is recorded, never raised."""
        name = None
        try:
            data = read_flow_data(path)
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                name = printable(data["name"])  # a report line, never a terminal command
            if self.executor is None and isinstance(data, dict):
                data = self._without_unfound_models(data)
            self.flows[path] = flow_from_data(data, path)
        except FlowFileError as error:
            self.add(path, error.field, "FlowFileError", error.problem, name)

    def _without_unfound_models(self, data: dict[str, Any]) -> dict[str, Any]:
        """Without ``--tools``, a model reference to a module that is not imported (the
        tools module, which ``--tools`` would import, as serve does) is left unchecked,
        and said so in the summary, rather than reported as a problem: the rest of the
        file is still checked. With ``--tools`` it is a problem. A flow file never makes
        ``validate`` import a module (its code would run)."""
        kept = dict(data)
        for key in ("input_schema", "output_schema"):
            reference = data.get(key)
            if not isinstance(reference, str):
                continue
            module, colon, attribute = reference.partition(":")
            if module and colon and attribute and module not in sys.modules:
                kept[key] = None
                self.unchecked_models.add(module)
        return kept

    def check_duplicates(self) -> None:
        defined: dict[tuple[str, tuple], Path] = {}
        for path, flow in list(self.flows.items()):
            key = (flow.name, flow.version_key)
            if key in defined:
                self.add(path, "version", "DuplicateFlowError", f"flow {flow.name!r} version "
                         f"{flow.version!r} is already defined in {defined[key]}", flow.name)
                del self.flows[path]  # judged by the first file, as the loader would
            else:
                defined[key] = path

    def check_flows(self) -> None:
        """The static checks, with every flow registered so sub-flows resolve."""
        if self.executor is None:
            return
        for flow in self.flows.values():
            self.executor.registry.register_flow(flow)
        for path, flow in self.flows.items():
            for kind, message, field in static_problems(self.executor, flow):
                self.add(path, field, kind, message, flow.name)

    def report(self, files: int, output_format: str) -> str:
        self.findings.sort(key=lambda f: (f.file, f.line or 0))  # stable: check order kept
        unchecked = sorted(self.unchecked_models)
        if output_format == "json":
            return json_text({"files": files, "flows": len(self.flows),
                              "tools_checked": self.executor is not None,
                              "models_unchecked": unchecked,
                              "problems": [asdict(f) for f in self.findings]})
        lines = [finding.text() for finding in self.findings]
        bad = len({finding.file for finding in self.findings})
        if self.findings:
            lines.append(f"{len(self.findings)} problem(s) in {bad} of {files} flow file(s)")
        else:
            lines.append(f"{files} flow file(s) checked: no problems"
                         + ("" if self.executor else " (steps not checked against tools"
                            f"{_models(unchecked)}: give --tools)"))
        return "\n".join(lines)


def _models(modules: list[str]) -> str:
    if not modules:
        return ""
    return f", nor model references to {', '.join(modules)}"


def run(args: argparse.Namespace) -> int:
    """Check the flow files under ``args.paths``; exit 1 when any has a problem."""
    try:
        with redirect_stdout(sys.stderr):  # tools modules may print while importing
            executor = _tools(args.tools)
            files = find_flow_files(args.paths)
            validation = Validation(executor)
            for path in files:
                validation.load(path)
            validation.check_duplicates()
            validation.check_flows()
    except (FileNotFoundError, ModuleNotFoundError) as error:
        raise CommandError(EXIT_MISSING, str(error)) from None
    print(validation.report(len(files), args.format), flush=True)
    return EXIT_INVALID if validation.findings else EXIT_OK


def _tools(specs: Sequence[str]) -> FlowExecutor | None:
    """An executor with the tools of ``specs`` (None: no --tools, no tool checks).
    A tools module that cannot be loaded is a usage error (2), not a flow problem."""
    if not specs:
        return None
    executor = FlowExecutor(FlowRegistry())
    try:
        register_tools(executor, specs)
    except CommandError as error:
        raise CommandError(EXIT_MISSING, str(error)) from None
    return executor
