"""The checks every setting of a server goes through when it is built: a clear
``ExposureConfigError`` naming the setting, never a failure later."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from chainweaver.errors import ExposureConfigError


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


def state_keys(value: object) -> tuple[bytes, ...] | None:
    """Request-state keys as bytes: a non-empty list of secrets of 32 bytes or more."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ExposureConfigError(f"request_state_keys takes a list of secrets, got "
                                  f"{type(value).__name__}")
    keys = [key.encode() if isinstance(key, str) else key for key in value]
    if not keys or not all(isinstance(key, bytes) and len(key) >= 32 for key in keys):
        # Never echo the value: it is a secret.
        raise ExposureConfigError("request_state_keys must list secrets of at least 32 "
                                  "bytes each (e.g. secrets.token_hex(32))")
    return tuple(keys)


# A host name, IPv4 address or bracketed IPv6 address, with an optional port or ":*".
_HOST_PART = (r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\])"
              r"(?::(?:\d{1,5}|\*))?")
HOST = re.compile(rf"\*|{_HOST_PART}")
ORIGIN = re.compile(rf"\*|https?://{_HOST_PART}")
_HEADER_EXAMPLES = {"allowed_hosts": "'mcp.example.com', 'mcp.example.com:8443' or "
                                     "'mcp.example.com:*'",
                    "allowed_origins": "'https://app.example.com' or 'http://localhost:*'"}


def header_values(setting: str, value: object, pattern: re.Pattern[str]
                   ) -> tuple[str, ...] | None:
    """A non-empty list of Host or Origin values, as a tuple, or ``None``."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ExposureConfigError(f"{setting} takes a list of values, got {value!r}")
    values = tuple(value)
    if not values:
        raise ExposureConfigError(f"{setting} must list at least one value, or be None "
                                  "for the defaults")
    for item in values:
        if not isinstance(item, str) or not pattern.fullmatch(item):
            raise ExposureConfigError(f"{setting}: {item!r} is not a valid value (for "
                                      f"example {_HEADER_EXAMPLES[setting]})")
    return values
