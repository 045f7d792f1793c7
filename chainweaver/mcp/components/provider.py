"""One FastMCP Provider sourcing every tool, resource, template and prompt.

Lists and lookups both read the exposure decision, so a name that is not exposed
is simply absent: FastMCP then answers with its own "unknown" error, identical to
a name that never existed. Components are built on first use and cached, which
keeps construction linear and cheap and lookups O(1). Server start builds none:
:meth:`FlowProvider.get_tasks` answers from the exposure snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import mcp_types
from fastmcp.prompts.base import Prompt
from fastmcp.resources.base import Resource
from fastmcp.resources.template import ResourceTemplate
from fastmcp.server.providers import Provider
from fastmcp.server.transforms import Transform
from fastmcp.tools.base import Tool
from fastmcp.utilities.components import FastMCPComponent
from fastmcp.utilities.versions import VersionSpec

from chainweaver.errors import InvalidVersionError
from chainweaver.executor import FlowExecutor
from chainweaver.mcp.components import prompt_render
from chainweaver.mcp.components.cache import ComponentCache
from chainweaver.mcp.components.flow_tool import FlowTool
from chainweaver.mcp.components.prompts import AuthoredPrompt, FlowInvocationPrompt, GuidePrompt
from chainweaver.mcp.components.published_list import PublishedTools
from chainweaver.mcp.components.resources import (
    TEMPLATE_URI,
    SchemaTemplate,
    index_resource,
    schema_resource,
)
from chainweaver.mcp.components.run_resources import RunResources, run_templates
from chainweaver.mcp.config import ErrorDetail
from chainweaver.mcp.gate import admission
from chainweaver.mcp.gate.composition import Listed, listed_through, stamp_owner
from chainweaver.mcp.gate.views import View, Views
from chainweaver.mcp.live.cursors import (
    BY_SIZE,
    INVALID_CURSOR,
    LIST_AGAIN,
    fingerprint,
    fitting,
    position,
    sent_size,
)
from chainweaver.mcp.publish.exposure import (
    INDEX_URI,
    ExposedFlow,
    PromptEntry,
)
from chainweaver.mcp.publish.live_exposure import LiveExposure
from chainweaver.mcp.publish.run_uris import is_run_uri
from chainweaver.mcp.runs.approval import RunSettings
from chainweaver.mcp.runs.recording import RunLog
from chainweaver.versions import version_key


def _version_ok(version: VersionSpec | None, exposed: ExposedFlow | None) -> bool:
    # A client may ask for a version (MCP request _meta). Only the exposed flow
    # version exists here: any other version is "not found", never silently served.
    return version is None or exposed is None or _version_matches(version,
                                                                   exposed.flow.version)


def _version_matches(spec: VersionSpec, version: str) -> bool:
    """Compare as the registry does (``2.1 == 2.1.0``, ``1.0rc1 == 1.0.0-rc.1``).

    A requested version that is not a version at all matches nothing: the answer is
    the ordinary "not found", with nothing logged.
    """
    try:
        if spec.eq is not None:
            return version_key(spec.eq) == version_key(version)
        return spec.matches(version)
    except (InvalidVersionError, ValueError, TypeError):
        return False


T = TypeVar("T")


def _itself(exposed: ExposedFlow) -> ExposedFlow:
    return exposed


def _tool_name(exposed: ExposedFlow) -> str:
    return exposed.tool_name


def _schema_uri(exposed: ExposedFlow) -> str:
    return exposed.schema_uri or ""


def _prompt_name(entry: PromptEntry) -> str:
    return entry.name


def _entry_flow(entry: PromptEntry) -> ExposedFlow | None:
    return entry.exposed_flow  # None (the guide, a server prompt): in every view


class FlowProvider(Provider):
    """Publishes exactly what the exposure decision allows.

    ``exposure`` is the server's live reference: every read answers from the snapshot
    the current request pinned at entry, so one request never mixes two snapshots.
    ``components``: where the components it builds are kept (the server's change
    notifier drops those of flows no longer published). ``task_runner``: with a task
    backend, how the one task runner of this provider's flows is built
    (:mod:`chainweaver.mcp.tasks`).
    """

    def __init__(
        self,
        exposure: LiveExposure,
        executor: FlowExecutor,
        *,
        error_detail: ErrorDetail = "full",
        flow_timeout: float | None = None,
        owner: str = "",
        runs: RunSettings | None = None,
        views: Views | None = None,
        run_log: RunLog | None = None,
        outputs: RunLog | None = None,
        components: ComponentCache | None = None,
        task_runner: Callable[[FlowProvider], Tool] | None = None,
    ) -> None:
        super().__init__()
        self.exposure = exposure
        self.executor = executor
        self.owner = owner
        self.error_detail = error_detail
        self.flow_timeout = flow_timeout
        self.runs = runs or RunSettings()
        self.components = components if components is not None else ComponentCache(owner)
        self._template = SchemaTemplate.build() if exposure.expose_schemas else None
        self.views = views or Views(None)
        self.run_log = run_log
        # Where outputs too large for a result are kept: the run history, or without one
        # the server's output spill (its records are not readable: see RunResources).
        self.outputs = outputs or run_log
        self.run_resources = RunResources(self.outputs, exposure, error_detail, owner) \
            if self.outputs is not None else None
        self._run_templates = run_templates() if run_log is not None else []
        # Last: the runner runs this provider's flows.
        self.task_runner = task_runner(self) if task_runner is not None else None

    def __repr__(self) -> str:
        return f"FlowProvider(prefix={self.exposure.policy.server_prefix!r})"

    @property
    def components_built(self) -> int:
        """How many components (tools, resources, prompts) have been built so far.

        Each is built on first use and then cached; this shows that a client
        connecting, or a lookup, does not build the whole catalogue.
        """
        return len(self.components)

    def view(self) -> View:
        """The current caller's view of the exposure: every get and list goes through it.

        The gate's admission carries it; a flow outside it is answered exactly like a
        name that never existed.
        """
        held = admission.current()
        record = held.of(self.owner) if held is not None else None
        if record is not None and record.view is not None and record.owner == self.owner:
            return record.view
        # Outside a request this server's gate admitted: a background task's run (its
        # record names the caller), or no request at all (the token's caller, if any).
        caller = record.caller if record is not None else None
        return self.views.of(self.exposure, caller or admission.caller_from_token())

    def _admitted(self, kind: Any) -> tuple[bool, ExposedFlow | None]:
        """Whether this server's gate decided a request of ``kind`` being served, and
        the flow it admitted it for (None: none in the caller's view)."""
        held = admission.current()
        return held.admits(self.owner, kind) if held is not None else (False, None)

    def _served_flow(self, kind: Any, name: str, published: Callable[[ExposedFlow], str],
                     lookup: Callable[[str], ExposedFlow | None],
                     version: VersionSpec | None) -> ExposedFlow | None:
        """The exposed flow a get of ``name`` serves: the one the gate admitted the
        request for (resolved once, there), else, outside a request this server's gate
        decided, the one ``lookup`` finds in the caller's view."""
        decided, exposed = self._admitted(kind)
        if exposed is None or published(exposed) != name:
            if decided:
                return None  # the gate found no flow of this name in the caller's view
            exposed = lookup(name)
            if not self.view().allows(exposed):
                return None
        return exposed if _version_ok(version, exposed) else None

    def _resolving(self) -> bool:
        """Whether FastMCP lists to resolve the name of a call, read or render being
        served (it does when a lookup finds nothing): only the admitted target can be
        that name, so a list then costs O(1), not O(catalogue)."""
        held = admission.current()
        return held is not None and held.looks_up(self.owner)

    def _page(self, kind: str, view: View, listed: Sequence[T],
              keys: Callable[[], Iterable[str]], size: Callable[[T], int]) -> Sequence[T]:
        """The page of the caller's ``listed`` items a list request asks for (all of
        them when it asks for none, or as many as fit one message when it is cut by its
        size: ``size`` gives an item's bytes as sent; nothing when it lists another
        kind), noting the list's fingerprint (over ``keys``, one per item) for its
        cursors."""
        held = admission.current()
        page = held.page if held is not None else None
        if page is None or page.owner != self.owner:
            return listed  # not a list request, or another server's list (a mount)
        if page.kind != kind:
            # Listed while another list is served: FastMCP 4.2 lists every tool for the
            # Prefab UI resources it adds to resources/list, which flow tools never
            # have. Building the whole catalogue for that would make a page O(catalogue).
            return []
        # Checked here, while the gate serves the list, so the gate refuses (and
        # audits) a stale or forged cursor like any other refused list. (FastMCP
        # swallows an exception raised by a provider's list: hence the note.)
        page.fingerprint = view.cached(f"cursor:{kind}", lambda: fingerprint(kind, keys()))
        if page.issued is not None and page.issued != page.fingerprint:
            page.refused = LIST_AGAIN
            return []
        if page.size is None:
            return listed
        if page.size == BY_SIZE:
            # Cut by size here: only the page's components are built and measured.
            start = position(page.cursor or "0")
            if start < 0:
                page.refused = INVALID_CURSOR
                return []
            if start >= len(listed) and start > 0:
                page.refused = LIST_AGAIN
                return []
            end = fitting(listed, start, size)
            page.offset, page.size, page.more = start, end - start, end < len(listed)
            return listed[start:end]
        page.offset = position(page.cursor) if page.cursor is not None else 0
        if page.offset < 0:
            page.refused = INVALID_CURSOR
            return []
        page.more = page.offset + page.size < len(listed)
        return listed[page.offset:page.offset + page.size]

    # Each request resolves its name through the exposure once; lists walk the
    # catalogue's entries. Components are built on first use and cached.

    # Each list is a function of the caller's view alone, sorted (not in the order
    # changes arrived in): its cursors survive every change outside the view, and the
    # server card names exactly what the lists show (:meth:`card_primitives`).

    def _listed_tools(self, view: View) -> Sequence[ExposedFlow | None]:
        if not view.restricted:
            # Every published tool: which, and their fingerprint, without building
            # what each flow publishes; a page decides its own flows in full.
            snapshot = self.exposure.current
            return view.cached("listed:tools", lambda: PublishedTools(snapshot))
        return view.cached("listed:tools", lambda: sorted(
            view.select(self.exposure.tools.values(), _itself), key=_tool_name))

    def _listed_resources(self, view: View) -> list[ExposedFlow | None]:
        if not self.exposure.expose_schemas:
            return []
        # The index first (None stands for it), then the schemas, sorted.
        return view.cached("listed:resources", lambda: [
            None, *sorted(view.select(self.exposure.resources.values(), _itself),
                          key=_schema_uri)])

    def _listed_prompts(self, view: View) -> list[PromptEntry]:
        return view.cached("listed:prompts", lambda: sorted(
            view.select(self.exposure.prompts.values(), _entry_flow), key=_prompt_name))

    def card_primitives(self, view: View, transforms: Sequence[Transform] = ()
                        ) -> dict[str, list[dict[str, Any]]]:
        """What ``view``'s lists show, as the wire carries them (every item, no pages),
        through the server's ``transforms``: the server card's primitives. Call it
        with the snapshot pinned."""
        def dumped(component: Any) -> dict[str, Any]:
            item = component.model_dump(by_alias=True, mode="json", exclude_none=True)
            meta = item.get("_meta", {}).get("chainweaver")
            if isinstance(meta, dict):
                meta.pop("server", None)  # this process's own mark, not the flow's
            return dict(item)

        listed: Listed = (
            [self._tool(e) for e in self._listed_tools(view) if e is not None],
            [self._index_resource(view) if e is None else self._schema_resource(e)
             for e in self._listed_resources(view)],
            ([self._template] if self._template else []) + list(self._run_templates),
            [self._prompt(entry, view) for entry in self._listed_prompts(view)])
        if transforms:
            listed = listed_through(transforms, listed)
        tools, resources, templates, prompts = listed
        return {
            "tools": [dumped(tool.to_mcp_tool(name=tool.name)) for tool in tools],
            "resources": [dumped(resource.to_mcp_resource()) for resource in resources],
            "resourceTemplates": [dumped(template.to_mcp_template())
                                  for template in templates],
            "prompts": [dumped(prompt.to_mcp_prompt()) for prompt in prompts],
        }

    # ------------------------------------------------------------------ tools

    def flow_tool(self, exposed: ExposedFlow) -> FlowTool:
        """The (cached) tool of an exposed flow; background tasks run flows through it."""
        return self._tool(exposed)

    def _tool(self, exposed: ExposedFlow) -> FlowTool:
        return self.components.get("tool", exposed.tool_name, exposed, lambda: FlowTool.build(
            exposed, self.executor, error_detail=self.error_detail, timeout=self.flow_timeout,
            runs=self.runs, live=self.exposure, views=self.views, view=self.view,
            run_log=self.run_log, outputs=self.outputs, owner=self.owner))

    async def _list_tools(self) -> Sequence[Tool]:
        if self._resolving():
            target = self._admitted("tool")[1]
            return [self._tool(target)] if target is not None else []
        view = self.view()
        listed = self._listed_tools(view)
        keys = listed.keys if isinstance(listed, PublishedTools) else lambda: (
            f"{e.tool_name} {e.flow.version}" for e in listed if e is not None)
        page = self._page("tools", view, listed, keys,
                          lambda e: self._tool(e).sent_size() if e is not None else 0)
        return [self._tool(exposed) for exposed in page if exposed is not None]

    async def _get_tool(self, name: str, version: VersionSpec | None = None) -> Tool | None:
        runner = self.task_runner
        if runner is not None and name == runner.name:
            # fastmcp-tasks builds a finished task's result through the tool its task
            # key names: every flow task's names the one runner, found only while a
            # tasks/* request is served (no client can list or call it).
            return runner if self._admitted("task")[0] else None
        exposed = self._served_flow("tool", name, _tool_name, self.exposure.tool, version)
        return self._tool(exposed) if exposed is not None else None

    # -------------------------------------------------------------- resources

    def _schema_resource(self, exposed: ExposedFlow) -> Resource:
        assert exposed.schema_uri is not None
        return self.components.get("resource", exposed.schema_uri, exposed,
                            lambda: schema_resource(exposed))

    def _index_resource(self, view: View) -> Resource:
        # The index lists the caller's view: one per view, built when first read.
        def build() -> Resource:
            index = index_resource(lambda: view.select(self.exposure.exposed_flows, _itself))
            stamp_owner(index, self.owner)
            return index

        return view.cached(INDEX_URI, build)

    async def _list_resources(self) -> Sequence[Resource]:
        if not self.exposure.expose_schemas:
            return []
        if self._resolving():
            target = self._admitted("resource")[1]
            return [self._schema_resource(target)] if target is not None else []
        view = self.view()
        listed = self._listed_resources(view)
        page = self._page("resources", view, listed, lambda: (
                          INDEX_URI if e is None else f"{e.schema_uri} {e.flow.version}"
                          for e in listed),
                          lambda e: sent_size((self._index_resource(view) if e is None
                                               else self._schema_resource(e)
                                               ).to_mcp_resource()))
        return [self._index_resource(view) if exposed is None
                else self._schema_resource(exposed) for exposed in page]

    async def _get_resource(
        self, uri: str, version: VersionSpec | None = None
    ) -> Resource | None:
        if self.run_resources is not None and is_run_uri(uri):
            run = await self.run_resources.resource(uri, self.view())
            if run is not None:  # known as this server's under any composition
                stamp_owner(run, self.owner)
            return run
        if not self.exposure.expose_schemas:
            return None
        if uri == INDEX_URI:
            return self._index_resource(self.view())
        exposed = self._served_flow("resource", uri, _schema_uri, self.exposure.resource,
                                    version)
        return self._schema_resource(exposed) if exposed is not None else None

    async def _list_resource_templates(self) -> Sequence[ResourceTemplate]:
        templates: list[ResourceTemplate] = [self._template] if self._template else []
        if self.run_resources is not None:
            templates.extend(self._run_templates)
        return templates

    async def _get_resource_template(
        self, uri: str, version: VersionSpec | None = None
    ) -> ResourceTemplate | None:
        # Every exposed URI is answered by its concrete resource before templates are
        # consulted; anything else must stay "not found", so the template never matches.
        return None

    # ---------------------------------------------------------------- prompts

    def _prompt(self, entry: PromptEntry, view: View) -> Prompt:
        if entry.prompt is None and entry.exposed_flow is None:
            # The guide describes the caller's view: one per view.
            def guide() -> Prompt:
                prompt = GuidePrompt.build(
                    lambda: view.select(self.exposure.exposed_flows, _itself))
                stamp_owner(prompt, self.owner)
                return prompt

            return view.cached(entry.name, guide)

        def build() -> Prompt:
            if entry.prompt is not None:
                return AuthoredPrompt.build(entry.name, entry.prompt, entry.exposed_flow)
            assert entry.exposed_flow is not None
            return FlowInvocationPrompt.build(entry.exposed_flow)

        source: object = next((s for s in (entry.exposed_flow, entry.prompt)
                               if s is not None), self.exposure)
        return self.components.get("prompt", entry.name, source, build)

    async def _list_prompts(self) -> Sequence[Prompt]:
        view = self.view()
        if self._resolving():
            target = self._admitted("prompt")[1]
            return [self._prompt(PromptEntry(name, target, target.authored_prompts.get(name)),
                                 view) for name in target.prompt_names] if target else []
        listed = self._listed_prompts(view)
        page = self._page("prompts", view, listed, lambda: (
            f"{entry.name} {entry.exposed_flow.flow.version if entry.exposed_flow else ''}"
            for entry in listed),
            lambda entry: sent_size(self._prompt(entry, view).to_mcp_prompt()))
        return [self._prompt(entry, view) for entry in page]

    async def _get_prompt(self, name: str, version: VersionSpec | None = None) -> Prompt | None:
        view = self.view()
        decided, target = self._admitted("prompt")
        if target is not None and name in target.prompt_names:
            # Resolved once, by the gate: the flow's prompt of this name.
            entry: PromptEntry | None = PromptEntry(name, target,
                                                    target.authored_prompts.get(name))
        else:
            entry = self.exposure.prompt(name)  # the guide or a server prompt: no flow
            if entry is not None and entry.exposed_flow is not None and (
                    decided or not view.allows(entry.exposed_flow)):
                return None  # a flow's prompt the gate did not admit: not in the view
        if entry is None or not _version_ok(version, entry.exposed_flow):
            return None
        return self._prompt(entry, view)

    # ------------------------------------------------------------------ tasks

    def task_tool_names(self) -> list[str]:
        """Published names of the exposed tools that may run as background tasks.

        Read from the exposure decision (each flow's effective ``task_mode``), never by
        building components. This decides every flow: O(catalogue), for reports and
        tests, never on the start or request path.
        """
        return sorted(name for name, exposed in self.exposure.tools.items()
                      if exposed.task_mode != "forbidden")

    async def get_tasks(self) -> Sequence[FastMCPComponent]:
        """The components Docket registers at server start: the one flow task runner.

        FastMCP calls this at every start (Docket registers task functions from it).
        The base implementation lists, and so builds,
        every component to read its ``task_config``: O(catalogue), about 3 s at 20,000
        flows. Here it is one component whatever the catalogue, and a flow that
        becomes task-capable later needs nothing registered (see ``tasks.py``).
        """
        return [self.task_runner] if self.task_runner is not None else []

    # ------------------------------------------------------------ completions

    def complete(
        self,
        ref: mcp_types.PromptReference | mcp_types.ResourceTemplateReference,
        argument: mcp_types.CompletionArgument,
        context: mcp_types.CompletionContext | None = None,
    ) -> list[str]:
        """Completion values for exposed prompts and the schema template only."""
        typed = argument.value or ""
        if isinstance(ref, mcp_types.ResourceTemplateReference) and \
                self.run_resources is not None:
            runs = self.run_resources.complete(ref.uri, argument.name, typed, self.view())
            if runs is not None:
                return runs
        if isinstance(ref, mcp_types.ResourceTemplateReference):
            if self._template is None or ref.uri != TEMPLATE_URI:
                return []
            if argument.name != "published_name":
                return []
            names = [exposed.tool_name for exposed in
                     self.view().select(self.exposure.resources.values(), _itself)]
        else:
            entry = self.exposure.prompt(ref.name)
            if entry is None or (entry.exposed_flow is not None
                                 and not self.view().allows(entry.exposed_flow)):
                return []
            if entry.prompt is not None:
                return []  # authored arguments are free text
            if entry.exposed_flow is None:
                return []
            specs = [spec for spec in entry.exposed_flow.contract.arguments
                     if spec.name == argument.name]
            names = prompt_render.argument_choices(specs[0]) if specs else []
        return [value for value in names if value.startswith(typed)]
