"""Publish ChainWeaver flows to MCP clients. Needs the ``mcp`` extra."""

try:
    import fastmcp  # noqa: F401
    import jsonschema  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "chainweaver.mcp needs the 'mcp' extra: pip install 'chainweaver[mcp]'"
    ) from error

from .audit_log import JsonlAuditLog
from .config import ErrorDetail, ExposurePolicy, SecurityConfig, ServingConfig
from .exposure import GUIDE_PROMPT_NAME, INDEX_URI, FlowExposure, schema_uri
from .hooks import (
    GATE_REFUSED,
    AuditEvent,
    AuditHook,
    Authenticator,
    AuthorizationDecision,
    Authorizer,
    CallerIdentity,
    GateContext,
    RateLimiter,
)
from .rate_limit import FixedWindowRateLimiter, RedisRateLimiter
from .server import FlowServer
from .task_setup import TaskSettings
from .views import Visibility, VisibleRule, visible_claim

__all__ = [
    "GATE_REFUSED",
    "GUIDE_PROMPT_NAME",
    "INDEX_URI",
    "AuditEvent",
    "AuditHook",
    "Authenticator",
    "AuthorizationDecision",
    "Authorizer",
    "CallerIdentity",
    "ErrorDetail",
    "ExposurePolicy",
    "FixedWindowRateLimiter",
    "FlowExposure",
    "FlowServer",
    "GateContext",
    "JsonlAuditLog",
    "RateLimiter",
    "RedisRateLimiter",
    "SecurityConfig",
    "ServingConfig",
    "Visibility",
    "VisibleRule",
    "TaskSettings",
    "schema_uri",
    "visible_claim",
]
