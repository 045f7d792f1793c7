"""FlowServer's background-task settings, checked at construction; the wiring imports
``fastmcp-tasks`` (the ``tasks`` extra) only when a server asks for tasks."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from chainweaver.errors import ExposureConfigError
from chainweaver.flows import TASK_MODES, TaskMode
from chainweaver.mcp.checks import check_seconds, check_text
from chainweaver.mcp.config import SecurityConfig
from chainweaver.mcp.fastmcp_seams import lifespan_manager, running_docket
from chainweaver.mcp.runs.approval import SharedMark
from chainweaver.mcp.runs.metrics import ServerMetrics

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from fastmcp.tools.base import Tool

    from chainweaver.governance import SharedGovernance
    from chainweaver.mcp.components.provider import FlowProvider

logger = logging.getLogger("chainweaver.mcp")

TASK_URL_SCHEMES = ("memory://", "redis://", "rediss://")


@dataclass(frozen=True)
class TaskSettings:
    """How a server (or ``chainweaver worker``) runs background tasks.

    ``url``: the task backend, ``memory://`` (one process) or ``redis://...`` (replicas
    and workers share it). ``mode``: how flows that set no ``task_mode`` of their own
    may run, ``"optional"`` (a client that asks gets a task), ``"required"`` or
    ``"forbidden"``. ``FlowServer(tasks="redis://...")`` is short for
    ``FlowServer(tasks=TaskSettings(url="redis://..."))``.

    ``concurrency``: flows this process runs at once; ``0`` makes it enqueue only (a
    replica whose tasks ``chainweaver worker`` processes run). ``redelivery_timeout``:
    seconds after which a task whose worker stopped answering goes to another worker.
    ``encryption_key``: encrypts the stored request context (the caller's token and
    headers); it sets ``fastmcp-tasks``' process-wide key, the same as the
    ``FASTMCP_TASKS_ENCRYPTION_KEY`` environment variable, and every replica and worker
    on the queue needs the same one. ``name``: the queue (Docket) name; by default
    fastmcp-tasks' on Redis, and a queue of the server's own on ``memory://``.
    """

    url: str = "memory://"
    mode: TaskMode = "optional"
    concurrency: int | None = None
    redelivery_timeout: float | None = None
    encryption_key: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(TASK_URL_SCHEMES):
            raise ExposureConfigError(
                f"tasks must be None or a URL starting with {', '.join(TASK_URL_SCHEMES)}, "
                f"got {self.url!r}")
        if self.mode not in TASK_MODES:
            raise ExposureConfigError(
                f"task_mode must be one of {', '.join(TASK_MODES)}, got {self.mode!r}")
        if self.concurrency is not None and (
                not isinstance(self.concurrency, int) or isinstance(self.concurrency, bool)
                or self.concurrency < 0):
            raise ExposureConfigError(
                f"concurrency must be None or an int >= 0, got {self.concurrency!r}")
        check_seconds("redelivery_timeout", self.redelivery_timeout, optional=True)
        check_text("encryption_key", self.encryption_key, optional=True)
        check_text("name", self.name, optional=True)

    def extension_options(self) -> dict[str, Any]:
        name = self.name
        if name is None and self.url.startswith("memory://"):
            # Docket keeps one in-memory store per URL and event loop: under its default
            # queue name, every memory:// server in the process would share one queue,
            # and one server's worker would run another's tasks (its flows, its
            # governance). Each server's tasks stay its own.
            name = f"chainweaver-{secrets.token_hex(8)}"
        options: dict[str, Any] = {"concurrency": self.concurrency, "name": name}
        if self.redelivery_timeout is not None:
            options["redelivery_timeout"] = timedelta(seconds=self.redelivery_timeout)
        return {key: value for key, value in options.items() if value is not None}


def check_tasks(tasks: object, mode: object = None, settings: object = None
                ) -> TaskSettings | None:
    """FlowServer's ``tasks``: None, a backend URL or a :class:`TaskSettings`; ``mode``
    and ``settings`` are the deprecated ``task_mode`` / ``task_settings`` keywords."""
    if settings is not None and not isinstance(settings, TaskSettings):
        raise ExposureConfigError(
            f"task_settings must be a TaskSettings, got {type(settings).__name__}")
    if tasks is None:
        if settings is not None:
            raise ExposureConfigError("task_settings needs tasks= (a task backend URL)")
        if mode is not None and mode not in TASK_MODES:
            raise ExposureConfigError(
                f"task_mode must be one of {', '.join(TASK_MODES)}, got {mode!r}")
        return None
    if isinstance(tasks, TaskSettings):
        chosen = tasks
    elif isinstance(tasks, str):
        chosen = dataclasses.replace(settings or TaskSettings(), url=tasks)
    else:
        raise ExposureConfigError(
            f"tasks must be None or a URL starting with {', '.join(TASK_URL_SCHEMES)}, "
            f"got {tasks!r}")
    if mode is not None:
        chosen = dataclasses.replace(chosen, mode=cast(TaskMode, mode))
    return chosen


def flow_task_runner(security: SecurityConfig, metrics: ServerMetrics,
                     governance: SharedGovernance | None = None
                     ) -> Callable[[FlowProvider], Tool]:
    """How a provider builds the one task runner of its flows (see :mod:`.runner`); a
    task leg's run counts in ``chainweaver.runs`` and ``.steps`` like an inline one,
    and waits while ``governance`` (the shared state followed) is not known."""
    runner, audit = _tasks_extra()
    task_audit = audit(security.audit_hook, security.hook_timeout)
    return lambda provider: runner.build(provider, task_audit, metrics, governance)


def add_tasks(fastmcp: FastMCP, provider: FlowProvider, security: SecurityConfig,
              settings: TaskSettings) -> None:
    """Register the tasks extension (see :mod:`.extension`), for the task runner
    ``provider`` built."""
    from chainweaver.mcp.tasks.extension import FlowTasksExtension
    from chainweaver.mcp.tasks.runner import TaskAudit

    if settings.encryption_key is not None:
        _set_encryption_key(settings.encryption_key)
    audit = TaskAudit(security.audit_hook, security.hook_timeout)
    fastmcp.add_extension(FlowTasksExtension(provider, audit, url=settings.url,
                                             **settings.extension_options()))


def approval_marks(server: FastMCP) -> SharedMark | None:
    """How an approval state is marked used in the task backend's store while
    ``server`` runs it (None: not running; the process record answers): with Redis,
    every replica on it then refuses a replay (see
    :class:`~chainweaver.mcp.runs.approval.ApprovalNonces`)."""
    docket = running_docket(server)
    if docket is None:
        return None

    async def mark(nonce: str, expires: float) -> bool | None:
        ttl = max(1, int(expires - time.time()) + 1)
        try:
            async with docket.redis() as redis:
                return bool(await redis.set(
                    docket.key(f"chainweaver:approval-state:{nonce}"), "1", nx=True, ex=ttl))
        except Exception as error:  # cannot tell whether it was used: refused
            logger.warning("approval state refused: the task store failed (%s)",
                           type(error).__name__)
            return False

    return mark


def _tasks_extra() -> tuple[Any, Any]:
    """The task runner and its audit (FlowTaskRunner, TaskAudit): the tasks extra."""
    try:
        from chainweaver.mcp.tasks.runner import FlowTaskRunner, TaskAudit
    except ImportError as missing:  # pragma: no cover - depends on the installed extras
        raise ExposureConfigError(
            "background tasks need the tasks extra: pip install -e '.[mcp,tasks]' in a "
            f"clone of ChainWeaver ({missing})") from None
    return FlowTaskRunner, TaskAudit


def worker_lifespan(fastmcp: FastMCP) -> AbstractAsyncContextManager[Any]:
    """The server's lifespan without a transport: starts Docket and its task worker.

    A private FastMCP entry point (``fastmcp-tasks``' own worker CLI uses it the same
    way), reached through :mod:`.fastmcp_seams`.
    """
    return cast("AbstractAsyncContextManager[Any]", lifespan_manager(fastmcp))


def _set_encryption_key(key: str) -> None:
    from fastmcp_tasks.encryption import clear_codec_cache
    from fastmcp_tasks.settings import tasks_settings
    from pydantic import SecretStr

    tasks_settings.encryption_key = SecretStr(key)
    clear_codec_cache()
