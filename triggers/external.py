"""ExternalDagRunTrigger: another DAG's run (or one task of it) reached a state.

Batched: every waiting question is answered by one query per cycle
(``ctx.external_states``), however many tasks wait on other runs.

Pushed on PostgreSQL: a table trigger (schema/postgres/012_run_state_notify.sql) sends
``NOTIFY slotless_runs, 'dag_id/logical_date'`` whenever a run is created or changes
state, and one LISTEN per triggerer wakes the waits on that run at once; they are then
polled only at the safety interval. A wait on one task of a run (``task_id``) and every
wait on SQLite are polled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from pydantic import field_validator, model_validator

from .base import BaseTrigger, TriggerEvent, is_template
from .context import TriggerContext
from .listing import on_grid
from .push import PushInterest, PushSource, PushUnavailable, Wake

RUNS_CHANNEL = "slotless_runs"  # the schema's run-state trigger notifies it


class ExternalDagRunTrigger(BaseTrigger):
    """Fires when ``dag_id``'s run for ``logical_date + offset_days`` is in an allowed state.

    ``task_id`` narrows the question to one task of that run. ``logical_date`` is a date
    or a template such as ``"{{ ds }}"`` (filled per run by the sensor); ``offset_days=-1``
    waits for the previous day's run. In one of ``failed_states`` the trigger reports an
    error, so the waiting task fails with a message naming the other run. When several
    runs share the logical date, the latest one counts. The event's payload is
    ``{"dag_id", "task_id", "logical_date", "run_id", "state"}``.
    """

    dag_id: str
    task_id: str | None = None
    logical_date: str
    offset_days: int = 0
    allowed_states: list[str] = ["SUCCESS"]
    failed_states: list[str] = ["FAILED", "UPSTREAM_FAILED"]

    @field_validator("logical_date", mode="before")
    @classmethod
    def _date(cls, value: Any) -> Any:
        if isinstance(value, datetime):
            return value.date().isoformat()
        if isinstance(value, date):
            return value.isoformat()
        if isinstance(value, str) and not is_template(value):
            try:
                return date.fromisoformat(value).isoformat()
            except ValueError:
                raise ValueError(
                    f"logical_date {value!r} is neither a date (YYYY-MM-DD) nor a "
                    "template such as '{{ ds }}'"
                ) from None
        return value

    @field_validator("allowed_states", "failed_states")
    @classmethod
    def _states(cls, value: list[str]) -> list[str]:
        return [s.upper() for s in value]

    @model_validator(mode="after")
    def _disjoint(self) -> ExternalDagRunTrigger:
        if not self.allowed_states:
            raise ValueError("allowed_states must not be empty")
        both = set(self.allowed_states) & set(self.failed_states)
        if both:
            raise ValueError(f"states both allowed and failed: {sorted(both)}")
        return self

    @property
    def target_date(self) -> str:
        """The other run's logical date (raises if the template was never filled)."""
        if is_template(self.logical_date):
            raise ValueError(
                f"logical_date {self.logical_date!r} was not rendered: use this trigger "
                "in a sensor (which fills '{{ ds }}') or pass a date"
            )
        day = date.fromisoformat(self.logical_date) + timedelta(days=self.offset_days)
        return day.isoformat()

    def next_check_at(self, now: float, interval: float) -> float:
        return on_grid(now, interval)  # checks of one cycle fall due together: one request

    def describe(self) -> str:
        what = self.dag_id + (f".{self.task_id}" if self.task_id else "")
        try:
            when = self.target_date
        except ValueError:
            when = f"{self.logical_date}{self.offset_days:+d}d"
        return f"dag run {what} @ {when}"

    def answer(self, state: str | None, run_id: str | None) -> TriggerEvent | None:
        if state is None:
            return None  # no such run (or task) yet
        if state in self.allowed_states:
            return TriggerEvent(
                payload={
                    "dag_id": self.dag_id,
                    "task_id": self.task_id,
                    "logical_date": self.target_date,
                    "run_id": run_id,
                    "state": state,
                }
            )
        if state in self.failed_states:
            what = f"task {self.task_id!r} of " if self.task_id else ""
            return TriggerEvent(
                error=(
                    f"{what}run {run_id} of DAG {self.dag_id!r} "
                    f"(logical date {self.target_date}) is {state}"
                )
            )
        return None

    def push_interest(self, ctx: TriggerContext) -> PushInterest | None:
        """Woken by the NOTIFY of the other run's state change (PostgreSQL)."""
        if self.task_id is not None:
            return None  # task ends are not announced: polled
        try:
            topic = f"{self.dag_id}/{self.target_date}"
        except ValueError:
            return None  # never rendered: the check says so
        return PushInterest(("notify", RUNS_CHANNEL), RunStateNotifications, topic=topic)

    @classmethod
    async def poke_many(
        cls, triggers: Sequence[BaseTrigger], ctx: TriggerContext
    ) -> Sequence[TriggerEvent | BaseException | None]:
        results: list[TriggerEvent | BaseException | None] = [None] * len(triggers)
        questions: list[dict[str, Any]] = []
        asked: list[int] = []
        for i, t in enumerate(triggers):
            assert isinstance(t, ExternalDagRunTrigger)
            try:
                day = t.target_date
            except ValueError as exc:
                results[i] = exc
                continue
            questions.append({"dag_id": t.dag_id, "task_id": t.task_id, "logical_date": day})
            asked.append(i)
        if questions:
            rows = await ctx.external_states(questions)  # one query for all of them
            by_q = {int(r["q"]): r for r in rows}
            for q, i in enumerate(asked):
                row = by_q.get(q)
                t = triggers[i]
                assert isinstance(t, ExternalDagRunTrigger)
                results[i] = t.answer(row["state"] if row else None, row["run_id"] if row else None)
        return results


class RunStateNotifications(PushSource):
    """The database's notifications of runs' state changes: topics ``dag_id/logical_date``."""

    def describe(self) -> str:
        return f"LISTEN {RUNS_CHANNEL}"

    async def run(self, ctx: Any, ready: Callable[[], None], wake: Wake) -> None:
        lost = asyncio.Event()

        def heard(payload: str | None) -> None:
            if payload is None:
                lost.set()
            else:
                wake([payload])

        stop = await ctx.subscribe(RUNS_CHANNEL, heard)
        if stop is None:
            raise PushUnavailable("this database sends no notifications", retry=False)
        try:
            ready()
            await lost.wait()
        finally:
            stop()
        raise PushUnavailable("the LISTEN connection was lost")
