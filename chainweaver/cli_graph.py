"""``chainweaver inspect --graph FLOW --json``: a flow's steps and edges as data.

The same graph as the Mermaid flowchart (:func:`chainweaver.plan.mermaid`), for scripts
and tools that draw or check flows themselves.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import to_jsonable_python

from .flows import Flow
from .mappings import source_data


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
