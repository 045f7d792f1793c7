"""What changed in one client's view between two exposure snapshots: the comparison
change notifications send (:mod:`.notifications`), made once per distinct view."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chainweaver.mcp.gate.views import View
from chainweaver.mcp.publish.exposure import INDEX_URI, ExposedFlow, Exposure


@dataclass(frozen=True)
class ViewChange:
    """What changed in one client's view between two snapshots."""

    tools: bool = False
    resources: bool = False
    prompts: bool = False
    updated: frozenset[str] = field(default_factory=frozenset)  # resource URIs

    def __bool__(self) -> bool:
        return self.tools or self.resources or self.prompts or bool(self.updated)


def _same_flow(a: ExposedFlow, b: ExposedFlow) -> bool:
    """Whether two exposed flows publish the same thing (names, version, contract)."""
    if a is b:
        return True
    fa, fb = a.flow, b.flow
    return (fa.version == fb.version and fa.title == fb.title
            and fa.description == fb.description and a.forced == b.forced
            and a.contract.input_schema == b.contract.input_schema
            and a.contract.output_schema == b.contract.output_schema
            and a.prompt_names == b.prompt_names
            and dict(a.authored_prompts) == dict(b.authored_prompts))


def _differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    if old.keys() != new.keys():
        return True
    return any(not _same_entry(old[key], new[key]) for key in new)


def _same_entry(a: Any, b: Any) -> bool:
    if isinstance(a, ExposedFlow):
        return _same_flow(a, b)
    if a.exposed_flow is None or b.exposed_flow is None:  # prompt entries
        return a.exposed_flow is b.exposed_flow and a.prompt is b.prompt
    return a.prompt == b.prompt and _same_flow(a.exposed_flow, b.exposed_flow)


NOTHING = ViewChange()
# View.cached key of a view's narrowed maps (no published name or URI looks like it).
_PUBLISHED = "(published, as notifications compare it)"


def view_changes(old: Exposure, new: Exposure, old_view: View | None = None,
                 new_view: View | None = None) -> ViewChange:
    """What changes from ``old`` to ``new``, seen through one caller's view of each
    (``views.of(snapshot, caller)``; None or unrestricted: the whole snapshot)."""
    old_tools, old_resources, old_prompts = _published(old, old_view)
    new_tools, new_resources, new_prompts = _published(new, new_view)
    tools = _differs(old_tools, new_tools)
    resources = new.expose_schemas and old_resources.keys() != new_resources.keys()
    updated: set[str] = set()
    if new.expose_schemas:
        updated = {uri for uri, exposed in new_resources.items()
                   if uri in old_resources and not _same_flow(old_resources[uri], exposed)}
        if tools or resources or updated:
            updated.add(INDEX_URI)  # the index lists the caller's view
    prompts = new.expose_prompts and _differs(old_prompts, new_prompts)
    return ViewChange(tools, resources, prompts, frozenset(updated))


def _published(snapshot: Exposure, view: View | None
               ) -> tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]:
    """The tools, resources and prompts ``view`` holds (as the provider lists them)."""
    if view is None or not view.restricted:
        return snapshot.tools, snapshot.resources, snapshot.prompts

    def narrow() -> tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]:
        return ({name: e for name, e in snapshot.tools.items() if view.allows(e)},
                {uri: e for uri, e in snapshot.resources.items() if view.allows(e)},
                # Server prompts and the guide (no flow) are in every view.
                {name: entry for name, entry in snapshot.prompts.items()
                 if entry.exposed_flow is None or view.allows(entry.exposed_flow)})

    return view.cached(_PUBLISHED, narrow)
