"""``chainweaver inspect PATH... --tools MODULE [options]``: print the exposure decision
serve would act on, and exit.

Takes every serve option and checks it as serve does, but serves nothing: a table of the
exposed flows (with their tool, resources and prompts) and of the excluded ones (with
why), or ``--json`` for scripts; ``--prompts`` adds each published prompt as clients
receive it; ``--graph FLOW`` prints a flow's steps instead (Mermaid, or JSON with the
same steps and edges, for scripts that draw or check flows themselves); ``--strict``
exits 1 when a flow is excluded as invalid.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from pydantic_core import to_jsonable_python

from ..flows import Flow
from ..mappings import source_data
from .building import build_server, loading_errors
from .errors import EXIT_INVALID, EXIT_OK, CommandError
from .loading import load_executor
from .options import http_defaults, server_options
from .output import json_text, table
from .validate import static_problems


def add_parser(subparsers: Any) -> None:
    inspect = subparsers.add_parser(
        "inspect", parents=[server_options()], help="show what serve would publish",
        description="Print the exposure decision and exit. Takes every serve option "
                    "and checks it as serve does, but serves nothing.")
    inspect.add_argument("--json", action="store_true", help="print JSON for scripts")
    inspect.add_argument("--prompts", action="store_true",
                         help="also show each published prompt as clients receive it: its "
                              "arguments and its messages with placeholder values")
    inspect.add_argument("--graph", metavar="FLOW",
                         help="print FLOW's steps as a Mermaid flowchart instead (with "
                              "--json: its steps, edges and conditions as JSON)")
    inspect.add_argument("--strict", action="store_true",
                         help="exit with 1 when any flow is excluded as invalid")


def run(args: argparse.Namespace) -> int:
    http_defaults(args)
    if args.graph:
        with loading_errors():
            text = graph(args)
        print(text)
        return EXIT_OK
    with loading_errors():
        server = build_server(args).server
    print(format_json(server, args.prompts) if args.json
          else format_table(server, args.prompts))
    sys.stdout.flush()  # a closed pipe shows here, inside main's handler
    invalid = invalid_flows(server) if args.strict else []
    if invalid:
        raise CommandError(EXIT_INVALID, f"--strict: {len(invalid)} flow(s) excluded as "
                           f"invalid: {'; '.join(invalid)}")
    return EXIT_OK


# ------------------------------------------------------------------ the exposure decision


def format_table(server: Any, prompts: bool = False) -> str:
    """The exposure decision as two aligned tables: exposed flows, then excluded ones
    (with ``prompts``, then each published prompt as clients receive it)."""
    report = server.exposure_report()
    exposed = [e for e in report if e.exposed]
    excluded = [e for e in report if not e.exposed]
    lines = [f"Exposed: {len(exposed)} of {len(report)} flows"]
    if exposed:
        lines += table([("FLOW", "VERSION", "TOOL", "RESOURCE", "PROMPTS")] + [
            (e.flow_name, e.version,
             f"{e.tool_name} (asks approval)" if e.needs_approval else e.tool_name or "-",
             ", ".join(e.resource_uris) or "-",
             ", ".join(e.prompt_names) or "-") for e in exposed])
    guarded = [e for e in exposed if e.requires is not None or e.delegations]
    if guarded:
        # Only callers holding these grants see (and can run) the flow; a delegated
        # step runs beyond its caller's grants, for the reason given.
        lines += ["", "Step grants (a caller sees a flow only when it holds them):"]
        lines += table([("FLOW", "REQUIRES", "DELEGATED STEPS")] + [
            (e.flow_name, e.requires.describe() if e.requires is not None else "-",
             "; ".join(f"{path}: {why}" for path, why in e.delegations) or "-")
            for e in guarded])
    lines += ["", f"Excluded: {len(excluded)} of {len(report)} flows"]
    if excluded:
        lines += table([("FLOW", "VERSION", "REASON")] + [
            (e.flow_name, e.version, e.reason or "-") for e in excluded])
    extras = []
    if server.resource_uris:
        extras.append(f"resource {server.resource_uris[0]} (index)")
    if "chainweaver_guide" in server.prompt_names:
        extras.append("prompt chainweaver_guide (guide)")
    if extras:
        lines += ["", "Also published: " + ", ".join(extras)]
    return "\n".join(lines + (format_prompts(server) if prompts else []))


def format_json(server: Any, prompts: bool = False) -> str:
    document: dict[str, Any] = {
        "flows": [entry.to_dict() for entry in server.exposure_report()],
        "tools": server.registered_tool_names,
        "resources": server.resource_uris,
        "prompts": server.prompt_names,
    }
    if prompts:
        document["prompt_templates"] = server.prompt_templates()
    return json_text(document)


def invalid_flows(server: Any) -> list[str]:
    """``--strict``: each excluded flow that is invalid (whatever the policy), with why."""
    executor = server.executor
    found = []
    for entry in server.exposure_report():
        if entry.exposed:
            continue
        flow = executor.registry.get_flow(entry.flow_name, entry.version)
        problems = static_problems(executor, flow)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            found.append(f"{entry.flow_name} v{entry.version}: {problems[0][1]}{more}")
    return found


# ------------------------------------------------------------------ --prompts


def format_prompts(server: Any) -> list[str]:
    """The lines of the prompt section (none when the server publishes no prompts and
    withholds none)."""
    templates = server.prompt_templates()
    withheld = [(entry.flow_name, name, why) for entry in server.exposure_report()
                for name, why in entry.withheld_prompts]
    if not templates and not withheld:
        return []
    lines = ["", f"Prompts: {len(templates)} published"]
    for template in templates:
        owner = f", flow {template['flow']}" if template["flow"] else ""
        lines.append(f"  {template['name']} ({template['kind']}{owner})")
        for argument in template["arguments"]:
            required = "required" if argument["required"] else "optional"
            about = f": {argument['description']}" if argument["description"] else ""
            lines.append(f"    argument {argument['name']} ({required}){about}")
        for message in template["messages"]:
            lines.append(f"    [{message['role']}]")
            lines += [textwrap.indent(line, "      ") if line else ""
                      for line in message["text"].splitlines()]
    if withheld:
        lines += ["", f"Prompts withheld by the prompt policy: {len(withheld)}"]
        lines += [f"  {name} (flow {flow}): {why}" for flow, name, why in withheld]
    return lines


# ------------------------------------------------------------------ --graph


def graph(args: argparse.Namespace) -> str:
    """The latest version of flow ``args.graph`` in the flow files, as Mermaid, or as
    JSON with ``--json`` (no server is built: only tools and flow files are loaded and
    checked)."""
    from .mermaid import mermaid

    executor, loaded = load_executor(args.paths, args.tools)
    flows = [flow for flow in loaded.values() if flow.name == args.graph]
    if not flows:
        raise CommandError(EXIT_INVALID, f"--graph: no flow named {args.graph!r} in the "
                           "flow files")
    flow = max(flows, key=lambda flow: flow.version_key)
    if args.json:
        return json_text(graph_document(flow))
    return mermaid(flow)


def graph_document(flow: Flow) -> dict[str, Any]:
    """The flow's steps (in declaration order, each with how it runs), the edges between
    them (``from`` runs before ``to``), the order a run follows, and its last steps."""
    ids = flow.step_ids
    steps = []
    for index, step in enumerate(flow.steps):
        retry = step.retry
        steps.append({
            "id": ids[index],
            "kind": "flow" if step.flow is not None else "tool",
            "name": step.name,
            "after": [ids[dep] for dep in flow.dependencies[index]],
            "when": step.when,
            "input_mapping": {field: to_jsonable_python(source_data(source), fallback=str)
                              for field, source in step.input_mapping.items()},
            "output_mapping": dict(step.output_mapping),
            "retry": None if retry is None else {
                "max_attempts": retry.max_attempts, "backoff_seconds": retry.backoff_seconds,
                "max_backoff_seconds": retry.max_backoff_seconds, "jitter": retry.jitter,
                "retry_on": [_class_name(entry) for entry in retry.retry_on]},
            "timeout": step.timeout,
            "on_error": step.on_error,
            "fallback": step.fallback,
        })
    edges = [{"from": ids[dep], "to": ids[index], "when": flow.steps[index].when}
             for index, deps in enumerate(flow.dependencies) for dep in deps]
    return {"flow": flow.name, "version": flow.version, "steps": steps, "edges": edges,
            "order": [ids[index] for index in flow.order],
            "last": [ids[index] for index in flow.sinks]}


def _class_name(entry: str | type[BaseException]) -> str:
    """A ``retry_on`` entry as a flow file writes it: a built-in name or a module path."""
    if isinstance(entry, str):
        return entry
    if entry.__module__ == "builtins":
        return entry.__qualname__
    return f"{entry.__module__}.{entry.__qualname__}"
