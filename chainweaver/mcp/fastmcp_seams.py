"""The places ChainWeaver reaches past the public API of FastMCP, the MCP SDK and
OpenTelemetry.

Each reach is here, is exercised by tests/mcp/test_seams.py (which fails loudly when the
installed FastMCP moves it, and drives the degraded path), and fails soft: one warning
in the server's log, and only the feature it serves stops working. A call never fails
because FastMCP moved a private name.

- :func:`low_level_server`: FastMCP 4 has no public way to serve ``subscriptions/listen``
  or ``resources/subscribe``, nor to see a list request's cursor; the MCP SDK derives
  the ``listChanged``/``subscribe`` capabilities from the low-level server's handlers,
  so they are registered there (with the SDK's public ``add_request_handler``), on
  the server and on a parent it is mounted into with ``mount_into``. Without it: no
  2026-07-28 list-changed stream, no resource subscriptions (on the server or through
  a parent), list cursors not bound to the caller's view. Serving stateless HTTP, its notification
  options are replaced (:func:`advertise_no_notifications`).
- :func:`on_connection_close`: the SDK's ``ServerSession`` (one per request) does not
  say when its connection ends. Without it: sessions are forgotten by age only.
- :func:`install_input_schema_lookup`: the low-level server's ``get_tool_input_schema``
  (what the SDK checks ``Mcp-Param-*`` headers against) has no public setter. Without
  it: FastMCP's own lookup checks those headers.
- :func:`add_sdk_middleware`: the SDK server's ``middleware`` list (public on the
  SDK's ``Server``, which FastMCP keeps private) is the one place that sees a result
  as the wire carries it. Without it: 2026-07-28 answers carry the SDK's default
  hints (``ttlMs`` 0, ``cacheScope`` private) instead of ChainWeaver's.
- :func:`completion_handler`: no public getter for a server's completion handler.
  Without it: ``mount_into`` replaces a handler the parent registered before it.
- Background tasks (the ``tasks`` extra): :func:`running_docket` (no tasks run
  without it), :func:`lifespan_manager` (``chainweaver worker`` cannot start without
  it, as fastmcp-tasks' own worker CLI), :func:`check_task_request` (without it the
  extension's capability check runs after the owner check), :func:`poll_busy_slots`
  (without it a worker whose slots are all busy notices a freed one only after its
  whole check interval, 50 ms) and :func:`progress_key` (Docket's progress hash, where
  a task's status is written; without it the status is not shown).
- :func:`otel_global_unset`: OpenTelemetry (which FastMCP uses for its own spans) has no
  public way to ask whether an application set a global tracer or meter provider
  without looking the provider's environment variable up in ``os.environ`` on every
  call while none is set, which raises and catches a ``KeyError`` inside it (measured:
  about 36,000 instructions a call, three asks). Without it: the public call, as slow
  as that.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

from fastmcp import FastMCP
from mcp.server.lowlevel.server import NotificationOptions

logger = logging.getLogger("chainweaver.mcp.fastmcp_seams")
_warned: set[str] = set()

# The private names reached, in one place (tests rename them to drive each degraded path).
LOW_LEVEL_SERVER = "_mcp_server"
REQUEST_HANDLERS = "_request_handlers"
COMPLETION_HANDLER = "_completion_handler"
DOCKET = "_docket"
WORKER = "_worker"  # the Docket worker fastmcp-tasks runs for a server
WORKER_TASKS = "_tasks_by_key"  # the tasks a Docket worker runs now, one per busy slot
# Seconds a Docket worker with every slot busy waits before it looks for a freed one
# (it only checks its own tasks: no Redis command).
BUSY_POLL = 0.002
DOCKET_PROGRESS = "progress:"  # Docket's progress hash: {docket}:progress:{task key}
LIFESPAN_MANAGER = "_lifespan_manager"
TASK_REQUEST_CHECK = "_check_task_request"
CONNECTION = "_connection"
SDK_MIDDLEWARE = "middleware"  # public on the SDK's Server
INPUT_SCHEMA_LOOKUP = "get_tool_input_schema"  # public name, but no public setter
# OpenTelemetry's global providers: None until an application sets one (never replaced),
# and the variables that name one to load when first asked.
OTEL_GLOBALS = {"tracer": ("opentelemetry.trace", "_TRACER_PROVIDER",
                           "OTEL_PYTHON_TRACER_PROVIDER"),
                "meter": ("opentelemetry.metrics._internal", "_METER_PROVIDER",
                          "OTEL_PYTHON_METER_PROVIDER")}


def warn_once(seam: str, degraded: str, library: str = "FastMCP") -> None:
    """Say once per process that a seam moved and what no longer works because of it."""
    if seam in _warned:
        return
    _warned.add(seam)
    logger.warning("the installed %s has no %s where ChainWeaver reaches for it: %s",
                   library, seam, degraded)


def low_level_server(server: FastMCP) -> Any:
    """The MCP SDK server under ``server`` (handlers, capabilities), or None."""
    low = getattr(server, LOW_LEVEL_SERVER, None)
    if low is None or not callable(getattr(low, "add_request_handler", None)):
        warn_once("FastMCP._mcp_server", "no list-changed stream on 2026-07-28, no resource "
                  "subscriptions, and list cursors are not bound to the caller's view")
        return None
    return low


def on_connection_close(session: Any, callback: Callable[[], None]) -> bool:
    """Call ``callback`` when ``session``'s connection ends (False: cannot tell)."""
    stack = getattr(getattr(session, CONNECTION, None), "exit_stack", None)
    if not isinstance(stack, AsyncExitStack):
        return False
    stack.callback(callback)
    return True


def forget_request_handler(server: FastMCP, method: str) -> None:
    """Stop serving ``method`` (the SDK has no public way to remove a handler)."""
    handlers = getattr(low_level_server(server), REQUEST_HANDLERS, None)
    if isinstance(handlers, dict):
        handlers.pop(method, None)
    else:
        warn_once("request handler map", f"{method} stays served")


def advertise_no_notifications(server: FastMCP) -> None:
    """Advertise no ``listChanged`` and no ``resources.subscribe`` to 2025-11-25
    clients (the SDK reads them from the low-level server's notification options)."""
    low = low_level_server(server)
    if low is not None:
        low.notification_options = NotificationOptions()


def install_input_schema_lookup(server: FastMCP, lookup: Callable[[str], Any]) -> bool:
    """Make the SDK read published input schemas through ``lookup``
    (see :func:`chainweaver.mcp.gate.views.input_schema_lookup`); False if it cannot."""
    low = low_level_server(server)
    if low is None or not hasattr(low, INPUT_SCHEMA_LOOKUP):
        warn_once("get_tool_input_schema", "Mcp-Param-* headers are checked by FastMCP's "
                  "own schema lookup")
        return False
    setattr(low, INPUT_SCHEMA_LOOKUP, lookup)
    return True


def add_sdk_middleware(server: FastMCP, middleware: Any, degraded: str) -> bool:
    """Add ``middleware`` innermost to the MCP SDK server's middleware (False: cannot)."""
    low = low_level_server(server)
    if low is None:
        return False  # said once already, by low_level_server
    chain = getattr(low, SDK_MIDDLEWARE, None)
    if not isinstance(chain, list):
        warn_once("the SDK server's middleware list", degraded)
        return False
    chain.append(middleware)
    return True


def completion_handler(server: FastMCP) -> tuple[Callable[..., Any] | None, bool]:
    """``server``'s completion handler now, and whether it could be read at all."""
    if not hasattr(server, COMPLETION_HANDLER):
        warn_once("FastMCP._completion_handler", "mount_into replaces a completion "
                  "handler the parent server registered before it")
        return None, False
    handler: Callable[..., Any] | None = getattr(server, COMPLETION_HANDLER)
    return handler, True


def running_docket(server: FastMCP) -> Any:
    """The Docket fastmcp-tasks started for ``server`` (None: not running)."""
    return getattr(server, DOCKET, None)


def progress_key(docket: Any, task_key: str) -> str:
    """The Redis hash where Docket keeps a task's progress (its ``message`` is what
    ``tasks/get`` shows): its layout, not an API. A task's status and its queued mark
    are written there directly, a round trip without Docket's script."""
    return str(docket.key(f"{DOCKET_PROGRESS}{task_key}"))


class _BusyPoll(timedelta):
    """Docket's worker loop reads its ``minimum_check_interval`` in two places: how
    long its read of new tasks blocks while it has a free slot, and how long it sleeps,
    without looking at Redis, while every slot is busy. A busy worker sleeping 50 ms
    leaves each slot that frees meanwhile idle until it wakes (measured: a worker ran
    short tasks at a fraction of its slots' pace). This interval reads as the short
    one while every slot is busy, and as the configured one otherwise, so an idle
    worker polls Redis no more often than before."""

    worker: Any

    def total_seconds(self) -> float:
        configured = super().total_seconds()
        running = getattr(self.worker, WORKER_TASKS, None)
        slots = self.worker.concurrency  # 0: an enqueue-only replica, never busy
        if running is not None and 0 < slots <= len(running):
            return min(BUSY_POLL, configured)
        return configured


def poll_busy_slots(server: FastMCP) -> bool:
    """Make ``server``'s running Docket worker notice a freed slot within
    :data:`BUSY_POLL` seconds instead of its whole check interval (see
    :class:`_BusyPoll`). False, with one warning, when the worker's names moved: it
    then runs as Docket does, slower with short tasks."""
    worker = getattr(server, WORKER, None)
    interval = getattr(worker, "minimum_check_interval", None)
    if worker is None or not isinstance(interval, timedelta) \
            or not isinstance(getattr(worker, WORKER_TASKS, None), dict):
        warn_once("Docket Worker._tasks_by_key", "a task worker whose slots are all busy "
                  "notices a freed one only after its whole check interval")
        return False
    if isinstance(interval, _BusyPoll):
        return True
    busy = _BusyPoll(seconds=interval.total_seconds())
    busy.worker = worker
    worker.minimum_check_interval = busy
    return True


def lifespan_manager(server: FastMCP) -> Any:
    """``server``'s lifespan (Docket and its task worker), entered without a transport."""
    enter = getattr(server, LIFESPAN_MANAGER, None)
    if enter is None:
        raise RuntimeError("this FastMCP version cannot run a lifespan without a transport; "
                           "chainweaver worker needs it (see chainweaver.mcp.fastmcp_seams)")
    return enter()


def check_task_request(extension: Any, ctx: Any, task_id: str) -> None:
    """Run the tasks extension's own ``tasks/*`` checks (capability, ``Mcp-Name``)
    ahead of ChainWeaver's owner check; skipped, with one warning, if they moved
    (fastmcp-tasks runs them again when it answers)."""
    check = getattr(extension, TASK_REQUEST_CHECK, None)
    if check is None:
        warn_once("TasksExtension._check_task_request", "a tasks/* request from a client "
                  "without the tasks capability is checked after the task's owner")
        return
    check(ctx, task_id)


_otel_named: dict[str, bool] = {}  # kind -> the environment names a provider
_MOVED = object()  # what a global OpenTelemetry no longer has reads as


def otel_global_unset(kind: str) -> bool:
    """Whether OpenTelemetry's global ``kind`` ("tracer" or "meter") provider is
    certainly not set: none set in code, none named by the environment. False means
    "ask the public API" (``get_tracer_provider()``, ``get_meter_provider()``), which
    loads a provider the environment names. The environment is read once per process,
    when first asked: set OpenTelemetry's variables before serving."""
    module_name, attribute, variable = OTEL_GLOBALS[kind]
    try:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
    except ImportError:
        module = None
    provider = getattr(module, attribute, _MOVED)
    if provider is not None:
        if provider is _MOVED:
            warn_once(f"{module_name}.{attribute}", "each request asks its public API "
                      "whether a provider is set (slower, same answer)",
                      library="OpenTelemetry")
        return False
    named = _otel_named.get(kind)
    if named is None:
        named = _otel_named[kind] = variable in os.environ
    return not named
