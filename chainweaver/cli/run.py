"""``chainweaver run FLOW PATH... --tools MODULE``: run one flow from the command line.

The output goes to stdout as JSON and a table of the steps to stderr, so
``chainweaver run ... | jq`` works; ``--json`` prints one document with both instead.
While the flow runs, each step is shown on stderr as it starts and ends
(:mod:`.progress`).
Exit codes: 0 the flow succeeded, 1 it failed (its error names the step and the field),
2 a usage or loading error (bad input JSON, a flow file or tools module that does not
load, no such flow or version, a flow that cannot run at all).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from ..errors import ChainWeaverError, FlowNotFoundError
from ..executor import FlowExecutor
from ..grants import Caller
from ..results import ErrorInfo, ExecutionResult, StepRecord, describe_error, step_table
from ..run_events import ALWAYS_APPROVE, ApprovalHook, ApprovalRequest, approval_request
from .errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, CommandError
from .loading import load_executor
from .options import add_flow_sources
from .output import PROG, json_text
from .progress import progress_for

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell shows for Ctrl-C


def add_parser(subparsers: Any) -> None:
    command = subparsers.add_parser(
        "run", help="run one flow and print its result",
        description="Load the tools and flow files as serve does, run FLOW once on the "
                    "given input, print its output (JSON) on stdout and a table of its "
                    "steps on stderr. Exit codes: 0 the flow succeeded, 1 it failed, 2 "
                    "a usage or loading error.")
    command.add_argument("flow", metavar="FLOW", help="the name of the flow to run")
    add_flow_sources(command)
    given = command.add_argument_group("input (default: {})")
    one = given.add_mutually_exclusive_group()
    one.add_argument("--input", metavar="JSON", help="the flow input as a JSON object")
    one.add_argument("--input-file", metavar="FILE",
                     help="read the JSON input from FILE ('-': standard input)")
    command.add_argument("--version", dest="flow_version", metavar="VERSION",
                         help="run this version of FLOW (default: the latest)")
    command.add_argument("--json", action="store_true",
                         help="print one JSON document (output, error and steps) on stdout "
                              "and no table")
    command.add_argument("-y", "--yes", action="store_true",
                         help="approve steps that require approval without asking")
    command.add_argument("--no-progress", dest="progress", action="store_false",
                         help="print no step as it starts and ends (by default: live on a "
                              "terminal, else a line each, on stderr; none with --json "
                              "without a terminal)")
    who = command.add_argument_group(
        "caller (a flow that declares step grants runs only for a caller)")
    who.add_argument("--caller", metavar="ID",
                     help="run the flow as this caller: each step's declared grants are "
                          "checked against its --scope and --claim values")
    who.add_argument("--scope", dest="scopes", action="append", default=[],
                     metavar="SCOPE", help="a scope the caller holds (repeatable)")
    who.add_argument("--claim", dest="claims", action="append", default=[],
                     metavar="KEY=VALUE",
                     help="a claim of the caller (repeatable; a KEY given more than once "
                          "holds every VALUE given)")


def run(args: argparse.Namespace) -> int:
    """Run ``args.flow`` once and report it; returns the exit code."""
    flow_input = read_input(args.input, args.input_file)
    caller = read_caller(args.caller, args.scopes, args.claims)
    progress = (progress_for(sys.stderr, quiet_without_terminal=args.json)
                if args.progress else None)
    try:
        # Tools may print, while importing or running: stdout is for the result only.
        with redirect_stdout(sys.stderr):
            executor, _ = load_executor(args.paths, args.tools)
            plan = _plan(executor, args.flow, args.flow_version)
            if caller is None and plan.needs:
                raise CommandError(EXIT_USAGE, _needs_caller(plan))
            result = executor.execute_flow(args.flow, flow_input, plan=plan,
                                           approve=approver(args.yes, plan),
                                           observer=progress, caller=caller)
    except CommandError as error:
        raise CommandError(EXIT_USAGE, str(error)) from None
    except (OSError, ImportError, ChainWeaverError) as error:
        # Missing files and modules, invalid flow files, duplicate flows: nothing ran.
        raise CommandError(EXIT_USAGE, str(error)) from None
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        print(json_text(result_document(result)), flush=True)
    else:
        print(step_table(result), file=sys.stderr, flush=True)
        if result.success:
            print(json_text(jsonable(result.final_output)), flush=True)
        else:
            print(f"{PROG}: flow {result.flow_name} {result.flow_version} failed: "
                  f"{describe_error(result.error)}", file=sys.stderr, flush=True)
    return EXIT_OK if result.success else EXIT_INVALID


MAX_INPUT_BYTES = 16 * 2**20  # as much as a server's default max_body_bytes


def _read_bounded(file: str) -> str | None:
    """The text of ``file`` (``-``: stdin), None when it is over MAX_INPUT_BYTES: never
    more is read (``/dev/zero`` or an endless pipe would fill the memory)."""
    if file == "-":
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text stream without bytes (tests replace stdin)
            text = sys.stdin.read(MAX_INPUT_BYTES + 1)
            return None if len(text.encode()) > MAX_INPUT_BYTES else text
        content = stream.read(MAX_INPUT_BYTES + 1)
    else:
        with Path(file).open("rb") as opened:
            content = opened.read(MAX_INPUT_BYTES + 1)
    return None if len(content) > MAX_INPUT_BYTES else content.decode("utf-8")


def read_input(text: str | None, file: str | None) -> dict[str, Any]:
    """The flow input from ``--input`` or ``--input-file`` (``-``: stdin); ``{}`` when
    neither is given. Anything but a JSON object is a usage error."""
    source = "--input"
    if file is not None:
        source = f"--input-file {file}"
        try:
            text = _read_bounded(file)
        except FileNotFoundError:
            raise CommandError(EXIT_USAGE, f"{source}: no such file") from None
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            raise CommandError(EXIT_USAGE, f"{source}: cannot be read: {reason}") from None
        if text is None:
            raise CommandError(EXIT_USAGE, f"{source}: larger than {MAX_INPUT_BYTES} bytes "
                               "(an input is read whole into memory)")
    if text is None:
        return {}

    def not_json(name: str) -> Any:
        raise CommandError(EXIT_USAGE, f"{source}: not JSON: {name} is not a JSON value")

    def integer(digits: str) -> int:
        try:
            return int(digits)
        except ValueError:  # more digits than Python converts (4300 by default)
            count = len(digits.lstrip("-"))
            raise CommandError(EXIT_USAGE, f"{source}: an integer of {count} digits is "
                               f"too long (at most {sys.get_int_max_str_digits()})") from None

    try:
        value = json.loads(text, parse_int=integer, parse_constant=not_json)
    except json.JSONDecodeError as error:
        raise CommandError(EXIT_USAGE, f"{source}: not JSON: {error.msg} at line "
                           f"{error.lineno}, column {error.colno}") from None
    except RecursionError:
        raise CommandError(EXIT_USAGE, f"{source}: nested too deeply") from None
    if not isinstance(value, dict):
        raise CommandError(EXIT_USAGE, f"{source}: the input must be a JSON object "
                           f"({{\"field\": value, ...}}), got {type(value).__name__}")
    return value


def read_caller(caller_id: str | None, scopes: list[str], claims: list[str]
                ) -> Caller | None:
    """The caller of ``--caller``, ``--scope`` and ``--claim`` (None: none given); a
    malformed flag is a usage error."""
    if caller_id is None:
        if scopes or claims:
            given = "--scope" if scopes else "--claim"
            raise CommandError(EXIT_USAGE, f"{given} describes a caller: pass --caller ID "
                               "too")
        return None
    if not caller_id.strip():
        raise CommandError(EXIT_USAGE, "--caller: the caller id must not be empty")
    for scope in scopes:
        if not scope or scope.split() != [scope]:
            raise CommandError(EXIT_USAGE, f"--scope {scope!r}: a scope is one word (give "
                               "--scope once per scope)")
    held: dict[str, list[str]] = {}
    for claim in claims:
        key, equals, value = claim.partition("=")
        if not equals or not key.strip():
            raise CommandError(EXIT_USAGE, f"--claim {claim!r}: expected KEY=VALUE (say "
                               "--claim tenant=acme)")
        held.setdefault(key.strip(), []).append(value)
    return Caller(caller_id, frozenset(scopes),
                  {key: values[0] if len(values) == 1 else values
                   for key, values in held.items()})


def _needs_caller(plan: Any) -> str:
    """Why a flow that declares step grants does not run without ``--caller``."""
    flow = plan.flow
    needs = ", ".join(f"{need.path or 'the flow'}: {need.grants.describe()}"
                      for need in plan.needs[:3])
    more = f" and {len(plan.needs) - 3} more" if len(plan.needs) > 3 else ""
    return (f"flow {flow.name!r} {flow.version} declares step grants ({needs}{more}), "
            "so it runs only for a caller: pass --caller ID, with --scope SCOPE and "
            "--claim KEY=VALUE for what it holds; nothing ran")


def _plan(executor: FlowExecutor, name: str, version: str | None) -> Any:
    """The plan to run; a flow that is missing or cannot run at all is a usage error."""
    try:
        flow = executor.registry.get_flow(name, version)
    except FlowNotFoundError as error:
        names = list(executor.registry.state().names())
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close and close[0] != name else ""
        listed = ", ".join(sorted(names)) or "none"
        raise CommandError(EXIT_USAGE, f"{error}{hint}; flows in the files: {listed}"
                           ) from None
    fatal = [problem.message for problem in executor.flow_problems(flow) if problem.fatal]
    if fatal:
        raise CommandError(EXIT_USAGE, f"flow {name!r} {flow.version} cannot run: "
                           + "; ".join(fatal))
    return executor.plan(flow)


# ------------------------------------------------------------------ approval


def approver(yes: bool, plan: Any) -> ApprovalHook | None:
    """``--yes``: approve without asking; else ask on the terminal, or refuse when stdin
    is not one (a script must say ``--yes``). None when no step needs approval."""
    if approval_request(plan) is None:
        return None
    return ALWAYS_APPROVE if yes else ask_on_terminal


def ask_on_terminal(request: ApprovalRequest) -> bool:
    """Ask ``y/N`` on stderr and read the answer from stdin (a terminal)."""
    what = f"flow {request.flow_name!r} {request.flow_version} needs approval: " \
           f"{request.describe()}"
    stdin = sys.stdin
    if stdin is None or not stdin.isatty():
        print(f"{PROG}: {what}; not asking, standard input is not a terminal: pass --yes "
              "to approve", file=sys.stderr, flush=True)
        return False
    print(f"{PROG}: {what}", file=sys.stderr)
    print("Run it? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = stdin.readline()
    return answer.strip().lower() in ("y", "yes")


# ------------------------------------------------------------------ output


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it (dates as text; anything else by its ``str``)."""
    return to_jsonable_python(value, fallback=str)


def record_document(record: StepRecord) -> dict[str, Any]:
    return {
        "id": record.step_id, "tool": record.tool_name, "status": record.status,
        "attempts": record.attempts, "duration_ms": round(record.duration_ms, 3),
        "inputs": jsonable(record.inputs), "outputs": jsonable(record.outputs),
        "error": _error_document(record.error),
        "attempt_errors": [_error_document(e) for e in record.attempt_errors],
        "fallback": record.fallback,
        "steps": None if record.steps is None else [record_document(r) for r in record.steps],
    }


def _error_document(error: ErrorInfo | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"type": error.type, "message": error.message, "step_id": error.step_id,
            "tool": error.tool_name, "field": error.field}


def result_document(result: ExecutionResult) -> dict[str, Any]:
    """What ``run --json`` prints: the outcome, the output or error, and every step."""
    return {
        "flow": result.flow_name, "version": result.flow_version,
        "success": result.success, "output": jsonable(result.final_output),
        "error": _error_document(result.error),
        "duration_ms": round(result.duration_ms, 3),
        "steps": [record_document(record) for record in result.steps],
    }
