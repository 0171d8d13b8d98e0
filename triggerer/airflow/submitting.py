"""Outcomes written to Airflow's rows for a whole batch of trigger ids at once: what
``Trigger.submit_event`` and ``Trigger.submit_failure`` do per trigger id, with their
SELECTs done once per batch instead of once per id.

Airflow's ``submit_event`` costs about six statements per trigger id: a SELECT of the id's
DEFERRED task instances, ``handle_event_submit`` for each, then a SELECT of the Trigger
with its asset watchers (and their assets), and a lazy load of its callback. A burst of
1,000 ids is then 1,000 x 6 round trips. Here the task instances of the whole batch are one
SELECT, the triggers with their watchers, assets and callbacks one more (each in pieces of
at most ``PIECE`` ids, under PostgreSQL's 65,535 bound parameters), and then each write is
done in Airflow's order, by Airflow's code:

- an event: Airflow's own ``handle_event_submit`` for each task instance (its
  singledispatch, so a ``BaseTaskEndEvent`` ends the task as Airflow ends it; its serde;
  its failing of an unresumable task instance), then
  ``AssetManager.register_asset_change`` for each asset of the trigger and the trigger's
  callback's ``handle_event``, exactly as ``submit_event`` calls them;
- a failure: what ``submit_failure`` sets on each task instance, with Airflow's constants.

A trigger id written twice in one batch (two outcomes of a trigger that keeps running, an
asset watcher's) reaches its task instances once, as the second ``submit_event`` would find
them no longer DEFERRED, and its assets and callback twice, as two ``submit_event`` would.

``handle_event_submit`` flushes the session after each task instance (one UPDATE round trip
each). For a plain event (Airflow's base handler, whose only use of the session is that
flush) the flushes are deferred and done once for the batch, where SQLAlchemy sends the
UPDATEs together; a ``BaseTaskEndEvent``'s handler uses the session for more than flushing
(callbacks, task history, XComs), so it gets the session itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# Trigger ids bound per IN (...) statement: PostgreSQL binds at most 65,535 parameters.
PIECE = 5_000


@dataclass(frozen=True)
class Write:
    """One outcome for one trigger id: an event, or (``error`` not None) a failure."""

    trigger_id: int
    event: Any = None
    error: BaseException | str | None = None


def write(writes: Sequence[Write], session: Any, *, hold_flushes: bool = True) -> None:
    """Each write, in order, in ``session`` (the caller's transaction, its row locks
    held); the same effects on Airflow's rows as ``Trigger.submit_event(tid, event)`` or
    ``Trigger.submit_failure(tid, error)`` called for each write in turn.

    ``hold_flushes`` False: a plain event's handler flushes after each task instance, as
    in Airflow (to measure what holding them saves)."""
    from airflow.models.trigger import handle_event_submit

    base = handle_event_submit.dispatch(object)
    loaded = _Loaded(writes, session)
    held = _FlushHeld(session)
    for at, w in enumerate(writes):
        # Popped: a second write to this id finds them resumed, as Airflow's would.
        tis = loaded.ready(writes, at).waiting.pop(w.trigger_id, [])
        if w.error is not None:
            for ti in tis:
                _fail(ti, w.error)
            continue
        plain = hold_flushes and handle_event_submit.dispatch(type(w.event)) is base
        while tis:
            handle_event_submit(
                w.event, task_instance=tis.pop(0), session=held if plain else session
            )
            if loaded.closed():
                # Those after it were let go with the session: read again, as the next
                # submit_event would read them.
                tis = loaded.ready(writes, at).waiting.pop(w.trigger_id, [])
        trigger = loaded.ready(writes, at).triggers.get(w.trigger_id)
        if trigger is None:
            continue  # deleted meanwhile: submit_event does nothing more either
        _reach_assets_and_callback(trigger, w.event, session)
    session.flush()


class _Loaded:
    """The task instances and triggers the writes still to be done need, read in one go,
    and read again if the session let them go meanwhile.

    Airflow's handler of a ``BaseTaskEndEvent`` with XComs pushes them with
    ``TaskInstance.xcom_push`` without passing its session: ``provide_session`` then opens
    Airflow's scoped session, the very one this transaction runs in, and its
    ``create_session`` commits and closes it. Every object read before is detached: a
    change made to one afterwards would be lost. Airflow's per-id ``submit_event`` does
    not notice (the next id's SELECT reads afresh, in a new transaction); here the rest of
    the batch is read again when that happens."""

    def __init__(self, writes: Sequence[Write], session: Any) -> None:
        self.session = session
        self.waiting: dict[int, list[Any]] = {}
        self.triggers: dict[int, Any] = {}
        self.sentinel: Any = None
        self.read(writes)

    def read(self, writes: Sequence[Write]) -> None:
        ids = sorted({w.trigger_id for w in writes})
        self.waiting = _deferred(ids, self.session)
        events = sorted({w.trigger_id for w in writes if w.error is None})
        self.triggers = _triggers(events, self.session)
        held = [t for tis in self.waiting.values() for t in tis] + list(self.triggers.values())
        self.sentinel = held[0] if held else None

    def closed(self) -> bool:
        from sqlalchemy import inspect  # type: ignore[import-not-found]

        return self.sentinel is not None and bool(inspect(self.sentinel).detached)

    def ready(self, writes: Sequence[Write], at: int) -> _Loaded:
        """Itself, read again for ``writes[at:]`` if the session let go of what it read."""
        if self.closed():
            self.read(writes[at:])
        return self


def _deferred(ids: list[int], session: Any) -> dict[int, list[Any]]:
    """The DEFERRED task instances waiting on ``ids``, by trigger id: ``submit_event``'s
    SELECT, for every id at once."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    found: dict[int, list[Any]] = {}
    for piece in _pieces(ids):
        query = (
            select(TaskInstance)
            .where(
                TaskInstance.trigger_id.in_(piece),
                TaskInstance.state == TaskInstanceState.DEFERRED,
            )
            .order_by(TaskInstance.trigger_id, TaskInstance.id)
        )
        for ti in session.scalars(query):
            found.setdefault(int(ti.trigger_id), []).append(ti)
    return found


def _triggers(ids: list[int], session: Any) -> dict[int, Any]:
    """The Trigger rows of ``ids`` with their asset watchers, assets and callback loaded
    (``submit_event``'s SELECT and its lazy load of the callback, for every id at once).

    Only the rows with an asset watcher or a callback: for any other, ``submit_event``
    reads the row and does nothing with it, and reading a burst's task triggers (their
    kwargs and all) was a fifth of the batch's time."""
    from airflow.models.asset import AssetWatcherModel
    from airflow.models.trigger import Trigger
    from sqlalchemy import or_, select
    from sqlalchemy.orm import selectinload  # type: ignore[import-not-found]

    found: dict[int, Any] = {}
    for piece in _pieces(ids):
        query = (
            select(Trigger)
            .where(
                Trigger.id.in_(piece),
                or_(Trigger.asset_watchers.any(), Trigger.callback.has()),
            )
            .options(
                selectinload(Trigger.asset_watchers).selectinload(AssetWatcherModel.asset),
                selectinload(Trigger.callback),
            )
        )
        for trigger in session.scalars(query):
            found[int(trigger.id)] = trigger
    return found


def _reach_assets_and_callback(trigger: Any, event: Any, session: Any) -> None:
    """What ``submit_event`` does for the trigger itself, in its order."""
    from airflow.assets.manager import AssetManager

    for asset in trigger.assets:
        AssetManager.register_asset_change(
            asset=asset.to_serialized(),
            extra={"from_trigger": True, "payload": event.payload},
            session=session,
        )
    if trigger.callback:
        trigger.callback.handle_event(event, session)


def _fail(ti: Any, error: BaseException | str) -> None:
    """What ``submit_failure`` sets on each of its task instances."""
    from traceback import format_exception

    from airflow._shared.timezones import timezone
    from airflow.models.trigger import TRIGGER_FAIL_REPR, TriggerFailureReason
    from airflow.utils.state import TaskInstanceState

    if isinstance(error, BaseException):
        traceback: Any = format_exception(type(error), error, error.__traceback__)
    else:
        traceback = error
    ti.next_method = TRIGGER_FAIL_REPR
    ti.next_kwargs = {"error": TriggerFailureReason.TRIGGER_FAILURE, "traceback": traceback}
    ti.trigger_id = None
    ti.state = TaskInstanceState.SCHEDULED
    ti.scheduled_dttm = timezone.utcnow()


def _pieces(ids: list[int]) -> Iterable[list[int]]:
    for start in range(0, len(ids), PIECE):
        yield ids[start : start + PIECE]


class _FlushHeld:
    """The session as Airflow's base ``handle_event_submit`` uses it (it only flushes),
    with that flush left to the end of the batch."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def flush(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)
