"""Before ``serve`` and ``worker`` start: every Redis store their flags name (the task
queue, the run history, the governance state, the rate-limit counters) answers, or the
process exits with a one-line error naming the store (password masked) and why.

A store that does not answer at once is waited for, up to ``--store-wait`` seconds (30
by default: a Redis started beside the server, as in a compose file or a pod, has time
to come up), and the wait is said on stderr when it begins. Once serving, a store that
goes away is the components' own business: each logs the outage and reconnects.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from ..governance.state import masked_reason, masked_url
from .errors import EXIT_SERVE_FAILED, EXIT_USAGE, CommandError
from .output import PROG

DEFAULT_WAIT = 30.0
PAUSES = (0.1, 0.25, 0.5, 1.0)  # between attempts, the last repeated
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
# (flag, the store's name in messages) of every Redis a serve or worker may use
STORES = (("tasks", "the task queue"), ("run_history", "the run history"),
          ("governance", "the governance state"),
          ("rate_limit_redis", "the rate-limit counters"))

Ping = Callable[[str, float], None]


def stores_of(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each Redis URL the flags name, with what it holds (one URL may hold several)."""
    found: dict[str, list[str]] = {}
    for flag, name in STORES:
        url = getattr(args, flag, None)
        if isinstance(url, str) and url.startswith(REDIS_SCHEMES):
            found.setdefault(url, []).append(name)
    return found


def check_stores(args: argparse.Namespace, ping: Ping | None = None) -> None:
    """Wait until every store of ``args`` answers, at most ``args.store_wait`` seconds
    for all of them; a CommandError (exit 3) names the first that did not, and why."""
    stores = stores_of(args)
    if not stores:
        return
    ping = ping or redis_ping
    deadline = time.monotonic() + args.store_wait
    for url, names in stores.items():
        _wait_for(url, " and ".join(names), deadline, args.store_wait, ping)


def _wait_for(url: str, what: str, deadline: float, wait: float, ping: Ping) -> None:
    where = masked_url(url)
    told = False
    attempt = 0
    while True:
        try:
            ping(url, max(0.1, min(2.0, deadline - time.monotonic())))
        except _Unreachable as error:
            reason = masked_reason(error.cause, url)
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommandError(EXIT_SERVE_FAILED, f"cannot reach {what} at {where} "
                                   f"after waiting {wait:g} s: {reason} (--store-wait "
                                   "SECONDS sets how long)") from None
            if not told:
                print(f"{PROG}: cannot reach {what} at {where} yet ({reason}); waiting up "
                      f"to {wait:g} s for it (--store-wait)", file=sys.stderr, flush=True)
                told = True
            time.sleep(min(PAUSES[min(attempt, len(PAUSES) - 1)], left))
            attempt += 1
            continue
        except _Refused as error:
            raise CommandError(EXIT_SERVE_FAILED, f"cannot use {what} at {where}: "
                               f"{masked_reason(error.cause, url)}") from None
        except ValueError as error:  # a URL redis-py cannot read
            raise CommandError(EXIT_USAGE, f"{what} at {where}: "
                               f"{masked_reason(error, url)}") from None
        if told:
            print(f"{PROG}: reached {what} at {where}", file=sys.stderr, flush=True)
        return


def name_queue_outages(url: str | None) -> None:
    """While serving: the task queue's own outage lines (Docket's "Redis is
    unavailable, ...") name the queue, its password masked, and the reason, on stderr."""
    if not isinstance(url, str) or not url.startswith(REDIS_SCHEMES):
        return
    queue = logging.getLogger("docket")
    for named in (f for h in queue.handlers for f in h.filters
                  if isinstance(f, _NamesTheQueue)):
        named.url = url  # one handler per process, naming the queue it uses now
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    handler.addFilter(_NamesTheQueue(url))
    handler.setLevel(logging.WARNING)
    queue.addHandler(handler)


class _StderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record comes (not as it was when the
    handler was made), like logging's own last-resort handler."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _NamesTheQueue(logging.Filter):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "Redis is unavailable" in text:
            cause = record.exc_info[1] if record.exc_info else None
            why = f": {masked_reason(cause, self.url)}" if cause is not None else ""
            record.msg = (f"the task queue at {masked_url(self.url)} is unreachable{why} "
                          f"({text})")
            record.args = ()
            record.exc_info = record.exc_text = None
        return True


class _Unreachable(Exception):
    """Nothing answered (refused, reset, timed out, name not resolved): worth waiting."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Refused(Exception):
    """The store answered, and said no (a wrong password, a database it does not have):
    waiting would not change it."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def redis_ping(url: str, timeout: float) -> None:
    """PING the Redis at ``url`` once; _Unreachable or _Refused says why it failed."""
    try:
        from redis import Redis
        from redis.exceptions import AuthenticationError, RedisError
        from redis.exceptions import ConnectionError as ConnectionFailed
        from redis.exceptions import TimeoutError as TimedOut
    except ImportError:
        return  # reported by the component that needs it, with the extra to install
    client: Any = Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    except AuthenticationError as error:
        raise _Refused(error) from None
    except (ConnectionFailed, TimedOut, OSError) as error:
        raise _Unreachable(error) from None
    except RedisError as error:
        raise _Refused(error) from None
    finally:
        client.close()
