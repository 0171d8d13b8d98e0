"""Airflow triggers at the edges, where Airflow is not installed (the main .venv):

- a provider trigger's failure payload (``status`` of error / failed / timeout, with its
  ``message``) becomes a slotless error, so the sensor fails as Airflow's
  ``execute_complete`` would make it; any other payload stays an event;
- a held trigger that loops without waiting (a provider trigger retrying a missing
  connection at once) never blocks the loop for long, yet the watchdog names it.

The same payloads from Airflow's own TriggerEvent, in real processes, are tested in
tests/e2e/test_airflow_triggers.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

import pytest

from triggerer.watchdog import LoopWatch
from triggers.airflow import failed_status, slotless_event
from triggers.loopmeter import take, timed


class Event:
    """What slotless_event reads of Airflow's TriggerEvent: its payload."""

    def __init__(self, payload: Any) -> None:
        self.payload = payload


S3_DOWN = "Could not connect to the endpoint URL: http://127.0.0.1:1/bucket"


@pytest.mark.parametrize("status", ["error", "failed", "timeout", "ERROR"])
def test_a_failure_payload_fails_the_task_with_its_message(status: str) -> None:
    payload = {"status": status, "message": S3_DOWN}
    event = slotless_event(Event(payload))
    assert event.error == f"the Airflow trigger reported status {status!r}: {S3_DOWN}"
    assert event.payload == payload  # kept for the task's log
    assert failed_status({"status": status}) == (
        f"the Airflow trigger reported status {status!r} (no message)"
    )


@pytest.mark.parametrize(
    "payload",
    [
        {"status": "success", "message": "found"},
        {"status": "running"},
        {"message": "no status"},
        {"status": 1},
        ["error"],
        "error",
        True,
        None,
    ],
)
def test_any_other_payload_is_an_event(payload: Any) -> None:
    event = slotless_event(Event(payload))
    assert event.error is None and event.payload == payload


def _build_request() -> dict[str, str]:
    """A provider's Python work before its request (~0.2 ms here): headers, a URL."""
    headers = {}
    for i in range(300):
        headers[f"x-h{i}"] = str(i)
    return headers


async def spinning(seconds: float) -> int:
    """An Airflow trigger's run() with no connection: it retries its failing lookup at
    once, each try some Python work and no wait (HttpSensorTrigger does this), until
    ``seconds`` have passed."""
    end = time.monotonic() + seconds
    tries = 0
    while time.monotonic() < end:
        try:
            _build_request()
            raise LookupError("connection 'http_default' is not defined")
        except LookupError:
            tries += 1
        await asyncio.sleep(0)  # the next try at once
    return tries


async def patient(tries: int) -> int:
    """The same, waiting its poke_interval between tries."""
    for _ in range(tries):
        _build_request()
        await asyncio.sleep(0.1)
    return tries


async def watched(work: Awaitable[int], who: str) -> tuple[LoopWatch, int]:
    """``work`` timed as AirflowTrigger.run times its trigger, under a watchdog."""
    watch = LoopWatch(busy_window=0.5)
    watching = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(0.1)
        result = await timed(work, who)
        await asyncio.sleep(0.6)  # the last window reported
    finally:
        watching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watching
    return watch, result


async def test_the_watchdog_names_a_held_trigger_that_keeps_the_loop_busy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="slotless.triggerer")
    who = "airflow.providers.http.triggers.http.HttpSensorTrigger"
    watch, tries = await watched(spinning(1.5), who)
    assert tries > 100
    assert watch.busy[who] >= 1, watch.busy
    assert not watch.blocked  # it never held the loop past the block threshold
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"held trigger {who} ran on the event loop" in m for m in logged), logged


async def test_a_held_trigger_that_waits_between_tries_is_not_named() -> None:
    watch, _ = await watched(patient(15), "patient")
    assert not watch.busy


async def test_a_timed_awaitable_passes_cancellation_and_results_through() -> None:
    assert await timed(asyncio.sleep(0.01, result=7), "x") == 7

    async def waiting() -> None:
        await timed(asyncio.sleep(30), "x")

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert take()["x"] > 0
