"""Held triggers (``held = True``: run() open for the whole wait, as Airflow's are) in the
triggerer in-process, and AirflowTrigger where Airflow is not installed (the main .venv).

Airflow's own classes are tested in tests/e2e/test_airflow_triggers.py, from .venv-airflow.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar

import pytest
from support.helpers import async_wait_until
from support.triggers import serving, state_of

from executor import DAG
from triggers.airflow import (
    AirflowNotInstalled,
    AirflowTrigger,
    decode_kwargs,
    encode_kwargs,
    slotless_event,
)
from triggers.base import BaseTrigger, TriggerEvent
from triggers.context import TriggerContext
from triggers.registry import TriggerLoadError, load_trigger, register

DAY = date(2026, 4, 25)


@register
class HeldFlag(BaseTrigger):
    """Loops inside run() until its name is in OPEN; records starts and cleanups."""

    name: str
    OPEN: ClassVar[set[str]] = set()
    STARTS: ClassVar[list[str]] = []
    CLEANUPS: ClassVar[list[str]] = []
    held: ClassVar[bool] = True

    async def run(self, ctx: TriggerContext) -> AsyncIterator[TriggerEvent]:
        HeldFlag.STARTS.append(self.name)
        try:
            while self.name not in HeldFlag.OPEN:
                await asyncio.sleep(0.02)
            yield TriggerEvent(payload={"name": self.name})
        finally:
            HeldFlag.CLEANUPS.append(self.name)


@pytest.fixture(autouse=True)
def _clean() -> None:
    HeldFlag.OPEN.clear()
    HeldFlag.STARTS.clear()
    HeldFlag.CLEANUPS.clear()


def waiters(dag_id: str, names: list[str], timeout: float | None = None) -> DAG:
    dag = DAG(dag_id)
    for i, name in enumerate(names):
        dag.sensor(f"s{i}", HeldFlag(name=name), timeout=timeout or 60)
    return dag


async def test_equal_held_triggers_share_one_run_closed_once_when_it_fires(store) -> None:
    dag = waiters("held", ["shared", "shared", "shared", "other"])
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag) as h:
        assert h.triggerer is not None
        await async_wait_until(lambda: len(HeldFlag.STARTS) == 2, what="two held runs")
        assert sorted(HeldFlag.STARTS) == ["other", "shared"]
        assert len(h.triggerer.holder) == 2
        HeldFlag.OPEN.add("shared")

        def all_succeeded() -> bool:
            return all(state_of(store.db.path, run_id, f"s{i}") == "SUCCESS" for i in range(3))

        await async_wait_until(all_succeeded, what="the three sensors SUCCESS")
        assert HeldFlag.CLEANUPS == ["shared"]
        assert len(h.triggerer.holder) == 1  # "other" still held, nothing restarted
        assert HeldFlag.STARTS.count("shared") == 1
        assert state_of(store.db.path, run_id, "s3") == "DEFERRED"
    # Stopping the triggerer closes what it holds (the wait moves elsewhere): cleaned up.
    assert HeldFlag.CLEANUPS == ["shared", "other"]


async def test_a_held_wait_that_times_out_is_closed(store) -> None:
    dag = waiters("late", ["never"], timeout=0.5)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag):
        await async_wait_until(
            lambda: state_of(store.db.path, run_id, "s0") == "FAILED", what="sensor timeout"
        )
        await async_wait_until(lambda: HeldFlag.CLEANUPS == ["never"], what="closed")


@pytest.mark.skipif(
    importlib.util.find_spec("airflow") is not None, reason="Airflow is installed here"
)
def test_without_airflow_the_error_names_the_extra() -> None:
    with pytest.raises(AirflowNotInstalled, match=r"slotless\[airflow\]"):
        AirflowTrigger("airflow.providers.standard.triggers.file.FileTrigger", filepath="/x")
    # A stored row, loaded by a triggerer without Airflow: its task fails, saying why.
    with pytest.raises(TriggerLoadError, match=r"slotless\[airflow\]"):
        load_trigger(
            "triggers.airflow.AirflowTrigger",
            {"trigger_classpath": "airflow.providers.standard.triggers.file.FileTrigger"},
        )


def test_kwargs_keep_dates_and_refuse_what_json_cannot_hold() -> None:
    moment = datetime(2026, 4, 25, 6, 0, tzinfo=UTC)
    kwargs = {"moment": moment, "delta": timedelta(minutes=5), "keys": ("a", "b"), "n": 1}
    stored = encode_kwargs(kwargs)
    assert decode_kwargs(stored) == {**kwargs, "keys": ["a", "b"]}
    with pytest.raises(TypeError, match="of type object cannot be stored"):
        encode_kwargs({"client": object()})


def test_airflow_events_become_slotless_events() -> None:
    class Event:
        def __init__(self, payload: Any) -> None:
            self.payload = payload

    class Ended:
        task_instance_state = "failed"
        xcoms = None

    moment = datetime(2026, 4, 25, 6, 0, tzinfo=UTC)
    assert slotless_event(Event(moment)).payload == "2026-04-25T06:00:00+00:00"
    assert slotless_event(Event({"ok": True})).payload == {"ok": True}
    assert slotless_event(Ended()).error == "the Airflow trigger ended the task failed"
    with pytest.raises(TypeError, match="not JSON"):
        slotless_event(Event(object()))
