"""The triggerer's memory: one entry per distinct check, and a heap of due times.

No coroutine per trigger: a check is a small object (the trigger, its subscribers, when
it is due) and a heap entry, so 100,000 waits cost memory, not scheduler work.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from triggers.base import BaseTrigger


@dataclass(slots=True)
class Subscriber:
    task_row: int
    trigger_id: int
    interval: float
    resumable: bool


@dataclass(slots=True, eq=False)
class Check:
    poke_hash: str
    trigger: BaseTrigger
    shard: int
    subscribers: dict[int, Subscriber] = field(default_factory=dict)
    interval: float = 60.0
    due: float = 0.0
    seq: int = 0  # of its current heap entry; older entries are stale
    checks: int = 0
    failures: int = 0
    running: bool = False
    last_result: str = ""

    def recompute_interval(self) -> None:
        """Shortest interval any subscriber asked for."""
        if self.subscribers:
            self.interval = min(s.interval for s in self.subscribers.values())


class CheckTable:
    """poke_hash -> Check, plus the schedule of due checks."""

    def __init__(self) -> None:
        self.by_hash: dict[str, Check] = {}
        self.by_row: dict[int, Check] = {}
        # Entries name their check by poke_hash, not by reference: a tuple of a float, an
        # int and a str is untracked by the garbage collector, so 100,000 entries add
        # nothing to the full collections that would otherwise stall the loop.
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self.by_hash)

    @property
    def subscriptions(self) -> int:
        return len(self.by_row)

    def subscribe(
        self, poke_hash: str, trigger: BaseTrigger, shard: int, sub: Subscriber, now: float
    ) -> Check:
        check = self.by_hash.get(poke_hash)
        if check is None:
            check = Check(poke_hash, trigger, shard, interval=sub.interval)
            self.by_hash[poke_hash] = check
            self.schedule(check, trigger.first_check_at(now))
        check.subscribers[sub.task_row] = sub
        self.by_row[sub.task_row] = check
        if sub.interval < check.interval:
            check.interval = sub.interval
            # A newcomer in a hurry: check no later than its own interval from now.
            if check.due > now + sub.interval and not check.running:
                self.schedule(check, trigger.next_check_at(now, sub.interval))
        return check

    def unsubscribe(self, task_row: int) -> None:
        check = self.by_row.pop(task_row, None)
        if check is None:
            return
        check.subscribers.pop(task_row, None)
        if not check.subscribers:
            self.by_hash.pop(check.poke_hash, None)
        else:
            check.recompute_interval()

    def drop(self, check: Check) -> None:
        """Forget a check and every subscription to it (it fired or failed for good)."""
        self.by_hash.pop(check.poke_hash, None)
        for row in check.subscribers:
            if self.by_row.get(row) is check:
                del self.by_row[row]

    def schedule(self, check: Check, at: float) -> None:
        check.due = at
        check.seq = next(self._seq)
        heapq.heappush(self._heap, (at, check.seq, check.poke_hash))

    def next_due(self) -> float | None:
        self._discard_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int) -> Iterator[Check]:
        """Due checks, earliest first; entries of dropped or rescheduled checks are skipped."""
        n = 0
        while self._heap and n < limit:
            self._discard_stale()
            if not self._heap or self._heap[0][0] > now:
                return
            _, _, poke_hash = heapq.heappop(self._heap)
            n += 1
            yield self.by_hash[poke_hash]

    def _discard_stale(self) -> None:
        heap = self._heap
        while heap:
            _, seq, poke_hash = heap[0]
            check = self.by_hash.get(poke_hash)
            if check is not None and check.seq == seq and not check.running:
                return
            heapq.heappop(heap)
