"""FlowServer's settings, grouped: what is published, how requests are guarded, how it serves.

Each object checks its values when it is built and raises :class:`ExposureConfigError`
naming the setting, so a bad configuration fails at start-up, never on a request.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, InitVar, dataclass
from types import MappingProxyType
from typing import Any, Literal, cast

from fastmcp.server.auth import AuthProvider

from chainweaver.errors import DefinitionError, ExposureConfigError
from chainweaver.flows import FlowLifecycle, TaskMode, check_task_mode
from chainweaver.governance.state import check_governance
from chainweaver.grants import StepAuthorizer
from chainweaver.mcp.checks import (
    HOST,
    ORIGIN,
    check_bool,
    check_positive_int,
    check_seconds,
    check_text,
    header_values,
    state_keys,
)
from chainweaver.mcp.hooks import (
    AuditHook,
    Authenticator,
    Authorizer,
    CallerIdentity,
    RateLimiter,
)
from chainweaver.safety import SideEffectLevel
from chainweaver.tools import NAME_PATTERN

ErrorDetail = Literal["full", "type_only", "generic"]
ApprovalMode = Literal["exclude", "elicit"]
APPROVAL_MODES: tuple[ApprovalMode, ...] = ("exclude", "elicit")
ERROR_DETAILS: tuple[ErrorDetail, ...] = ("full", "type_only", "generic")
DEFAULT_LIFECYCLES = frozenset({FlowLifecycle.ACTIVE})
DEFAULT_SIDE_EFFECTS = frozenset({SideEffectLevel.NONE, SideEffectLevel.READ})
PromptKind = Literal["invocation", "authored", "server", "guide"]
PROMPT_KINDS: tuple[PromptKind, ...] = ("invocation", "authored", "server", "guide")
# Generous: the index of 20,000 flows is about 8 MiB; one body above this is an abuse.
DEFAULT_MAX_BODY_BYTES = 16 * 2**20
# A server's name in a server card and the MCP registry: namespace "/" name.
REGISTRY_NAME = re.compile(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+")


def _names(setting: str, value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ExposureConfigError(f"{setting} takes a list of names, got {value!r}")
    names = list(value)
    wrong = [name for name in names if not isinstance(name, str)]
    if wrong:
        raise ExposureConfigError(f"{setting} takes names (strings), got {wrong[0]!r}")
    return frozenset(names)


def _enum_set(setting: str, value: object, kind: type[Any], default: frozenset[Any]
              ) -> frozenset[Any]:
    if value is None:
        return default
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ExposureConfigError(f"{setting} takes a list of values, got {value!r}")
    try:
        return frozenset(kind(item) for item in value)
    except ValueError as error:
        allowed = ", ".join(member.value for member in kind)
        raise ExposureConfigError(f"{setting}: {error} (allowed: {allowed})") from None


@dataclass(frozen=True)
class PromptPolicy:
    """Which prompts a server publishes (with ``expose_prompts=True``); tools and
    resources are never affected.

    ``kinds``: any of ``"invocation"`` (schema-derived, named like the tool),
    ``"authored"`` (a flow's own prompts), ``"server"`` (FlowServer's ``prompts=``) and
    ``"guide"`` (``chainweaver_guide``); default: all four. ``flow_names``: publish the
    flow prompts (invocation and authored) of these flows only; ``None``: every
    published flow's. ``exposure_report()`` says why each withheld prompt is withheld.
    """

    kinds: Iterable[PromptKind | str] | None = None
    flow_names: Iterable[str] | None = None

    def __post_init__(self) -> None:
        kinds = _names("prompts.kinds", self.kinds)
        unknown = sorted(kinds - set(PROMPT_KINDS)) if kinds is not None else []
        if unknown:
            raise ExposureConfigError(f"prompts.kinds: unknown kind(s) {', '.join(unknown)} "
                                      f"(allowed: {', '.join(PROMPT_KINDS)})")
        object.__setattr__(self, "kinds", frozenset(PROMPT_KINDS) if kinds is None else kinds)
        object.__setattr__(self, "flow_names", _names("prompts.flow_names", self.flow_names))

    def publishes(self, kind: PromptKind) -> bool:
        return kind in cast("frozenset[str]", self.kinds)

    def withheld(self, kind: PromptKind, flow_name: str) -> str | None:
        """Why a flow's prompt of ``kind`` is not published (None: it is)."""
        if not self.publishes(kind):
            shown = ", ".join(k for k in PROMPT_KINDS if self.publishes(k)) or "none"
            return f"{kind} prompts are not published (prompt kinds: {shown})"
        names = cast("frozenset[str] | None", self.flow_names)
        if names is not None and flow_name not in names:
            return "flow not listed in the prompt policy's flow_names"
        return None


@dataclass(frozen=True)
class ExposurePolicy:
    """Which flows a server is willing to publish.

    By default: ``active`` flows whose effective safety is ``none`` or ``read`` and
    that need no approval. ``force_expose`` bypasses the filters, and only for the
    flows named in ``flow_names``. ``approval="elicit"`` publishes flows that need
    approval too, and each call asks the user before any step runs (see
    ``docs/mcp-server.md``); ``allow_requires_approval`` publishes them without asking.
    ``prompts`` (a :class:`PromptPolicy`) narrows which prompts are published. A flow
    whose governance says ``publish=False`` is never published, whatever this says.
    """

    flow_names: Iterable[str] | None = None
    server_prefix: str = ""
    force_expose: bool = False
    allowed_lifecycles: Iterable[FlowLifecycle | str] | None = None
    allowed_side_effects: Iterable[SideEffectLevel | str] | None = None
    owners: Iterable[str] | None = None
    allow_requires_approval: bool = False
    approval: ApprovalMode = "exclude"
    # Background tasks: the mode of flows that set none. FlowServer sets it from its
    # ``tasks``/``task_mode`` arguments; None means there is no task backend at all.
    task_mode: TaskMode | None = None
    prompts: PromptPolicy = PromptPolicy()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.prompts, PromptPolicy):
            raise ExposureConfigError(f"prompts must be a PromptPolicy, got "
                                      f"{type(self.prompts).__name__}")
        try:
            check_task_mode("task_mode", self.task_mode)
        except DefinitionError as error:
            raise ExposureConfigError(str(error)) from None
        set_(self, "flow_names", _names("flow_names", self.flow_names))
        set_(self, "owners", _names("owners", self.owners))
        check_bool("force_expose", self.force_expose)
        check_bool("allow_requires_approval", self.allow_requires_approval)
        if self.approval not in APPROVAL_MODES:
            raise ExposureConfigError(
                f"approval must be one of {', '.join(APPROVAL_MODES)}, got {self.approval!r}")
        if not isinstance(self.server_prefix, str) or (
                self.server_prefix and not NAME_PATTERN.fullmatch(self.server_prefix)):
            raise ExposureConfigError(
                f"server_prefix {self.server_prefix!r} is not a valid name part "
                "(letters, digits, '_', '-', '.')")
        if self.force_expose and self.flow_names is None:
            raise ExposureConfigError(
                "force_expose=True needs flow_names: it only bypasses the filters for "
                "flows named there")
        set_(self, "allowed_lifecycles", _enum_set(
            "allowed_lifecycles", self.allowed_lifecycles, FlowLifecycle, DEFAULT_LIFECYCLES))
        set_(self, "allowed_side_effects", _enum_set(
            "allowed_side_effects", self.allowed_side_effects, SideEffectLevel,
            DEFAULT_SIDE_EFFECTS))

    def tool_name(self, flow_name: str) -> str:
        """The published tool name of a flow under this policy's prefix."""
        return f"{self.server_prefix}__{flow_name}" if self.server_prefix else flow_name


@dataclass(frozen=True)
class SecurityConfig:
    """How requests are guarded: the gate's hooks (see ``docs/security.md``), how much
    error text clients see, and the checks of the transport and of what is sent.

    ``hook_timeout`` bounds every async hook; ``error_detail`` is ``"full"``,
    ``"type_only"`` or ``"generic"``. ``auth`` is a FastMCP ``AuthProvider`` (for
    example ``StaticTokenVerifier`` or ``JWTVerifier``) that streamable HTTP enforces
    before any MCP message is read: a request without a valid bearer token gets HTTP
    401 with ``WWW-Authenticate: Bearer``. It does not apply to stdio. ``visible`` is the
    per-caller view rule: ``(caller, flow) -> bool``, a ``Visibility`` or
    ``visible_claim(...)`` (``docs/security.md``, "Per-caller views").

    ``allowed_hosts`` / ``allowed_origins`` (``None``: the defaults) protect streamable
    HTTP against DNS rebinding. On a loopback bind only ``127.0.0.1``, ``localhost`` and
    ``[::1]`` with the bound port are accepted, plus the values listed here. On any
    other bind the Host is checked only when ``allowed_hosts`` is set, and a request
    carrying an ``Origin`` is refused unless ``allowed_origins`` lists it. Hosts are
    ``name``, ``name:port`` or ``name:*`` (any port); origins are
    ``scheme://name[:port]`` or ``scheme://name:*``; ``"*"`` switches that check off.

    ``max_body_bytes`` caps what one rendered prompt or resource read returns (UTF-8
    text or blob bytes; default 16 MiB, ``None``: no cap): above it the request gets
    -32602 naming the cap, audited as ``body_too_large``. ``request_state_keys``
    (secrets of at least 32 bytes; the first seals, all unseal) protect the state a
    2026-07-28 client echoes when it answers an approval question inside a call.
    Without them each process uses a key of its own, so the answer must reach the
    process that asked: give every replica the same keys when there are several (CLI:
    ``--request-state-key-file``). An approval inside a background task needs none.

    ``step_authorizer`` is asked before every attempt of every step of a run (tool
    call, retry, fallback, sub-flow), in every lane, after the declared grants held:
    ``(StepRequest) -> bool | StepDecision`` (``docs/step-grants.md``). It may narrow
    what declared grants allow, never widen it. ``refresh_caller`` gives the caller as
    it is *now* before each of those checks (``(CallerIdentity) -> CallerIdentity |
    None``, sync or async; None: the caller is gone and the step is refused), so a
    revoked grant stops a long run or a resumed task at its next step.

    ``max_listen_streams_per_caller`` / ``max_listen_streams`` bound the 2026-07-28
    ``subscriptions/listen`` streams open at once, per caller (anonymous callers are one
    caller) and server-wide; one over a cap is refused with -32001
    (``docs/live-governance.md``, "Open listen streams").
    """

    authenticator: Authenticator | None = None
    rate_limiter: RateLimiter | None = None
    authorizer: Authorizer | None = None
    audit_hook: AuditHook | None = None
    hook_timeout: float = 5.0
    error_detail: ErrorDetail = "full"
    auth: AuthProvider | None = None
    visible: Any = None  # VisibleRule | Visibility | None, checked by FlowServer
    allowed_hosts: Iterable[str] | None = None
    allowed_origins: Iterable[str] | None = None
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    request_state_keys: Iterable[str | bytes] | None = None
    step_authorizer: StepAuthorizer | None = None
    refresh_caller: Callable[[CallerIdentity], Any] | None = None
    max_listen_streams_per_caller: int = 100
    max_listen_streams: int = 10_000

    def __post_init__(self) -> None:
        if self.auth is not None and not isinstance(self.auth, AuthProvider):
            raise ExposureConfigError(
                f"auth must be a fastmcp AuthProvider or None, got {self.auth!r}")
        for setting in ("authenticator", "authorizer", "audit_hook", "step_authorizer",
                        "refresh_caller"):
            hook = getattr(self, setting)
            if hook is not None and not callable(hook):
                raise ExposureConfigError(f"{setting} must be callable or None, got {hook!r}")
        limiter = self.rate_limiter
        if limiter is not None and not callable(getattr(limiter, "acquire", None)):
            raise ExposureConfigError(
                f"rate_limiter must have an acquire(caller, name) method, got {limiter!r}")
        object.__setattr__(self, "hook_timeout", check_seconds("hook_timeout",
                                                               self.hook_timeout))
        if self.error_detail not in ERROR_DETAILS:
            raise ExposureConfigError(
                f"error_detail must be one of {', '.join(ERROR_DETAILS)}, "
                f"got {self.error_detail!r}")
        check_positive_int("max_body_bytes", self.max_body_bytes, optional=True)
        check_positive_int("max_listen_streams_per_caller",
                           self.max_listen_streams_per_caller)
        check_positive_int("max_listen_streams", self.max_listen_streams)
        object.__setattr__(self, "allowed_hosts",
                           header_values("allowed_hosts", self.allowed_hosts, HOST))
        object.__setattr__(self, "allowed_origins",
                           header_values("allowed_origins", self.allowed_origins, ORIGIN))
        object.__setattr__(self, "request_state_keys", state_keys(self.request_state_keys))

    @property
    def active(self) -> bool:
        """Whether any hook is set (without hooks the gate stays out of the way)."""
        return any(hook is not None for hook in (self.authenticator, self.rate_limiter,
                                                 self.authorizer, self.audit_hook))


# Settings ServingConfig took before they moved (one release with a DeprecationWarning):
# setting -> where it is now.
MOVED_SETTINGS = {
    "allowed_hosts": "SecurityConfig", "allowed_origins": "SecurityConfig",
    "request_state_keys": "SecurityConfig", "max_body_bytes": "SecurityConfig",
    "run_history": "FlowServer", "governance": "FlowServer",
    "meter_provider": "FlowServer",
}
_NOT_GIVEN: Any = object()  # a moved setting left out
# Their defaults when they were ServingConfig's: given so (as dataclasses.replace does,
# reading them back), a setting counts as left out.
_OLD_DEFAULTS: dict[str, Any] = {**dict.fromkeys(MOVED_SETTINGS),
                                 "max_body_bytes": DEFAULT_MAX_BODY_BYTES}


def _left_out(setting: str, value: Any) -> bool:
    default = _OLD_DEFAULTS[setting]
    return value is _NOT_GIVEN or value is default or (
        type(value) is int and value == default)


@dataclass(frozen=True)
class ServingConfig:
    """How the server serves: what it says of itself, how long a call may run, how
    lists are paged, and how runs talk back.

    ``name``, ``version`` (default: ChainWeaver's) and ``instructions`` are what the
    server says of itself to clients. ``flow_timeout`` (seconds) bounds each call's
    run; ``page_size`` pages every list (``None``: one page). ``approval_timeout``
    (seconds) is how long a run waits for the user's approval answer.
    ``run_notifications=False`` stops runs reporting per-step progress and log messages,
    even to clients that ask (FastMCP's client asks for both on every call): each one is
    a notification, which over HTTP turns the reply into an event stream. A background
    task's status message is kept. ``change_debounce`` (seconds) is how long the server
    waits after a registry change before telling clients, so a burst of changes is one
    notification (``docs/live-governance.md``). ``resources_as_tools`` /
    ``prompts_as_tools`` add FastMCP's tool forms of the resources and prompts, for
    tools-only clients. ``freeze_gc=True`` calls ``gc.freeze()`` once the server is
    built, so the garbage collector stops re-scanning the catalogue on every list (see
    ``docs/mcp-server.md``, "Start-up cost"); objects alive then are never collected.

    Deprecated (they moved; one release with a ``DeprecationWarning``):
    ``allowed_hosts``, ``allowed_origins``, ``max_body_bytes`` and
    ``request_state_keys`` are :class:`SecurityConfig` settings; ``run_history``,
    ``governance`` and ``meter_provider`` are ``FlowServer`` keywords.
    """

    flow_timeout: float | None = None
    page_size: int | None = None
    freeze_gc: bool = False
    change_debounce: float = 0.05
    run_notifications: bool = True
    name: str = "chainweaver"
    version: str | None = None
    instructions: str | None = None
    approval_timeout: float = 300.0
    resources_as_tools: bool = False
    prompts_as_tools: bool = False
    _: KW_ONLY
    allowed_hosts: InitVar[Any] = _NOT_GIVEN
    allowed_origins: InitVar[Any] = _NOT_GIVEN
    request_state_keys: InitVar[Any] = _NOT_GIVEN
    max_body_bytes: InitVar[Any] = _NOT_GIVEN
    run_history: InitVar[Any] = _NOT_GIVEN
    governance: InitVar[Any] = _NOT_GIVEN
    meter_provider: InitVar[Any] = _NOT_GIVEN

    def __post_init__(self, allowed_hosts: Any, allowed_origins: Any,
                      request_state_keys: Any, max_body_bytes: Any, run_history: Any,
                      governance: Any, meter_provider: Any) -> None:
        check_text("name", self.name)
        check_text("version", self.version, optional=True)
        if self.instructions is not None and not isinstance(self.instructions, str):
            raise ExposureConfigError(f"instructions must be None or a string, got "
                                      f"{self.instructions!r}")
        object.__setattr__(self, "approval_timeout",
                           check_seconds("approval_timeout", self.approval_timeout))
        check_bool("resources_as_tools", self.resources_as_tools)
        check_bool("prompts_as_tools", self.prompts_as_tools)
        object.__setattr__(self, "flow_timeout",
                           check_seconds("flow_timeout", self.flow_timeout, optional=True))
        check_positive_int("page_size", self.page_size, optional=True)
        check_bool("freeze_gc", self.freeze_gc)
        check_bool("run_notifications", self.run_notifications)
        object.__setattr__(self, "change_debounce",
                           check_seconds("change_debounce", self.change_debounce))
        given = {"allowed_hosts": allowed_hosts, "allowed_origins": allowed_origins,
                 "request_state_keys": request_state_keys, "max_body_bytes": max_body_bytes,
                 "run_history": run_history, "governance": governance,
                 "meter_provider": meter_provider}
        moved = {setting: value for setting, value in given.items()
                 if not _left_out(setting, value)}
        for setting in moved:
            where = MOVED_SETTINGS[setting]
            hint = f"FlowServer({setting}=...)" if where == "FlowServer" \
                else f"security=SecurityConfig({setting}=...)"
            warnings.warn(f"ServingConfig({setting}=...) is deprecated and will be removed "
                          f"in the next release: use {hint}", DeprecationWarning,
                          stacklevel=3)
        # Checked now, as where they moved to checks them: a bad value fails here.
        security = SecurityConfig(**{setting: value for setting, value in moved.items()
                                     if MOVED_SETTINGS[setting] == "SecurityConfig"})
        checked = {setting: getattr(security, setting) if where == "SecurityConfig"
                   else check_feature(setting, moved[setting])
                   for setting, where in MOVED_SETTINGS.items() if setting in moved}
        object.__setattr__(self, "_moved", MappingProxyType(checked))

    @property
    def moved(self) -> Mapping[str, Any]:
        """The deprecated settings given here, checked, by name (FlowServer takes them
        to where they moved)."""
        moved: Mapping[str, Any] = getattr(self, "_moved", MappingProxyType({}))
        return moved


def _moved_reader(setting: str) -> property:
    """Reading a moved setting off a ``ServingConfig`` answers for one more release:
    the value given here (it warned then), else its old default."""
    default = _OLD_DEFAULTS[setting]
    return property(lambda self: self.moved.get(setting, default),
                    doc=f"Deprecated: moved to {MOVED_SETTINGS[setting]}.")


# dataclass left the moved settings' defaults as class attributes (__init__ keeps its
# own copies): readers get what was given instead. setattr, as mypy knows these
# names as InitVars only.
setattr(ServingConfig, "allowed_hosts", _moved_reader("allowed_hosts"))  # noqa: B010
setattr(ServingConfig, "allowed_origins", _moved_reader("allowed_origins"))  # noqa: B010
setattr(ServingConfig, "request_state_keys", _moved_reader("request_state_keys"))  # noqa: B010
setattr(ServingConfig, "max_body_bytes", _moved_reader("max_body_bytes"))  # noqa: B010
setattr(ServingConfig, "run_history", _moved_reader("run_history"))  # noqa: B010
setattr(ServingConfig, "governance", _moved_reader("governance"))  # noqa: B010
setattr(ServingConfig, "meter_provider", _moved_reader("meter_provider"))  # noqa: B010


@dataclass(frozen=True)
class Discovery:
    """How the server is found and how long what it says may be reused
    (``docs/discovery.md``).

    ``registry_name`` (reverse-DNS, ``io.github.me/orders``) names the server in its
    server card and registry entry (default ``chainweaver.local/<name>``). ``cache_ttl``
    (seconds, default 0) is the longest a 2026-07-28 client may reuse a list or read,
    or a reader the server card, before asking again; ``0`` marks every answer stale
    at once.
    """

    registry_name: str | None = None
    cache_ttl: float = 0.0

    def __post_init__(self) -> None:
        if self.registry_name is not None and not (
                isinstance(self.registry_name, str)
                and REGISTRY_NAME.fullmatch(self.registry_name)):
            raise ExposureConfigError(
                f"registry_name must be a reverse-DNS name with one '/' "
                f"(io.github.me/orders), got {self.registry_name!r}")
        if (not isinstance(self.cache_ttl, (int, float)) or isinstance(self.cache_ttl, bool)
                or not math.isfinite(self.cache_ttl) or self.cache_ttl < 0):
            raise ExposureConfigError(f"cache_ttl must be a number of seconds >= 0, got "
                                      f"{self.cache_ttl!r}")
        object.__setattr__(self, "cache_ttl", float(self.cache_ttl))


def check_feature(setting: str, value: Any) -> Any:
    """A ``FlowServer`` feature keyword, checked: ``run_history`` (None or a
    :class:`RunHistory`), ``governance`` (None, a ``redis://`` URL or a
    ``GovernanceSettings``), ``discovery`` (None: the defaults, or a
    :class:`Discovery`) or ``meter_provider`` (None or an OpenTelemetry
    ``MeterProvider``)."""
    if setting == "run_history":
        if value is not None and not isinstance(value, RunHistory):
            raise ExposureConfigError(f"run_history must be None or a RunHistory, got "
                                      f"{type(value).__name__}")
        return value
    if setting == "governance":
        return check_governance(value)
    if setting == "discovery":
        if value is None:
            return Discovery()
        if not isinstance(value, Discovery):
            raise ExposureConfigError(f"discovery must be None or a Discovery, got "
                                      f"{type(value).__name__}")
        return value
    if value is not None and not callable(getattr(value, "get_meter", None)):
        raise ExposureConfigError(f"meter_provider must be an OpenTelemetry "
                                  f"MeterProvider, got {value!r}")
    return value


RUN_STORE_SCHEMES = ("memory://", "redis://", "rediss://")


@dataclass(frozen=True)
class RunHistory:
    """Run records and large outputs as resources (see ``docs/run-history.md``).

    ``store``: ``memory://`` (this process) or ``redis://...`` (replicas share it; needs
    the tasks extra). Retention: at most ``max_runs`` runs younger than ``max_age``
    seconds (in memory, past ``max_runs`` the caller holding the most runs gives up its
    oldest; on Redis, the oldest go). ``output_limit``: serialised outputs longer than
    this many bytes travel as a preview and a ``resource_link`` to
    ``chainweaver://runs/{run_id}/output``.
    ``max_output_bytes`` bounds the outputs the in-memory store keeps (oldest dropped
    first). ``prefix``: the Redis key prefix.
    """

    store: str = "memory://"
    max_runs: int = 10_000
    max_age: float = 7 * 86400.0
    output_limit: int = 65_536
    max_output_bytes: int = 256 * 2**20
    prefix: str = "chainweaver:runs"

    def __post_init__(self) -> None:
        if not isinstance(self.store, str) or not self.store.startswith(RUN_STORE_SCHEMES):
            raise ExposureConfigError(
                f"run_history store must be a URL starting with "
                f"{', '.join(RUN_STORE_SCHEMES)}, got {self.store!r}")
        check_positive_int("max_runs", self.max_runs)
        object.__setattr__(self, "max_age", check_seconds("max_age", self.max_age))
        check_positive_int("output_limit", self.output_limit)
        check_positive_int("max_output_bytes", self.max_output_bytes)
        check_text("prefix", self.prefix)
