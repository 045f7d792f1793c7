"""The keywords ``FlowServer`` took before they moved into its configuration objects,
and the settings ``ServingConfig`` took before they moved to ``SecurityConfig`` or
became ``FlowServer`` keywords: accepted for one release, each with a
``DeprecationWarning`` naming its new place."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from chainweaver.errors import ExposureConfigError
from chainweaver.mcp.config import (
    MOVED_SETTINGS,
    Discovery,
    ExposurePolicy,
    RunHistory,
    SecurityConfig,
    ServingConfig,
)
from chainweaver.mcp.tasks.setup import TaskSettings, check_tasks

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


def moved_keywords(given: dict[str, Any], policy: ExposurePolicy,
                   security: SecurityConfig, serving: ServingConfig,
                   tasks: str | TaskSettings | None
                    ) -> tuple[ExposurePolicy, SecurityConfig, ServingConfig,
                               str | TaskSettings | None]:
    """Fold the keywords that moved into the configuration objects, warning once each."""
    unknown = sorted(set(given) - set(MOVED_KEYWORDS))
    if unknown:
        raise TypeError(f"FlowServer() got unexpected keyword argument(s): "
                        f"{', '.join(unknown)}{_where_they_live(unknown)}")
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


def moved_settings(serving: ServingConfig, security: SecurityConfig,
                   features: dict[str, Any]) -> SecurityConfig:
    """Take the settings given to ``ServingConfig`` in their old places (it warned) to
    where they moved: ``security`` (returned) and ``features`` (updated). A setting
    given in both places is refused."""
    for setting, value in serving.moved.items():
        if MOVED_SETTINGS[setting] == "FlowServer":
            given = features[setting] is not None
        else:
            given = getattr(security, setting) != _DEFAULT_SECURITY[setting]
        if given:
            where = f"FlowServer({setting}=...)" if setting in features \
                else f"SecurityConfig({setting}=...)"
            raise ExposureConfigError(f"{setting} is set twice: give it to {where} only, "
                                      "not to ServingConfig")
        if setting in features:
            features[setting] = value
        else:
            security = dataclasses.replace(security, **{setting: value})
    return security


_DEFAULT_SECURITY = {field.name: field.default for field in dataclasses.fields(SecurityConfig)}


# The settings objects a keyword FlowServer does not take may belong to, with the
# FlowServer keyword each is given as.
_SETTINGS_OBJECTS = (("policy", ExposurePolicy), ("security", SecurityConfig),
                     ("serving", ServingConfig), ("tasks", TaskSettings),
                     ("run_history", RunHistory), ("discovery", Discovery))


def _where_they_live(unknown: list[str]) -> str:
    """A hint for each unknown keyword that is a field of a settings object (say,
    ``server_prefix``, an ``ExposurePolicy`` setting), so the error says where it goes."""
    hints = []
    for keyword in unknown:
        for where, settings in _SETTINGS_OBJECTS:
            if keyword in {f.name for f in dataclasses.fields(settings)}:
                hints.append(f"{keyword} is a setting of {settings.__name__}: "
                             f"FlowServer(executor, {where}={settings.__name__}"
                             f"({keyword}=...))")
                break
    return f" ({'; '.join(hints)})" if hints else ""
