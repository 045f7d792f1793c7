"""FlowServer: publish the flows governance allows, as MCP tools, resources and prompts."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar, cast

import anyio
from fastmcp import FastMCP
from mcp.server.request_state import RequestStateSecurity
from starlette.middleware import Middleware

from chainweaver import __version__
from chainweaver.errors import ExposureConfigError
from chainweaver.executor import FlowExecutor
from chainweaver.governance.state import GovernanceSettings
from chainweaver.mcp.checks import check_bool
from chainweaver.mcp.components.cache import ComponentCache
from chainweaver.mcp.components.prompts import prompt_templates
from chainweaver.mcp.components.provider import FlowProvider
from chainweaver.mcp.components.tool_forms import add_tool_forms, check_tool_forms, tool_form_names
from chainweaver.mcp.config import (
    Discovery,
    ExposurePolicy,
    RunHistory,
    SecurityConfig,
    ServingConfig,
    check_feature,
)
from chainweaver.mcp.discovery import ServerCards
from chainweaver.mcp.fastmcp_seams import add_sdk_middleware, install_input_schema_lookup
from chainweaver.mcp.gate.admission import input_schema_lookup, pinned_snapshot
from chainweaver.mcp.gate.cache_hints import CacheHints, CachePolicy
from chainweaver.mcp.gate.composition import Route, gate_lifespan
from chainweaver.mcp.gate.echo import install as bound_echoes
from chainweaver.mcp.gate.http_guard import HostOriginRules
from chainweaver.mcp.gate.mounting import MountedCompletions, MountedGate
from chainweaver.mcp.gate.security import SecurityGate
from chainweaver.mcp.gate.views import Views, check_visible
from chainweaver.mcp.hooks import CallerIdentity, GateContext
from chainweaver.mcp.live.following import RegistryFollower, weakly
from chainweaver.mcp.live.notifications import ChangeNotifier, SnapshotPins
from chainweaver.mcp.live.shared import SharedRunner, running, shared_runner
from chainweaver.mcp.live.subscriptions import Subscriptions
from chainweaver.mcp.moved_keywords import moved_keywords, moved_settings
from chainweaver.mcp.process import flush_stray_stdout, freeze_gc
from chainweaver.mcp.publish.card import ServerIdentity
from chainweaver.mcp.publish.exposure import INDEX_URI, Exposure, FlowExposure
from chainweaver.mcp.publish.live_exposure import LiveExposure
from chainweaver.mcp.runs.approval import RunSettings
from chainweaver.mcp.runs.metrics import RequestMetrics, ServerMetrics
from chainweaver.mcp.runs.recording import RunLog
from chainweaver.mcp.runs.records import RunStore
from chainweaver.mcp.runs.telemetry import FlowTelemetry
from chainweaver.mcp.tasks.setup import (
    TaskSettings,
    add_tasks,
    approval_marks,
    check_tasks,
    flow_task_runner,
    worker_lifespan,
)
from chainweaver.prompts import FlowPrompt
from chainweaver.tools import NAME_PATTERN
from chainweaver.watch import FlowFileWatcher

logger = logging.getLogger("chainweaver.mcp")

Transport = Literal["stdio", "streamable-http"]


class FlowServer:
    """An MCP server publishing a :class:`FlowExecutor`'s flows under one governance filter.

    What is published is decided from the executor's registry into an immutable
    snapshot (:meth:`exposure_report` shows it); a flow it excludes is absent from
    every primitive. The server follows the registry: each change builds a new
    snapshot, swapped in before the change returns, and clients are told what changed
    (see ``docs/live-governance.md``). Bad configuration raises
    :class:`ExposureConfigError` here, not later.

    Whole features, each off by default, with its own settings:

    - ``tasks`` (``"memory://"``, ``"redis://host:port/db"`` or a :class:`TaskSettings`;
      needs the ``tasks`` extra) lets clients run flows as MCP background tasks
      (``docs/tasks.md``).
    - ``run_history`` (a :class:`RunHistory`) keeps a record of every run, readable by
      its caller as ``chainweaver://runs/...`` resources (``docs/run-history.md``).
    - ``governance`` (a ``redis://`` URL or a ``GovernanceSettings``) makes the server
      follow the governance state operators share on Redis (``chainweaver flows ...``;
      ``docs/live-governance.md``, "One switch for every replica").
    - ``discovery`` (a :class:`Discovery`) names the server in its server card and
      registry entry and sets how long 2026-07-28 clients may reuse what it answers
      (``docs/discovery.md``).
    - ``meter_provider`` (an OpenTelemetry ``MeterProvider``) receives the server's
      metrics; ``None``: the global one, a no-op until an application configures the
      SDK (``docs/mcp-server.md``, "Metrics").
    """

    def __init__(
        self,
        executor: FlowExecutor,
        *,
        expose_schemas: bool = False,
        expose_prompts: bool = False,
        prompts: Sequence[FlowPrompt] = (),
        policy: ExposurePolicy | None = None,
        security: SecurityConfig | None = None,
        serving: ServingConfig | None = None,
        tasks: str | TaskSettings | None = None,
        run_history: RunHistory | None = None,
        governance: str | GovernanceSettings | None = None,
        discovery: Discovery | None = None,
        meter_provider: Any = None,
        **deprecated: Any,
    ) -> None:
        if not isinstance(executor, FlowExecutor):
            raise ExposureConfigError(
                f"executor must be a FlowExecutor, got {type(executor).__name__}")
        check_bool("expose_schemas", expose_schemas)
        check_bool("expose_prompts", expose_prompts)
        policy = _config("policy", policy, ExposurePolicy)
        security = _config("security", security, SecurityConfig)
        serving = _config("serving", serving, ServingConfig)
        features = {"run_history": check_feature("run_history", run_history),
                    "governance": check_feature("governance", governance),
                    "discovery": check_feature("discovery", discovery),
                    "meter_provider": check_feature("meter_provider", meter_provider)}
        # First the settings ServingConfig took before they moved (it warned), then the
        # keywords FlowServer took (each warns): both fold into where they live now.
        security = moved_settings(serving, security, features)
        policy, security, serving, tasks = moved_keywords(
            deprecated, policy, security, serving, tasks)
        if isinstance(prompts, (str, bytes)):
            raise ExposureConfigError("prompts must be a list of FlowPrompt values")
        prompts = tuple(prompts)  # once: a generator would be used up by the check
        if not all(isinstance(p, FlowPrompt) for p in prompts):
            raise ExposureConfigError("prompts must be a list of FlowPrompt values")
        if prompts and not expose_prompts:
            raise ExposureConfigError("server-level prompts need expose_prompts=True")
        views = Views(check_visible(security.visible))
        resources_as_tools, prompts_as_tools = serving.resources_as_tools, \
            serving.prompts_as_tools
        if resources_as_tools and not expose_schemas:
            raise ExposureConfigError("resources_as_tools needs expose_schemas=True")
        if prompts_as_tools and not expose_prompts:
            raise ExposureConfigError("prompts_as_tools needs expose_prompts=True")
        task_settings = check_tasks(tasks)
        if task_settings is not None:
            # The server-wide default mode of flows that set none (see decision.task_mode).
            policy = dataclasses.replace(policy, task_mode=task_settings.mode)
        name, version, instructions = serving.name, serving.version, serving.instructions
        approval_timeout = serving.approval_timeout
        self.executor = executor
        self.policy = policy
        self.security = security
        self.serving = serving
        self._exposure = LiveExposure(Exposure(
            executor, policy, expose_schemas=expose_schemas, expose_prompts=expose_prompts,
            server_prompts=prompts), pinned=pinned_snapshot)
        # Marks this server's components, so its gate knows them under any composition.
        owner = secrets.token_hex(8)
        keys = cast("tuple[bytes, ...] | None", security.request_state_keys)
        metrics = ServerMetrics(features["meter_provider"])
        components = ComponentCache(owner)
        # Runs on the loop after a swap: the provider's components of flows no longer
        # published are dropped, and clients are told what changed in their view.
        self._notifier = ChangeNotifier(self._exposure,
                                        debounce=cast(float, serving.change_debounce),
                                        on_rebuilt=components.forget_unpublished,
                                        views=views,
                                        callers_from_token=security.authenticator is None,
                                        # Its answer for the same credentials may
                                        # change: asked again when there is news.
                                        authenticate=self._authenticate
                                        if security.authenticator is not None else None,
                                        max_streams=security.max_listen_streams,
                                        max_streams_per_caller=security
                                        .max_listen_streams_per_caller,
                                        owner=owner)
        history = features["run_history"]
        self._run_log = run_log = RunLog.open(history, updated=self._notifier.run_updated) \
            if history is not None else None
        # Without a history, outputs too large to send are kept in this process: a task
        # on a shared backend may run in another, whose spill no client could read.
        outputs = run_log or RunLog.spill(task_links=task_settings is None
                                          or task_settings.url.startswith("memory://"))
        # Before the snapshot follower subscribes: shared decisions govern a change first.
        self._shared = shared_runner(features["governance"], executor.registry)
        self._provider = FlowProvider(
            self._exposure, executor, error_detail=security.error_detail,
            flow_timeout=serving.flow_timeout, owner=owner,
            runs=RunSettings.build(policy.approval == "elicit", approval_timeout, keys,
                                   serving.run_notifications,
                                   shared_nonces=approval_marks if task_settings else None,
                                   step_authorizer=_step_authorizer(security, executor),
                                   refresh_caller=security.refresh_caller),
            views=views, run_log=run_log, outputs=outputs, components=components,
            task_runner=flow_task_runner(
                security, metrics, self._shared.follower if self._shared else None)
            if task_settings else None)
        # Followed as long as anything serves: the FastMCP server (through its
        # middleware) keeps the follower alive, the registry only refers to it weakly.
        tool_forms = tool_form_names(resources=resources_as_tools, prompts=prompts_as_tools)
        self._follower = follower = RegistryFollower(
            executor, policy, prompts, self._exposure, self._notifier,
            check=lambda snapshot: check_tool_forms(snapshot, tool_forms))
        self._pins = SnapshotPins(self._exposure, self._notifier, keep_alive=follower)
        # The gate reads the live reference like a snapshot: the request's pinned one.
        gated = cast(Exposure, self._exposure)
        run_resources = self._provider.run_resources
        # The gate counts, times and caps what it serves, and watches each flow run's
        # steps for its spans: no middleware layers of their own (each costs a request).
        self._gate = SecurityGate(
            gated, security, owner=owner, views=views, refusals=metrics.refused,
            requests=RequestMetrics(metrics, gated),
            runs=FlowTelemetry(gated, security.error_detail, metrics),
            body_limit=security.max_body_bytes, pins=self._pins,
            run_target=run_resources.target if run_resources is not None else None)
        # Schemas are published already dereferenced (see contract.published_schema),
        # so FastMCP's per-list dereferencing pass would only cost time.
        self._fastmcp = FastMCP(
            name,
            version=version or __version__,
            instructions=instructions,
            auth=security.auth,  # enforced by the HTTP transport, before the gate
            providers=[self._provider],
            # One layer: the gate pins the request's snapshot, admits it and serves it.
            middleware=[self._gate],
            dereference_schemas=False,
            # A backstop: an exception that escapes a component must not carry its
            # message past the error_detail the operator chose.
            mask_error_details=security.error_detail != "full",
            list_page_size=serving.page_size,
            # Marks requests that arrive through this server's own transport.
            lifespan=_serving_lifespan(gate_lifespan(self._gate), self._notifier, self._shared),
            # None: FastMCP seals request state under a key of this process's own.
            request_state_security=None if keys is None else RequestStateSecurity(
                keys=list(keys), audience=name),
        )
        self._tasks_url = task_settings.url if task_settings is not None else None
        if task_settings is not None:
            add_tasks(self._fastmcp, self._provider, security, task_settings)
        if expose_schemas or expose_prompts or run_log is not None:
            self._fastmcp.add_completion_handler(self._provider.complete)
        add_tool_forms(self._fastmcp, cast(Exposure, self._exposure), resources=resources_as_tools,
                       prompts=prompts_as_tools)
        install_input_schema_lookup(self._fastmcp, input_schema_lookup(
            self._fastmcp, self._exposure, views,
            caller_known=security.authenticator is None))
        # Resources to subscribe to: schema resources, run records.
        self._subscribable = expose_schemas or run_log is not None
        own = Route(self._fastmcp)  # how this server's own clients reach it
        self._notifier.install(own, page_size=serving.page_size, provider=self._provider)
        Subscriptions.serve(self._fastmcp, self._notifier, own, resources=self._subscribable)
        bound_echoes(self._fastmcp)  # no answer quotes more than a client can receive
        discovery_settings: Discovery = features["discovery"]
        # Answers are the same for every caller only without views, tokens and hooks.
        cache = CachePolicy(discovery_settings.cache_ttl, shared=not (
            views.active or security.auth or security.authenticator or security.authorizer),
            hold=self._shared.follower.sure_for if self._shared is not None else None)
        if cache.ttl > 0 or cache.shared:
            # Off (no TTL, answers per caller): the SDK's own hints say just that.
            add_sdk_middleware(self._fastmcp, CacheHints(cache),
                               "2026-07-28 answers say ttlMs 0 and cacheScope private")
        self._cards = ServerCards(
            ServerIdentity.of(name, discovery_settings.registry_name, version or __version__,
                              instructions),
            self._exposure, views, self._gate, self._provider.card_primitives,
            security.auth, cache, self._fastmcp)
        self._watcher: FlowFileWatcher | None = None
        self._parents: weakref.WeakSet[FastMCP] = weakref.WeakSet()  # mounted into
        self._unsubscribe = executor.registry.subscribe(weakly(follower))
        follower()  # a change made since the first snapshot was taken
        if serving.freeze_gc:
            # Decide every flow first, so the snapshot is among what is frozen: the
            # operator traded a slower start for lists that skip it.
            self._exposure.catalogue  # noqa: B018
            freeze_gc()

    async def _authenticate(self, gate: GateContext) -> CallerIdentity:
        """The gate's authenticator's caller for ``gate`` now (raises when it refuses)."""
        return await self._gate.authenticate(gate)

    def close(self) -> None:
        """Stop following the executor's registry (the snapshot in use stays), and stop
        the file watcher, if any."""
        self._unsubscribe()
        if self._watcher is not None:
            self._watcher.stop()

    def watch(self, watcher: FlowFileWatcher) -> None:
        """Start ``watcher`` (it changes this server's registry as flow files change);
        :meth:`exposure_report` then says which flows' files have edits not served."""
        if watcher.registry is not self.executor.registry:
            raise ExposureConfigError("the watcher must change this server's registry")
        self._watcher = watcher
        # An edit this server could not publish is refused before its flow's last good
        # version is unregistered (it keeps serving, marked stale).
        watcher.add_check(self._follower.vet)
        watcher.start()

    @property
    def fastmcp(self) -> FastMCP:
        """The FastMCP instance, for adding more components or mounting."""
        return self._fastmcp

    def mount_into(self, parent: FastMCP, namespace: str | None = None) -> None:
        """Mount this server into ``parent`` with its security gate kept in charge.

        Use this instead of ``parent.mount(server.fastmcp)``: the gate then runs in
        the parent's middleware chain, so a refusal is the same JSON-RPC error as when
        this server stands alone. Requests routed in by a bare ``FastMCP.mount()`` are
        refused (and logged as an error) whenever the gate has hooks. The parent then
        serves ``subscriptions/listen`` and ``resources/subscribe``, so its clients hear
        of this server's changes as its own clients do (``docs/mcp-server.md``,
        "Composition"). A server is mounted into one parent once.
        """
        if not isinstance(parent, FastMCP) or parent is self._fastmcp:
            raise ExposureConfigError("mount_into needs another FastMCP server as parent")
        if namespace is not None and not (isinstance(namespace, str)
                                          and NAME_PATTERN.fullmatch(namespace)):
            raise ExposureConfigError(f"namespace {namespace!r} is not a valid name part")
        if self._tasks_url is not None:
            # The parent would need the tasks extension and its own Docket, and would list
            # the task runner as a tool: refused rather than half-working.
            raise ExposureConfigError("a FlowServer with tasks= cannot be mounted yet; serve "
                                      "it on its own")
        if parent in self._parents:
            # Its gate would admit every request twice, and its notices would have two
            # names for each resource: one mount per parent.
            raise ExposureConfigError("this FlowServer is mounted into that parent already")
        self._parents.add(parent)
        route = Route.mounted(self._fastmcp, parent, namespace)
        parent.add_middleware(MountedGate(self._gate, route))
        parent.mount(self._fastmcp, namespace=namespace)
        # The parent's clients hear this server's changes (live/subscriptions.py).
        Subscriptions.serve(parent, self._notifier, route, resources=self._subscribable)
        if self._exposure.expose_schemas or self._exposure.expose_prompts:
            MountedCompletions.install(parent, namespace, self._provider.complete)

    @property
    def run_store(self) -> RunStore | None:
        """Where run records are kept (None: no ``FlowServer(run_history=...)``)."""
        return self._run_log.store if self._run_log is not None else None

    @property
    def registered_tool_names(self) -> list[str]:
        """Published tool names of the exposed flows, sorted."""
        return sorted(self._exposure.tools)

    @property
    def resource_uris(self) -> list[str]:
        """Published schema resource URIs (plus the index), empty without expose_schemas."""
        if not self._exposure.expose_schemas:
            return []
        return [INDEX_URI, *sorted(self._exposure.resources)]

    @property
    def prompt_names(self) -> list[str]:
        """Published prompt names, sorted; empty without expose_prompts."""
        return sorted(self._exposure.prompts)

    def prompt_templates(self) -> list[dict[str, Any]]:
        """Each published prompt: its kind, flow, arguments, and its messages rendered
        with ``[argument]`` placeholders (what ``chainweaver inspect`` shows)."""
        return prompt_templates(self._exposure)

    def server_card(self, url: str = "http://127.0.0.1:8000/mcp") -> dict[str, Any]:
        """The server card an anonymous caller gets (its remote at ``url``): what that
        caller's lists show, nothing else. Over streamable HTTP each caller gets its
        own at ``<endpoint>/server-card`` (``docs/discovery.md``)."""
        return self._cards.anonymous_card(url)

    def registry_entry(self, url: str | None = None,
                       pypi: tuple[str, str] | None = None) -> dict[str, Any]:
        """The MCP registry ``server.json``: a remote at ``url`` and/or a PyPI package
        ``(name, version)``, naming what an anonymous caller may list."""
        return self._cards.registry_entry(url, pypi)

    def http_app(self, host: str = "127.0.0.1", port: int = 8000, *, path: str = "/mcp",
                 stateless: bool = False) -> Any:
        """The streamable-HTTP ASGI app :meth:`serve_async` runs for a bind to
        ``host``:``port`` (its Host/Origin rules), with the server card beside ``path``:
        for an ASGI server of your own, or ``httpx.ASGITransport`` in tests."""
        self._cards.install(self._fastmcp, path)
        return self._fastmcp.http_app(
            path=path, transport="streamable-http", stateless_http=stateless,
            host_origin_protection=False, middleware=[self._http_guard(host, port)])

    def _http_guard(self, host: str, port: int) -> Middleware:
        """The middleware in front of the HTTP endpoint: this bind's Host/Origin rules,
        and the audit of what is refused before an MCP request is read."""
        # SecurityConfig normalised both to tuples (or None) when it was built.
        hosts = cast("tuple[str, ...] | None", self.security.allowed_hosts)
        origins = cast("tuple[str, ...] | None", self.security.allowed_origins)
        return HostOriginRules.for_bind(host, port, hosts, origins).middleware(
            self.security.audit_hook, self.security.hook_timeout)

    def exposure_report(self) -> list[FlowExposure]:
        """One entry per registered flow name: exposed or not, and why (and, under a
        file watcher, ``stale`` when the flow's file holds an edit that is not served)."""
        report = list(self._exposure.report)
        stale = self._watcher.stale_flows() if self._watcher is not None else {}
        if stale:
            report = [dataclasses.replace(entry, stale=stale[entry.flow_name])
                      if entry.flow_name in stale else entry for entry in report]
        return report

    async def apply_shared_governance(self) -> None:
        """Read the shared governance state once and apply it, as serving does before
        its first request (``chainweaver card`` and ``server-json`` do, so that what
        they print names nothing governance withdrew). Raises when the state cannot be
        read; does nothing without ``governance``, or while the server runs (it follows
        the state then: a second, older read must not undo a newer one)."""
        if self._shared is not None and not self._shared.following:
            await self._shared.follower.apply_once()

    def run_worker(self) -> None:
        """Run the flows of background tasks until interrupted; serves no MCP transport.

        For ``tasks="redis://..."``: any number of such workers share the tasks that
        server replicas (``TaskSettings(concurrency=0)`` to only enqueue) create.
        """
        anyio.run(self.run_worker_async)

    async def run_worker_async(self) -> None:
        """See :meth:`run_worker`."""
        if self._tasks_url is None or self._tasks_url.startswith("memory://"):
            raise ExposureConfigError("run_worker needs tasks='redis://...': a worker runs "
                                      "tasks that other processes put on a shared queue")
        if self._shared is not None:
            self._shared.follower.as_worker()
        async with worker_lifespan(self._fastmcp):
            await anyio.sleep_forever()

    def serve(
        self,
        transport: Transport = "stdio",
        host: str = "127.0.0.1",
        port: int = 8000,
        **options: Any,
    ) -> None:
        """Serve until interrupted. See :meth:`serve_async`."""
        anyio.run(lambda: self.serve_async(transport, host, port, **options))

    async def serve_async(
        self,
        transport: Transport = "stdio",
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        path: str = "/mcp",
        stateless: bool = False,
        log_level: str | None = None,
    ) -> None:
        """Serve over stdio (stdout carries only MCP) or streamable HTTP on ``path``.

        ``stateless=True`` keeps no per-session state on HTTP, so several server
        processes can sit behind one load balancer. Over HTTP, requests whose ``Host``
        or ``Origin`` the security config does not accept for this bind are refused
        (421 and 403: DNS-rebinding protection, see :class:`SecurityConfig`).
        """
        if transport == "stdio":
            try:
                await self._fastmcp.run_async("stdio", show_banner=False, log_level=log_level)
            finally:
                flush_stray_stdout()
        elif transport == "streamable-http":
            guard = self._http_guard(host, port)
            self._cards.install(self._fastmcp, path)
            if stateless:
                self._notifier.without_back_channel(self._fastmcp)
                self._gate.without_sessions()  # no session to keep a log level for
            await self._fastmcp.run_async(
                "streamable-http", show_banner=False, host=host, port=port, path=path,
                stateless_http=stateless, log_level=log_level,
                # One Host/Origin check, ours: FastMCP's (off by default, or switched on
                # by its environment settings) would apply a second, looser list.
                host_origin_protection=False, middleware=[guard],
            )
        else:
            raise ExposureConfigError(
                f"transport must be 'stdio' or 'streamable-http', got {transport!r}"
            )


C = TypeVar("C")


def _step_authorizer(security: SecurityConfig, executor: FlowExecutor) -> Any:
    """The one step authorizer every run the server starts asks: the server's, or the
    executor's own (``FlowExecutor(step_authorizer=...)``), which a run started through
    MCP asks as well as an in-process one. Both, and different: a configuration error
    (which of them decides would be a guess)."""
    own = executor.step_authorizer
    served = security.step_authorizer
    if own is not None and served is not None and own is not served:
        raise ExposureConfigError(
            "step_authorizer is set on both the FlowExecutor and SecurityConfig; set it in "
            "one place (the server asks it before every step of every run)")
    return served if served is not None else own


def _serving_lifespan(inner: Callable[[FastMCP], Any], notifier: ChangeNotifier,
                      shared: SharedRunner | None) -> Callable[[FastMCP], Any]:
    """``inner`` (the gate's lifespan) with change notifications delivered meanwhile,
    and the shared governance state followed (``live/shared.py``)."""

    @asynccontextmanager
    async def lifespan(server: FastMCP) -> AsyncIterator[Any]:
        async with inner(server) as state, notifier.running(), running(shared):
            yield state

    return lifespan


def _config(setting: str, value: C | None, kind: type[C]) -> C:
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ExposureConfigError(
            f"{setting} must be a {kind.__name__}, got {type(value).__name__}")
    return value
