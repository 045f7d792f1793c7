"""Publish ChainWeaver flows to MCP clients. Needs the ``mcp`` extra."""

try:
    import fastmcp  # noqa: F401
    import jsonschema  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "chainweaver.mcp needs the mcp extra: pip install -e '.[mcp]' in a clone of "
        "ChainWeaver"
    ) from error

from chainweaver.mcp.config import (
    Discovery,
    ErrorDetail,
    ExposurePolicy,
    PromptPolicy,
    RunHistory,
    SecurityConfig,
    ServingConfig,
)
from chainweaver.mcp.gate.audit_log import JsonlAuditLog
from chainweaver.mcp.gate.rate_limit import FixedWindowRateLimiter, RedisRateLimiter
from chainweaver.mcp.gate.views import Visibility, VisibleRule, visible_claim
from chainweaver.mcp.hooks import (
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
from chainweaver.mcp.publish.exposure import GUIDE_PROMPT_NAME, INDEX_URI, FlowExposure, schema_uri
from chainweaver.mcp.server import FlowServer
from chainweaver.mcp.tasks.setup import TaskSettings

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
    "Discovery",
    "ErrorDetail",
    "ExposurePolicy",
    "FixedWindowRateLimiter",
    "FlowExposure",
    "FlowServer",
    "GateContext",
    "JsonlAuditLog",
    "PromptPolicy",
    "RateLimiter",
    "RedisRateLimiter",
    "SecurityConfig",
    "RunHistory",
    "ServingConfig",
    "Visibility",
    "VisibleRule",
    "TaskSettings",
    "schema_uri",
    "visible_claim",
]
