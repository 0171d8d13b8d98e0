"""Settling a check's result: an event fires its waits, an error fails them, a transient
error backs off, "not yet" puts the check back on the schedule.

A result is settled at once, wherever the check ran (a round, a batched call, an early
call, a held run()): an exception that is not :data:`TRANSIENT` fails the waits with the
traceback in their log; a transient one is retried with backoff, and while a connection's
checks back off one of them (its probe) retries at least every ``PROBE_EVERY`` s. Check
logs are sampled so that a six-hour wait stays readable.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from triggers.base import TransientError, TriggerEvent, clip

from .checks import Check, CheckTable
from .models import KeptModels
from .store import Fire
from .waitref import Waits
from .writing import Outbox

# Bounds on a wait's sampled check log (see _log_check): lines past the first CHANGED_LINES
# checks come only at powers of two, and each line is clipped to LOG_LINE characters.
CHANGED_LINES = 64
LOG_LINE = 1000

TRANSIENT = (TransientError, OSError, TimeoutError, ConnectionError)
# While a connection's checks back off, one of them (its probe) retries at least this
# often, so a server that comes back is seen within seconds; its first success resets
# the backoff of every wait on that connection (BaseTrigger.connection_key).
PROBE_EVERY = 5.0

# A list of (next due time, check) to put back on the schedule together (schedule_many).
Settled = list[tuple[float, Check]]


class Settler:
    def __init__(
        self, table: CheckTable, outbox: Outbox, models: KeptModels, *, max_backoff: float
    ) -> None:
        self._table = table
        self._outbox = outbox
        self.models = models  # the runner's too: a dropped check's kept trigger goes
        self._max_backoff = max_backoff
        # connection key -> poke_hashes backing off on it; the first is the probe.
        self._backing_off: dict[str, dict[str, None]] = {}
        self.checks_done = 0
        self.checks_failed = 0
        self.events_fired = 0
        self.unloadable = 0  # checks whose kwargs, loaded unvalidated, failed to validate

    def settle(self, check: Check, result: Any, now: float) -> None:
        """Settle one check's result from outside a round (a held trigger's event): fire,
        fail, or put it back on the schedule."""
        settled: Settled = []
        self.settle_into(check, result, now, settled)
        self._table.schedule_many(settled)

    def settle_into(self, check: Check, result: Any, now: float, settled: Settled) -> None:
        """Act on one result; a check to run again is appended to ``settled`` (its next
        due time), for the caller to put back on the schedule with the rest of its batch."""
        try:
            if self._table.by_hash.get(check.poke_hash) is not check:
                return  # dropped meanwhile (shard lost, every subscriber gone)
            try:
                self._settle_result(check, result, now, settled)
            except Exception as exc:  # the trigger's own code (payload, next_check_at) failed
                self.checks_failed += 1
                self.drop(check)
                self._outbox.fail(
                    waits_of(check), f"cannot handle the result of {_where(check)}: "
                                     f"{type(exc).__name__}: {exc}"
                )  # fmt: skip
        finally:
            check.release()  # the record keeps no model between checks (see models.py)

    def drop(self, check: Check) -> None:
        """The check is over (fired, failed): out of the table, its kept trigger too."""
        self._table.drop(check)
        self.models.forget(check)

    def cannot_load(self, check: Check, exc: Exception) -> None:
        """A check loaded unvalidated whose kwargs fail to validate (a TriggerLoadError
        saying why): its waits fail, as the load would have failed them (loading.py)."""
        self.unloadable += 1
        self.drop(check)
        self._outbox.fail(waits_of(check), f"cannot load trigger: {exc}")

    def _settle_result(self, check: Check, result: Any, now: float, settled: Settled) -> None:
        check.checks += 1
        self.checks_done += 1
        if result is None:  # not yet: the hot path, no string built unless it is logged
            check.failures = 0
            if self._backing_off:  # a server was down: this success may end its outage
                self._connection_back(check, now)
            n = check.checks
            if n & (n - 1) == 0 or check.last_result is not check.interval:
                self._outbox.log(
                    check.subscribers,
                    f"checked {_where(check)}: not yet; next in {check.interval:g} s",
                )
            check.last_result = check.interval
            settled.append((self._next_at(check, now), check))
            return
        where = _where(check)
        if isinstance(result, TriggerEvent):
            self._connection_back(check, now)
            if result.error:
                msg = f"trigger {where} reported an error: {result.error}"
            else:
                msg = f"trigger fired: {where} (after {check.checks} checks)"
            payload = json.dumps(result.payload)  # before anything is dropped: it may fail
            self.drop(check)
            self.events_fired += 1
            self._outbox.fire(
                Fire(waits_of(check), payload, msg, error=msg if result.error else None)
            )
            return
        if isinstance(result, BaseException) and not isinstance(result, TRANSIENT):
            self.checks_failed += 1
            self.drop(check)
            tb = "".join(traceback.format_exception(result)).rstrip()
            self._outbox.fail(
                waits_of(check), f"trigger {where} raised {type(result).__name__}: {result}\n{tb}"
            )
            return
        if isinstance(result, BaseException):
            self.checks_failed += 1
            check.failures += 1
            delay = min(self._max_backoff, check.interval * 2 ** min(check.failures, 10))
            if self._is_probe(check):
                delay = min(delay, max(PROBE_EVERY, check.interval))
            line = (
                f"check of {where} failed ({type(result).__name__}: {result}); "
                f"retry {check.failures} in {delay:g} s"
            )
            self._log_check(check, line, force=check.failures == 1)
            settled.append((now + delay, check))
            return
        # Anything else is "not yet" too (a poke returning a falsy non-None value).
        check.failures = 0
        self._connection_back(check, now)
        line = f"checked {where}: not yet; next in {check.interval:g} s"
        self._log_check(check, line)
        settled.append((self._next_at(check, now), check))

    def _next_at(self, check: Check, now: float) -> float:
        """Its own interval, or the push layer's say (the slow safety poll of a check whose
        source is live; at once for one pushed while it ran)."""
        watcher = self._table.watcher
        if watcher is not None:
            at = watcher.next_check(check, now)
            if at is not None:
                return at
        return check.model().next_check_at(now, check.interval)

    def _is_probe(self, check: Check) -> bool:
        """Note a check backing off on its connection; whether it is that connection's probe
        (the first one, or the next when the probe is gone)."""
        key = check.trigger.connection_key()
        if key is None:
            return False
        waiting = self._backing_off.setdefault(key, {})
        waiting[check.poke_hash] = None
        for poke_hash in list(waiting):
            if self._table.by_hash.get(poke_hash) is not None:
                return poke_hash == check.poke_hash
            del waiting[poke_hash]  # fired, failed or unsubscribed meanwhile
        return True

    def _connection_back(self, check: Check, now: float) -> None:
        """A check on a connection succeeded: its waits backing off are checked at once."""
        key = check.trigger.connection_key()
        waiting = self._backing_off.pop(key, None) if key is not None else None
        if not waiting:
            return
        for poke_hash in waiting:
            other = self._table.by_hash.get(poke_hash)
            if other is not None and other is not check and other.failures and not other.running:
                other.failures = 0
                self._table.schedule(other, now)

    def _log_check(self, check: Check, line: str, force: bool = False) -> None:
        # Sampled so that a six-hour wait stays readable: checks 1, 2, 4, 8, 16, ..., and a
        # changed result, but only for the first CHANGED_LINES checks: a result that differs
        # every time (a message with a counter) must not write a line per check for 14 hours.
        # So a wait gets at most CHANGED_LINES + log2(checks) lines of LOG_LINE characters.
        n = check.checks
        if n & (n - 1) == 0 or ((force or line != check.last_result) and n <= CHANGED_LINES):
            self._outbox.log(check.subscribers, clip(line, LOG_LINE))
        check.last_result = line


def _where(check: Check) -> str:
    return check.model().describe()


def waits_of(check: Check) -> Waits:
    """The waits a check answers, each with the trigger row it waits on."""
    return {row: sub.trigger_id for row, sub in check.subscribers.items()}
