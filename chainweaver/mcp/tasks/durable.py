"""What makes a flow task durable: where its steps are checkpointed (the task backend,
encrypted with the tasks' key), how often it was delivered, and what its worker logs
and shows while it runs (queued, running, resuming, its worker stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

from docket import Docket
from fastmcp_tasks.creation import TASK_MAPPING_TTL_BUFFER_SECONDS
from fastmcp_tasks.keys import build_task_key
from fastmcp_tasks.models import GetTaskResult

from chainweaver.checkpoints_redis import RedisCheckpointStore
from chainweaver.mcp.fastmcp_seams import progress_key
from chainweaver.mcp.publish.exposure import ExposedFlow

# What workers do, task by task: `chainweaver worker` shows it on stderr (INFO).
logger = logging.getLogger("chainweaver.worker")

QUEUED = "queued: waiting for a worker"
RUNNING = "running"
STOPPED = "waiting for redelivery: its worker stopped"
# A running leg renews its heartbeat every HEARTBEAT_EVERY seconds; one not renewed for
# HEARTBEAT_TTL seconds is a worker that stopped (tasks/get says so until redelivery).
HEARTBEAT_TTL = 5
HEARTBEAT_EVERY = 1.0
# Seconds a run's checkpoints outlive its last write: longer than any step should take
# (each write renews it), so a long step never finds its run's checkpoints gone.
CHECKPOINT_TTL = 86400.0
_CHECKPOINT_SALT = "chainweaver-checkpoint-key"
# The queued status, unless a worker already said something (one atomic step).
_SET_IF_NEW = """
if redis.call('hexists', KEYS[1], 'message') == 0 then
  redis.call('hset', KEYS[1], 'message', ARGV[1])
  redis.call('expire', KEYS[1], ARGV[2])
end
return 0
"""


async def start_leg(docket: Docket, task_id: str, run_id: str, task_key: str,
                    store: RedisCheckpointStore | None, *, counts: bool) -> int:
    """Everything a leg writes and reads before its first step, in one round trip:
    its delivery count (``counts``: a leg that runs the run's steps; 1 the first time,
    more on redelivery), its markers (that the leg started, and its first heartbeat:
    :func:`heartbeat`), the task's status "running", and the run's checkpoints, kept in
    ``store`` for the run's one read. Returns the delivery count (0 when not counted).
    The store failing raises: nothing ran yet."""
    ttl = int(docket.execution_ttl.total_seconds()) + TASK_MAPPING_TTL_BUFFER_SECONDS
    leg, alive = _leg_keys(docket, task_id)
    runs = docket.key(f"chainweaver:task-run:{run_id}")
    read = store is not None and counts
    async with docket.redis() as redis:
        pipe = cast(Any, redis).pipeline()
        if counts:
            pipe.hincrby(runs, "n", 1)  # a hash: Docket's in-memory backend has no INCR
            pipe.expire(runs, max(ttl, int(CHECKPOINT_TTL)))
        pipe.set(alive, "1", ex=HEARTBEAT_TTL)
        pipe.set(leg, "1", ex=ttl)
        status_commands(pipe, docket, task_key, RUNNING)
        if read:
            pipe.hgetall(cast(RedisCheckpointStore, store).key(run_id))
        answers = await pipe.execute()
    if read:
        cast(RedisCheckpointStore, store).keep(run_id, answers[-1])
    return int(answers[0]) if counts else 0


def status_commands(pipe: Any, docket: Docket, task_key: str, message: str) -> None:
    """Queue the writes that make ``message`` the status of the task Docket knows as
    ``task_key``: what Docket's progress message write does (the hash's message and
    time, and the event its subscribers get), as plain commands on ``pipe``."""
    progress = progress_key(docket, task_key)
    updated_at = datetime.now(UTC).isoformat()
    pipe.hset(progress, mapping={"message": message, "updated_at": updated_at})
    pipe.publish(progress, json.dumps({
        "type": "progress", "key": task_key, "current": 0, "total": 1,
        "message": message, "updated_at": updated_at}))


async def write_status(docket: Docket, task_key: str, message: str) -> None:
    """Make ``message`` the task's status (what ``tasks/get`` shows): one round trip of
    plain commands, where ``ctx.report_progress`` runs Docket's script (its argument
    handling alone cost about as much as a flow step here)."""
    async with docket.redis() as redis:
        pipe = cast(Any, redis).pipeline()
        status_commands(pipe, docket, task_key, message)
        await pipe.execute()


def checkpoint_store(docket: Docket) -> RedisCheckpointStore:
    """Where task runs checkpoint their steps: the task backend (Redis, or Docket's
    in-memory one), values encrypted with the tasks' key when one is set."""
    return RedisCheckpointStore(docket.redis, prefix=docket.key("chainweaver:checkpoints:"),
                                ttl=CHECKPOINT_TTL, codec=_checkpoint_codec(_material()))


def _material() -> str | None:
    from fastmcp_tasks.settings import tasks_settings

    key = tasks_settings.encryption_key
    return key.get_secret_value() if key is not None else None


@functools.lru_cache(maxsize=4)
def _checkpoint_codec(material: str | None) -> Any:
    """Fernet from the tasks' key material (a salt of its own), once per process: the
    key derivation takes about a second."""
    if material is None:
        return None
    from cryptography.fernet import Fernet
    from fastmcp.server.auth.jwt_issuer import derive_jwt_key

    fernet = Fernet(derive_jwt_key(low_entropy_material=material, salt=_CHECKPOINT_SALT))

    class _Codec:
        def encode(self, data: bytes) -> bytes:
            return bytes(fernet.encrypt(data))

        def decode(self, stored: bytes) -> bytes:
            return bytes(fernet.decrypt(stored))

    return _Codec()


def picked_up(exposed: ExposedFlow, task_id: str, run_id: str, deliveries: int) -> str:
    """Log the leg; returns the status that shows it running (not queued, not a dead
    worker's last step)."""
    flow = f"{exposed.flow.name!r} {exposed.flow.version}"
    if deliveries > 1:
        logger.info("task %s resumes run %s of flow %s (delivery %d): completed steps "
                    "come from their checkpoints", task_id, run_id, flow, deliveries)
        return f"resuming after its worker stopped (delivery {deliveries})"
    logger.info("task %s picked up: run %s of flow %s", task_id, run_id, flow)
    return RUNNING


def ended(exposed: ExposedFlow, task_id: str, run_id: str, outcome: str,
           restored: int = 0) -> None:
    extra = f"; {restored} step(s) restored from checkpoints" if restored else ""
    logger.info("task %s ended: run %s of flow %r %s: %s%s", task_id, run_id,
                exposed.flow.name, exposed.flow.version, outcome, extra)


@contextlib.asynccontextmanager
async def heartbeat(docket: Docket, task_id: str) -> AsyncIterator[None]:
    """While a leg runs: its heartbeat renewed in the background (gone soon after its
    worker died), then, when it ends, its markers removed (kept when its worker dies).
    :func:`start_leg` wrote both markers. A lost write only makes a status message
    stale: it never fails the run."""
    leg, alive = _leg_keys(docket, task_id)

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)  # the start wrote the first one
            try:
                async with docket.redis() as redis:
                    await redis.set(alive, "1", ex=HEARTBEAT_TTL)
            except Exception as error:
                logger.debug("task heartbeat failed: %s", type(error).__name__)

    beating = asyncio.ensure_future(beat())
    try:
        yield
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        try:
            async with docket.redis() as redis:
                await redis.delete(leg, alive)
        except Exception as error:
            logger.debug("task heartbeat end failed: %s", type(error).__name__)


async def as_seen(docket: Docket, result: Any) -> Any:
    """``tasks/get``'s answer, saying so when a working task's worker stopped (its leg
    started and its heartbeat expired): not its dead worker's last step, until another
    worker picks it up. The task's state is fastmcp-tasks': only the message changes."""
    if not isinstance(result, GetTaskResult) or result.status != "working":
        return result
    leg, alive = _leg_keys(docket, result.task_id)
    try:
        async with docket.redis() as redis:
            # A running task's poll reads one key: its heartbeat.
            if await redis.exists(alive) or not await redis.exists(leg):
                return result
    except Exception:  # cannot tell: the status as fastmcp-tasks gave it
        return result
    last = result.status_message
    message = f"{STOPPED} (last status: {last})" if last else STOPPED
    return result.model_copy(update={"status_message": message})


def _leg_keys(docket: Docket, task_id: str) -> tuple[str, str]:
    return (docket.key(f"chainweaver:task-leg:{task_id}"),
            docket.key(f"chainweaver:task-alive:{task_id}"))


async def mark_queued(docket: Docket, scope: str | None, task_id: str,
                      runner_key: str) -> None:
    """Show a new task as queued until a worker reports (never over a worker's own
    status: only when none was set yet). One round trip: the task's Docket key is the
    one fastmcp-tasks built for it from the scope, the id and the runner's key."""
    ttl = int(docket.execution_ttl.total_seconds()) + TASK_MAPPING_TTL_BUFFER_SECONDS
    progress = progress_key(docket, build_task_key(scope, task_id, "tool", runner_key))
    async with docket.redis() as redis:
        await cast(Any, redis).eval(_SET_IF_NEW, 1, progress, QUEUED, str(ttl))
