"""What makes a flow task durable: where its steps are checkpointed (the task backend,
encrypted with the tasks' key), how often it was delivered, and what its worker logs
and shows while it runs (queued, running, resuming, its worker stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any, cast

from docket import Docket
from fastmcp_tasks.creation import TASK_MAPPING_TTL_BUFFER_SECONDS
from fastmcp_tasks.keys import build_task_key
from fastmcp_tasks.models import GetTaskResult

from chainweaver.checkpoints_redis import RedisCheckpointStore
from chainweaver.mcp.publish.exposure import ExposedFlow

# What workers do, task by task: `chainweaver worker` shows it on stderr (INFO).
logger = logging.getLogger("chainweaver.worker")

QUEUED = "queued: waiting for a worker"
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


async def count_delivery(docket: Docket, run_id: str) -> int:
    """Count a leg that runs the run's steps: 1 the first time, more on redelivery."""
    ttl = int(docket.execution_ttl.total_seconds()) + TASK_MAPPING_TTL_BUFFER_SECONDS
    name = docket.key(f"chainweaver:task-run:{run_id}")
    async with docket.redis() as redis:
        pipe = cast(Any, redis).pipeline()
        pipe.hincrby(name, "n", 1)  # a hash: Docket's in-memory backend has no INCR
        pipe.expire(name, max(ttl, int(CHECKPOINT_TTL)))
        count, _ = await pipe.execute()
    return int(count)


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
    return "running"


def ended(exposed: ExposedFlow, task_id: str, run_id: str, outcome: str,
           restored: int = 0) -> None:
    extra = f"; {restored} step(s) restored from checkpoints" if restored else ""
    logger.info("task %s ended: run %s of flow %r %s: %s%s", task_id, run_id,
                exposed.flow.name, exposed.flow.version, outcome, extra)


@contextlib.asynccontextmanager
async def heartbeat(docket: Docket, task_id: str) -> AsyncIterator[None]:
    """While a leg runs: a marker that it started (removed when it ends, kept when its
    worker dies) and a heartbeat renewed in the background (gone soon after its worker
    died). A lost write only makes a status message stale: it never fails the run."""
    leg, alive = _leg_keys(docket, task_id)
    ttl = int(docket.execution_ttl.total_seconds()) + TASK_MAPPING_TTL_BUFFER_SECONDS

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)  # the start wrote the first one
            try:
                async with docket.redis() as redis:
                    await redis.set(alive, "1", ex=HEARTBEAT_TTL)
            except Exception as error:
                logger.debug("task heartbeat failed: %s", type(error).__name__)

    try:
        async with docket.redis() as redis:
            pipe = cast(Any, redis).pipeline()  # both markers, one round trip
            pipe.set(alive, "1", ex=HEARTBEAT_TTL)
            pipe.set(leg, "1", ex=ttl)
            await pipe.execute()
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
    progress = docket.key(f"progress:{build_task_key(scope, task_id, 'tool', runner_key)}")
    async with docket.redis() as redis:
        await cast(Any, redis).eval(_SET_IF_NEW, 1, progress, QUEUED, str(ttl))
