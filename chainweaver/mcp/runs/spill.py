"""The output spill: where a server without a run history keeps the outputs too large to
send in one message, each with just enough of its run's record to answer its caller
alone, for reading in ranges (``docs/run-history.md``, "Large outputs").

Bounded by count, age and bytes, and shared fairly between callers: past a bound, the
caller holding the most (bytes, or outputs for the count) gives up its oldest output, so
one caller's large outputs displace its own, never those of a caller holding less. An
output that would itself be the one to go is not kept: its call says so (an ``isError``
result), instead of a link that reads nothing.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from chainweaver.mcp.runs.records import RunQuery, RunRecord, RunStore

SPILL_MAX_OUTPUTS = 1_000
SPILL_MAX_AGE = 3600.0  # seconds
SPILL_MAX_BYTES = 256 * 2**20


@dataclass
class _Kept:
    record: RunRecord
    data: bytes
    at: float  # when it was kept: its age counts from then


class SpillStore(RunStore):
    """Outputs in this process, at most ``max_runs`` of them, ``max_output_bytes`` in
    all, each for ``max_age`` seconds (see the module). Lists nothing: without a run
    history there is no listing."""

    def __init__(self, max_runs: int = SPILL_MAX_OUTPUTS, max_age: float = SPILL_MAX_AGE,
                 max_output_bytes: int = SPILL_MAX_BYTES) -> None:
        self.max_runs = max_runs
        self.max_age = max_age
        self.max_output_bytes = max_output_bytes
        self._kept: OrderedDict[str, _Kept] = OrderedDict()  # oldest first
        self._by: dict[str, deque[str]] = {}  # caller -> its run ids, oldest first
        self._bytes: dict[str, int] = {}  # caller -> bytes it holds
        self._total = 0
        self._lock = threading.Lock()

    def keep(self, record: RunRecord, data: bytes) -> bool:
        """Keep ``data``, the output of ``record``'s run (False: not kept, because it
        would be the output to give up for the bounds; nothing is dropped then)."""
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            if record.run_id in self._kept:  # kept again (a run that went on): replaced
                self._drop(record.run_id)
            victims = self._making_room(record.caller, len(data), now)
            if victims is None:
                return False
            for run_id in victims:
                self._drop(run_id)
            self._kept[record.run_id] = _Kept(record, data, now)
            self._by.setdefault(record.caller, deque()).append(record.run_id)
            self._bytes[record.caller] = self._bytes.get(record.caller, 0) + len(data)
            self._total += len(data)
            return True

    def _making_room(self, caller: str, size: int, now: float) -> list[str] | None:
        """The outputs to give up so that ``caller``'s new output of ``size`` bytes fits
        (None: the new output is the one to give up). Past a bound, the caller holding
        the most (bytes, or outputs for the count; the new one counted) gives up its
        oldest; of callers holding equally much, the one whose oldest is older."""
        held = dict(self._bytes)
        count = {who: len(ids) for who, ids in self._by.items()}
        held[caller] = held.get(caller, 0) + size
        count[caller] = count.get(caller, 0) + 1
        gone = dict.fromkeys(held, 0)  # how many of each caller's oldest go
        total, outputs = self._total + size, len(self._kept) + 1
        victims: list[str] = []

        def oldest(who: str) -> float:
            ids = self._by.get(who, ())
            return self._kept[ids[gone[who]]].at if gone[who] < len(ids) else now

        while total > self.max_output_bytes or outputs > self.max_runs:
            amount = held if total > self.max_output_bytes else count
            who = max(amount, key=lambda name: (amount[name], -oldest(name)))
            ids = self._by.get(who, ())
            if gone[who] >= len(ids):
                return None  # nothing of its own but the new output left to give up
            run_id = ids[gone[who]]
            gone[who] += 1
            victims.append(run_id)
            dropped = len(self._kept[run_id].data)
            held[who] -= dropped
            count[who] -= 1
            total -= dropped
            outputs -= 1
        return victims

    def _expire(self, now: float) -> None:
        while self._kept:
            run_id, oldest = next(iter(self._kept.items()))
            if oldest.at >= now - self.max_age:
                break
            self._drop(run_id)

    def _drop(self, run_id: str) -> None:
        kept = self._kept.pop(run_id)
        caller = kept.record.caller
        mine = self._by[caller]
        mine.remove(run_id)  # the oldest but for an expiry race: a short deque anyway
        self._bytes[caller] -= len(kept.data)
        if not mine:
            del self._by[caller], self._bytes[caller]
        self._total -= len(kept.data)

    def _found(self, run_id: str, caller: str | None) -> _Kept | None:
        kept = self._kept.get(run_id)
        if kept is None or kept.at < time.monotonic() - self.max_age \
                or (caller is not None and kept.record.caller != caller):
            return None
        return kept

    async def save(self, record: RunRecord, *, new: bool = False) -> None:
        """Records come with their outputs (:meth:`keep`): nothing else is saved."""

    async def get(self, run_id: str, *, caller: str | None = None) -> RunRecord | None:
        kept = self._found(run_id, caller)
        return kept.record if kept is not None else None

    async def delete(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._kept:
                self._drop(run_id)

    async def page(self, query: RunQuery) -> tuple[list[RunRecord], str | None]:
        return [], None

    async def put_output(self, run_id: str, data: bytes) -> None:
        """Outputs are kept with their records (:meth:`keep`)."""

    async def output(self, run_id: str, offset: int = 0, length: int | None = None, *,
                     caller: str | None = None) -> bytes | None:
        kept = self._found(run_id, caller)
        if kept is None:
            return None
        data = kept.data
        return data[offset:] if length is None else data[offset:offset + length]
