"""FlowServer's settings, grouped: what is published, how requests are guarded, how it serves.

Each object checks its values when it is built and raises :class:`ExposureConfigError`
naming the setting, so a bad configuration fails at start-up, never on a request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ExposureConfigError
from ..flows import FlowLifecycle
from ..safety import SideEffectLevel
from ..tools import NAME_PATTERN

if TYPE_CHECKING:
    from .security import AuditHook, Authenticator, Authorizer, RateLimiter

ErrorDetail = Literal["full", "type_only", "generic"]
ERROR_DETAILS: tuple[ErrorDetail, ...] = ("full", "type_only", "generic")
DEFAULT_LIFECYCLES = frozenset({FlowLifecycle.ACTIVE})
DEFAULT_SIDE_EFFECTS = frozenset({SideEffectLevel.NONE, SideEffectLevel.READ})


def check_bool(setting: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ExposureConfigError(f"{setting} must be True or False, got {value!r}")
    return value


def check_seconds(setting: str, value: object, *, optional: bool = False) -> float | None:
    """A positive, finite number of seconds (``None`` too when ``optional``)."""
    if value is None and optional:
        return None
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value <= 0):
        allowed = "None or " if optional else ""
        raise ExposureConfigError(
            f"{setting} must be {allowed}a number of seconds > 0, got {value!r}")
    return float(value)


def check_positive_int(setting: str, value: object, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        allowed = "None or " if optional else ""
        raise ExposureConfigError(f"{setting} must be {allowed}a positive int, got {value!r}")
    return value


def check_text(setting: str, value: object, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        allowed = "None or " if optional else ""
        raise ExposureConfigError(f"{setting} must be {allowed}a non-empty string, got {value!r}")
    return value


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
class ExposurePolicy:
    """Which flows a server is willing to publish.

    By default: ``active`` flows whose effective safety is ``none`` or ``read`` and
    that need no approval. ``force_expose`` bypasses the filters, and only for the
    flows named in ``flow_names``.
    """

    flow_names: Iterable[str] | None = None
    server_prefix: str = ""
    force_expose: bool = False
    allowed_lifecycles: Iterable[FlowLifecycle | str] | None = None
    allowed_side_effects: Iterable[SideEffectLevel | str] | None = None
    owners: Iterable[str] | None = None
    allow_requires_approval: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "flow_names", _names("flow_names", self.flow_names))
        set_(self, "owners", _names("owners", self.owners))
        check_bool("force_expose", self.force_expose)
        check_bool("allow_requires_approval", self.allow_requires_approval)
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
    """The gate's hooks (see ``docs/security.md``) and how much error text clients see.

    ``hook_timeout`` bounds every async hook; ``error_detail`` is ``"full"``,
    ``"type_only"`` or ``"generic"``.
    """

    authenticator: Authenticator | None = None
    rate_limiter: RateLimiter | None = None
    authorizer: Authorizer | None = None
    audit_hook: AuditHook | None = None
    hook_timeout: float = 5.0
    error_detail: ErrorDetail = "full"

    def __post_init__(self) -> None:
        for setting in ("authenticator", "authorizer", "audit_hook"):
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

    @property
    def active(self) -> bool:
        """Whether any hook is set (without hooks the gate stays out of the way)."""
        return any(hook is not None for hook in (self.authenticator, self.rate_limiter,
                                                 self.authorizer, self.audit_hook))


@dataclass(frozen=True)
class ServingConfig:
    """How the server runs requests: the per-call flow timeout and list page size.

    ``freeze_gc=True`` calls ``gc.freeze()`` once the server is built, so the
    garbage collector stops re-scanning the catalogue on every list (see
    ``docs/mcp-server.md``, "Start-up cost"). Objects alive then are never collected.
    """

    flow_timeout: float | None = None
    page_size: int | None = None
    freeze_gc: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "flow_timeout",
                           check_seconds("flow_timeout", self.flow_timeout, optional=True))
        check_positive_int("page_size", self.page_size, optional=True)
        check_bool("freeze_gc", self.freeze_gc)
