"""Push sources in the triggerer: shared like batched checks, polling as the safety net.

A layer beside the check table, joined to it at three points only:

* the table tells the hub when a distinct check is first held and when it is let go
  (:meth:`PushHub.added`, :meth:`PushHub.removed`); the hub asks the trigger for its
  :meth:`~triggers.base.BaseTrigger.push_interest` and opens the named source once, however
  many checks name it (one inotify watch per directory, one consumer per queue, one
  LISTEN per channel), and closes it with the last check that named it;
* a push makes the checks of its topic due now (:meth:`CheckTable.wake`; a check
  running at that moment runs again as soon as it ends);
* the runner asks when a "not yet" check is next due (:meth:`PushHub.next_check`): while
  its source is live, after the slow safety interval (``push_safety_interval``, or the
  check's own interval if longer); otherwise at its own interval.

A source that cannot start or that fails (no inotify on that filesystem, the queue was
deleted, garbage on the queue, the LISTEN connection lost) is logged once per failure,
its checks are woken once and go back to their own interval, and it is tried again
after ``push_retry`` seconds (doubling up to ten times that). When a source becomes live
every check it serves is woken once: whatever changed before it listened is seen then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from triggers.base import BaseTrigger
from triggers.context import TriggerContext
from triggers.push import PushInterest, PushSource, PushUnavailable

from .checks import Check, CheckTable

log = logging.getLogger("slotless.triggerer.push")


@dataclass(slots=True, eq=False)
class _Held:
    """One open source and the checks that named it, by topic."""

    key: Hashable
    source: PushSource
    exact: dict[str, set[str]] = field(default_factory=dict)
    patterns: dict[str, tuple[re.Pattern[str], set[str]]] = field(default_factory=dict)
    anything: set[str] = field(default_factory=set)
    checks: int = 0
    live: bool = False
    task: asyncio.Task[None] | None = None
    pushes: int = 0


class PushHub:
    def __init__(
        self,
        table: CheckTable,
        ctx: TriggerContext,
        *,
        wake_checker: asyncio.Event,
        clock: Callable[[], float],
        safety_interval: float = 300.0,
        retry_after: float = 30.0,
        enabled: bool = True,
        early: Callable[[Iterable[str]], None] | None = None,
    ) -> None:
        self._table = table
        self._ctx = ctx
        self._wake_checker = wake_checker
        self._clock = clock
        self.safety_interval = safety_interval
        self.retry_after = retry_after
        self.enabled = enabled
        self._sources: dict[Hashable, _Held] = {}
        # poke_hash -> (source key, topic, pattern) of the checks a source serves.
        self._interest: dict[str, tuple[Hashable, str | None, str | None]] = {}
        self._again: set[str] = set()  # woken while running: due again when it ends
        # Woken by a push of their topic: a "not yet" then is checked once more soon (a
        # listing shared with a check that began before the change may not show it).
        self._pushed: set[str] = set()
        self.recheck = 1.0
        self._pushable: dict[type[BaseTrigger], bool] = {}
        # Called with the checks pushed by name while a call of theirs is in flight: they
        # are checked early instead of after it (triggerer/early.py).
        self._early = early
        self.pushes = 0  # topics pushed (for metrics and benchmarks)
        self.woken = 0  # checks made due by a push

    # -- what the table tells ---------------------------------------------------------

    def added(self, check: Check) -> None:
        """A distinct check is held from now on: join its source, if it has one."""
        cls = check.cls
        pushable = self._pushable.get(cls)
        if pushable is None:
            pushable = self._pushable[cls] = cls.push_interest is not BaseTrigger.push_interest
        if not (pushable and self.enabled):
            return
        try:
            interest = check.trigger.push_interest(self._ctx)
        except Exception as exc:  # the trigger's code: its check is polled, nothing fails
            log.warning("push_interest of %s failed (%s); polled", cls.classpath(), exc)
            return
        if interest is not None:
            self._join(check.poke_hash, interest)

    def removed(self, check: Check) -> None:
        """The check is let go (fired, failed, every wait gone, shard lost)."""
        entry = self._interest.pop(check.poke_hash, None)
        self._again.discard(check.poke_hash)
        self._pushed.discard(check.poke_hash)
        if entry is None:
            return
        key, topic, pattern = entry
        held = self._sources.get(key)
        if held is None:
            return
        h = check.poke_hash
        if topic is not None:
            _discard(held.exact, topic, h)
        elif pattern is not None:
            rx_hashes = held.patterns.get(pattern)
            if rx_hashes is not None:
                rx_hashes[1].discard(h)
                if not rx_hashes[1]:
                    del held.patterns[pattern]
        else:
            held.anything.discard(h)
        held.checks -= 1
        if held.checks <= 0:
            self._close(held)

    def next_check(self, check: Check, now: float) -> float | None:
        """When a check that answered "not yet" is due next, if its source decides."""
        h = check.poke_hash
        if h in self._again:
            self._again.discard(h)
            return now
        if h in self._pushed:
            self._pushed.discard(h)
            return now + min(self.recheck, check.interval)
        entry = self._interest.get(h)
        if entry is None:
            return None
        held = self._sources.get(entry[0])
        if held is None or not held.live or self.safety_interval <= check.interval:
            return None
        return check.trigger.next_check_at(now, self.safety_interval)

    # -- sources ------------------------------------------------------------------------

    def _join(self, poke_hash: str, interest: PushInterest) -> None:
        held = self._sources.get(interest.key)
        if held is None:
            try:
                source = interest.opener()
            except Exception as exc:
                log.warning("cannot create push source %r (%s); polled", interest.key, exc)
                return
            held = self._sources[interest.key] = _Held(interest.key, source)
            held.task = asyncio.get_running_loop().create_task(
                self._run(held), name=f"push {source.describe()}"
            )
        if interest.topic is not None:
            held.exact.setdefault(interest.topic, set()).add(poke_hash)
        elif interest.pattern is not None:
            entry = held.patterns.get(interest.pattern)
            if entry is None:
                matcher = interest.matcher()
                assert matcher is not None
                entry = held.patterns[interest.pattern] = (matcher, set())
            entry[1].add(poke_hash)
        else:
            held.anything.add(poke_hash)
        held.checks += 1
        self._interest[poke_hash] = (interest.key, interest.topic, interest.pattern)

    async def _run(self, held: _Held) -> None:
        delay = self.retry_after
        what = held.source.describe()
        while True:
            try:
                await held.source.run(
                    self._ctx, lambda: self._ready(held), lambda topics: self._push(held, topics)
                )
                reason = "it ended"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                reason = str(exc) or type(exc).__name__
                if isinstance(exc, PushUnavailable) and not exc.retry:
                    held.live = False
                    log.info("push source %s: %s; its checks are polled", what, reason)
                    return
            was_live, held.live = held.live, False
            log.warning(
                "push source %s unavailable (%s): its %d checks are polled at their own "
                "interval; trying it again in %g s",
                what,
                reason,
                held.checks,
                delay,
            )
            if was_live:  # they were on the safety interval: back to their own, from now
                self._push(held, [None])
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_after * 10)

    def _ready(self, held: _Held) -> None:
        held.live = True
        log.info("push source %s is live for %d checks", held.source.describe(), held.checks)
        self._push(held, [None])  # what changed before it listened is seen now

    def _push(self, held: _Held, topics: Iterable[str | None]) -> None:
        """Make the checks the topics concern due now."""
        hashes: set[str] = set()
        pushed = False  # a topic named (not "anything may have changed")
        for topic in topics:
            self.pushes += 1
            held.pushes += 1
            if topic is None:
                for group in held.exact.values():
                    hashes |= group
                for _, group in held.patterns.values():
                    hashes |= group
                hashes |= held.anything
                continue
            exact = held.exact.get(topic)
            if exact:
                hashes |= exact
            for rx, group in held.patterns.values():
                if rx.match(topic):
                    hashes |= group
            hashes |= held.anything
            pushed = True
        if hashes:
            if pushed:
                self._pushed |= hashes
            woken = self._table.wake(hashes, self._clock(), self._again)
            self.woken += woken
            if woken:
                self._wake_checker.set()
            if pushed and self._early is not None:
                in_flight = hashes & self._again  # running now: woken only once they end
                if in_flight:
                    self._early(in_flight)

    def _close(self, held: _Held) -> None:
        if self._sources.get(held.key) is held:
            del self._sources[held.key]
        if held.task is not None:
            held.task.cancel()

    # -- for status, tests and benchmarks ------------------------------------------------

    def live(self, key: Hashable) -> bool:
        held = self._sources.get(key)
        return held is not None and held.live

    @property
    def sources(self) -> dict[Hashable, bool]:
        """Open sources and whether each is live."""
        return {k: h.live for k, h in self._sources.items()}

    async def aclose(self) -> None:
        tasks = [h.task for h in self._sources.values() if h.task is not None]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        self._sources.clear()
        self._interest.clear()


def _discard(groups: dict[str, set[str]], topic: str, poke_hash: str) -> None:
    group = groups.get(topic)
    if group is not None:
        group.discard(poke_hash)
        if not group:
            del groups[topic]
