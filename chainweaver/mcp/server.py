"""FlowServer: publish the flows governance allows, as MCP tools, resources and prompts."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import anyio
from fastmcp import FastMCP
from mcp.server.request_state import RequestStateSecurity

from chainweaver import __version__
from chainweaver.errors import ExposureConfigError
from chainweaver.executor import FlowExecutor
from chainweaver.mcp.components.prompts import prompt_templates
from chainweaver.mcp.components.provider import FlowProvider
from chainweaver.mcp.components.tool_forms import add_tool_forms, check_tool_forms, tool_form_names
from chainweaver.mcp.config import (
    ExposurePolicy,
    SecurityConfig,
    ServingConfig,
    check_bool,
)
from chainweaver.mcp.fastmcp_seams import install_input_schema_lookup
from chainweaver.mcp.gate.admission import input_schema_lookup, pinned_snapshot
from chainweaver.mcp.gate.composition import gate_lifespan
from chainweaver.mcp.gate.http_guard import HostOriginRules
from chainweaver.mcp.gate.mounting import MountedCompletions, MountedGate
from chainweaver.mcp.gate.security import SecurityGate
from chainweaver.mcp.gate.views import Views, check_visible
from chainweaver.mcp.live.notifications import ChangeNotifier, SnapshotPins
from chainweaver.mcp.live.shared import SharedRunner, running, shared_runner
from chainweaver.mcp.process import flush_stray_stdout, freeze_gc
from chainweaver.mcp.publish.exposure import INDEX_URI, Exposure, FlowExposure, LiveExposure
from chainweaver.mcp.runs.approval import RunSettings
from chainweaver.mcp.runs.metrics import RequestMetrics, ServerMetrics
from chainweaver.mcp.runs.records import RunStore
from chainweaver.mcp.runs.setup import connect_run_log, open_run_log, output_spill
from chainweaver.mcp.runs.telemetry import FlowTelemetry
from chainweaver.mcp.tasks.setup import TaskSettings, add_tasks, check_tasks, worker_lifespan
from chainweaver.prompts import FlowPrompt
from chainweaver.registry import RegistryState
from chainweaver.tools import NAME_PATTERN
from chainweaver.watch import FlowFileWatcher

if TYPE_CHECKING:
    from chainweaver.mcp.tasks.runner import FlowTaskRunner

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

    ``tasks`` (``"memory://"`` or ``"redis://host:port/db"``; needs the ``tasks`` extra)
    lets clients run flows as MCP background tasks; ``task_mode`` is the mode of flows
    that set none, and ``task_settings`` tunes the task engine (see ``docs/tasks.md``).
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
        policy, security, serving, tasks = _moved_keywords(
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
        keys = cast("tuple[bytes, ...] | None", serving.request_state_keys)
        self._run_log = run_log = open_run_log(serving.run_history)
        # Without a history, outputs too large to send are kept in this process: a task
        # on a shared backend may run in another, whose spill no client could read.
        outputs = run_log or output_spill(task_links=task_settings is None
                                          or task_settings.url.startswith("memory://"))
        self._provider = FlowProvider(self._exposure, executor,
                                      error_detail=security.error_detail,
                                      flow_timeout=serving.flow_timeout, owner=owner,
                                      runs=RunSettings.build(
                                          policy.approval == "elicit", approval_timeout,
                                          keys, serving.run_notifications,
                                          step_authorizer=security.step_authorizer,
                                          refresh_caller=security.refresh_caller),
                                      views=views, run_log=run_log, outputs=outputs)
        self._notifier = ChangeNotifier(self._exposure,
                                        debounce=cast(float, serving.change_debounce),
                                        on_rebuilt=self._provider.forget_unpublished,
                                        views=views,
                                        callers_from_token=security.authenticator is None)
        self._pins = SnapshotPins(self._exposure, self._notifier)
        # The gate reads the live reference like a snapshot: the request's pinned one.
        gated = cast(Exposure, self._exposure)
        metrics = ServerMetrics(serving.meter_provider)
        # The gate counts, times and caps what it serves, and watches each flow run's
        # steps for its spans: no middleware layers of their own (each costs a request).
        self._gate = SecurityGate(
            gated, security, owner=owner, views=views, refusals=metrics.refused,
            observe=RequestMetrics(metrics, gated).observe,
            watch_run=FlowTelemetry(gated, security.error_detail, metrics).watch,
            body_limit=serving.max_body_bytes, pin=self._pins.serve)
        # Before the snapshot follower subscribes: shared decisions govern a change first.
        self._shared = shared_runner(cast(Any, serving.governance), executor.registry)
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
            add_tasks(self._fastmcp, self._provider, security, task_settings.url,
                      task_settings)
            # A task leg's run counts in chainweaver.runs and .steps like an inline one.
            cast("FlowTaskRunner", self._provider.task_runner).count_runs(metrics)
        if expose_schemas or expose_prompts or run_log is not None:
            self._fastmcp.add_completion_handler(self._provider.complete)
        add_tool_forms(self._fastmcp, cast(Exposure, self._exposure), resources=resources_as_tools,
                       prompts=prompts_as_tools)
        install_input_schema_lookup(self._fastmcp, input_schema_lookup(
            self._fastmcp, self._exposure, views,
            caller_known=security.authenticator is None))
        self._notifier.install(self._fastmcp, resources=expose_schemas or run_log is not None,
                               page_size=serving.page_size, provider=self._provider)
        connect_run_log(outputs, self._gate, self._provider, self._notifier)
        self._watcher: FlowFileWatcher | None = None
        # Followed as long as anything serves: the FastMCP server (through its
        # middleware) keeps the follower alive, the registry only refers to it weakly.
        follower = _Follower(executor, policy, prompts, self._exposure, self._notifier,
                             tool_form_names(resources=resources_as_tools,
                                             prompts=prompts_as_tools))
        self._pins.keep_alive = follower
        self._follower = follower
        self._unsubscribe = executor.registry.subscribe(_weakly(follower))
        follower()  # a change made since the first snapshot was taken
        if serving.freeze_gc:
            # Decide every flow first, so the snapshot is among what is frozen: the
            # operator traded a slower start for lists that skip it.
            self._exposure.catalogue  # noqa: B018
            freeze_gc()

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
        refused (and logged as an error) whenever the gate has hooks.
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
        parent.add_middleware(MountedGate(self._gate, self._fastmcp, namespace))
        parent.mount(self._fastmcp, namespace=namespace)
        if self._exposure.expose_schemas or self._exposure.expose_prompts:
            MountedCompletions.install(parent, namespace, self._provider.complete)

    @property
    def run_store(self) -> RunStore | None:
        """Where run records are kept (None: no ``ServingConfig(run_history=...)``)."""
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

    def exposure_report(self) -> list[FlowExposure]:
        """One entry per registered flow name: exposed or not, and why (and, under a
        file watcher, ``stale`` when the flow's file holds an edit that is not served)."""
        report = list(self._exposure.report)
        stale = self._watcher.stale_flows() if self._watcher is not None else {}
        if stale:
            report = [dataclasses.replace(entry, stale=stale[entry.flow_name])
                      if entry.flow_name in stale else entry for entry in report]
        return report

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
            self._shared.follower.role = "worker"
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
        or ``Origin`` the serving config does not accept for this bind are refused
        (421 and 403: DNS-rebinding protection, see :class:`ServingConfig`).
        """
        if transport == "stdio":
            try:
                await self._fastmcp.run_async("stdio", show_banner=False, log_level=log_level)
            finally:
                flush_stray_stdout()
        elif transport == "streamable-http":
            # ServingConfig normalised both to tuples (or None) when it was built.
            hosts = cast("tuple[str, ...] | None", self.serving.allowed_hosts)
            origins = cast("tuple[str, ...] | None", self.serving.allowed_origins)
            guard = HostOriginRules.for_bind(host, port, hosts, origins)
            if stateless:
                self._notifier.without_back_channel(self._fastmcp)
                self._gate.keeps_sessions = False  # no session to keep a log level for
            await self._fastmcp.run_async(
                "streamable-http", show_banner=False, host=host, port=port, path=path,
                stateless_http=stateless, log_level=log_level,
                # One Host/Origin check, ours: FastMCP's (off by default, or switched on
                # by its environment settings) would apply a second, looser list.
                host_origin_protection=False, middleware=[guard.middleware()],
            )
        else:
            raise ExposureConfigError(
                f"transport must be 'stdio' or 'streamable-http', got {transport!r}"
            )


C = TypeVar("C")


class _Follower:
    """Swaps a new snapshot in for every registry change (a registry listener)."""

    def __init__(self, executor: FlowExecutor, policy: ExposurePolicy,
                 prompts: Sequence[FlowPrompt], live: LiveExposure,
                 notifier: ChangeNotifier, tool_forms: tuple[str, ...] = ()) -> None:
        self.executor = executor
        self.policy = policy
        self.prompts = prompts
        self.live = live
        self.notifier = notifier
        self.tool_forms = tool_forms  # names resources/prompts_as_tools took
        self._lock = threading.Lock()

    def __call__(self, change: object = None) -> None:
        """Swap in a snapshot of the registry as it is now.

        Runs inside the change, so once ``set_lifecycle`` or ``unregister`` returns no
        request starting afterwards sees the old snapshot. Building is cheap: flows
        are judged when first needed, unchanged ones carried over. A snapshot that
        cannot be built (a name collision, a flow under a tool name that
        resources_as_tools / prompts_as_tools took) raises, and the registry refuses
        the change.
        """
        with self._lock:
            latest = self.live.latest
            state = self.executor.registry.state()
            if state.sequence <= latest.sequence:
                return
            self.live.swap(self._snapshot(state, latest))
        self.notifier.changed()

    def vet(self, state: RegistryState) -> None:
        """Raise, as :meth:`__call__` would, when ``state`` (a registry state that
        does not exist yet: a flow file watcher's edit) could not be published."""
        self._snapshot(state, self.live.latest)

    def _snapshot(self, state: RegistryState, latest: Exposure) -> Exposure:
        snapshot = Exposure(
            self.executor, self.policy, expose_schemas=latest.expose_schemas,
            expose_prompts=latest.expose_prompts, server_prompts=self.prompts,
            state=state, previous=latest)
        check_tool_forms(snapshot, self.tool_forms)
        return snapshot


def _weakly(follower: _Follower) -> Callable[[object], None]:
    """A registry listener that does not keep ``follower`` alive."""
    ref = weakref.ref(follower)

    def follow(change: object) -> None:
        alive = ref()
        if alive is not None:
            alive(change)

    return follow


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


# The keywords FlowServer took before they moved into the configuration objects (one
# release with a DeprecationWarning): keyword -> (object, its field).
MOVED_KEYWORDS = {
    "name": ("serving", "name"), "version": ("serving", "version"),
    "instructions": ("serving", "instructions"),
    "approval_timeout": ("serving", "approval_timeout"),
    "resources_as_tools": ("serving", "resources_as_tools"),
    "prompts_as_tools": ("serving", "prompts_as_tools"),
    "approval": ("policy", "approval"), "auth": ("security", "auth"),
    "visible": ("security", "visible"),
    "task_mode": ("tasks", "mode"), "task_settings": ("tasks", "TaskSettings"),
}


def _moved_keywords(given: dict[str, Any], policy: ExposurePolicy,
                    security: SecurityConfig, serving: ServingConfig,
                    tasks: str | TaskSettings | None
                    ) -> tuple[ExposurePolicy, SecurityConfig, ServingConfig,
                               str | TaskSettings | None]:
    """Fold the keywords that moved into the configuration objects, warning once each."""
    unknown = sorted(set(given) - set(MOVED_KEYWORDS))
    if unknown:
        raise TypeError(f"FlowServer() got unexpected keyword argument(s): "
                        f"{', '.join(unknown)}")
    configs: dict[str, Any] = {"policy": policy, "security": security, "serving": serving}
    for keyword, value in given.items():
        where, field = MOVED_KEYWORDS[keyword]
        hint = (f"tasks={field}(...)" if field == "TaskSettings"
                else f"tasks=TaskSettings(url=..., {field}=...)" if where == "tasks"
                else f"{where}={type(configs[where]).__name__}({field}=...)")
        warnings.warn(f"FlowServer({keyword}=...) is deprecated and will be removed in the "
                      f"next release: use {hint}", DeprecationWarning, stacklevel=3)
        if where != "tasks":
            if keyword == "auth" and value is not None and security.auth is not None:
                raise ExposureConfigError("auth is set twice: give it to FlowServer or to "
                                          "SecurityConfig, not both")
            configs[where] = dataclasses.replace(configs[where], **{field: value})
    if "task_mode" in given or "task_settings" in given:
        tasks = check_tasks(tasks, given.get("task_mode"), given.get("task_settings"))
    return configs["policy"], configs["security"], configs["serving"], tasks
