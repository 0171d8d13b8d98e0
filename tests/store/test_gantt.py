"""A run's Gantt chart on both backends: its segments are the recorded times of each
attempt and wait. A task that failed, waited to retry and succeeded has two running
segments (attempts 1 and 2) with the retry's wait between them; a deferred task shows its
deferred segment and its wait for a slot after the event; a task waits for a slot from
when its upstream ended; a mapped task's instances are grouped under it; a task still
going has an open segment up to the time the chart was read."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of

from executor import DAG
from executor.outcomes import Deferred, Failed, Succeeded
from executor.sensing import deferral
from executor.store import Store
from executor.store.runlist import Gantt, GanttRow, Segment, segments
from triggers.events import EventTrigger

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 11, 24)


def noop(ctx: Any) -> None:
    return None


def the_dag() -> DAG:
    dag = DAG("gantt")
    dag.task(noop, task_id="flaky", retries=1)
    dag.task(noop, task_id="waits")
    dag.task(noop, task_id="after", parents=["flaky"])
    dag.task(noop, task_id="items", parents=["waits"])
    dag.task(noop, task_id="each", expand="items")
    return dag


def row_of(chart: Gantt, task_id: str, map_index: int = -1) -> GanttRow:
    task = next(t for t in chart.tasks if t.row.task_id == task_id)
    return task.row if map_index < 0 else task.instances[map_index]


def spans(row: GanttRow) -> list[tuple[str, float, float, int | None, bool]]:
    return [(s.kind, s.start, s.end, s.attempt, s.open) for s in row.segments]


async def test_attempts_waits_and_instances_are_their_recorded_times(
    store: Store, clock: FakeClock
) -> None:
    t0 = clock()
    run_id = await store.runs.create_run(the_dag(), DAY)
    clock.advance(2)  # two seconds waiting for a slot
    rows = {r.task_id: r for r in await claim(store, "w", 10)}
    assert set(rows) == {"flaky", "waits"}
    t_claim = clock()
    clock.advance(3)
    wait = deferral(
        EventTrigger(name="go", match={}), method="resume", method_kwargs={},
        wait_started_at=clock(), timeout=3600.0,
    )  # fmt: skip
    await complete(
        store,
        [
            Failed(**attempt_of(rows["flaky"]), message="first try", retry_delay=5.0),
            Deferred(**attempt_of(rows["waits"]), deferral=wait),
        ],
    )
    t_fail = clock()
    clock.advance(6)  # the retry is due after 5 s, claimed after 6
    [again] = await claim(store, "w", 10)
    assert again.task_id == "flaky" and again.attempt == 2
    t_retry = clock()
    clock.advance(4)
    await complete(store, [Succeeded(**attempt_of(again))])
    t_ok = clock()
    clock.advance(1)
    await store.events.send_events([("go", {})])  # the deferred task resumes: PENDING
    t_event = clock()

    chart = await store.runlist.gantt(run_id)
    assert chart is not None and chart.live and chart.start == t0
    assert (chart.dag_id, chart.logical) == ("gantt", "2026-11-24")
    # flaky: queued from the run's start, attempt 1, the retry's wait, attempt 2.
    assert spans(row_of(chart, "flaky")) == [
        ("queued", t0, t_claim, None, False),
        ("running", t_claim, t_fail, 1, False),
        ("retrying", t_fail, t_retry, None, False),
        ("running", t_retry, t_ok, 2, False),
    ]
    assert [s.ended_as for s in row_of(chart, "flaky").segments] == [
        "RUNNING", "RETRYING", "RUNNING", "SUCCESS"
    ]  # fmt: skip
    # waits: ran, deferred until the event, then waits for a slot (open: not claimed yet).
    assert spans(row_of(chart, "waits")) == [
        ("queued", t0, t_claim, None, False),
        ("running", t_claim, t_fail, 1, False),
        ("deferred", t_fail, t_event, None, False),
        ("queued", t_event, chart.now, None, True),
    ]
    # after: claimable once flaky succeeded, not before, and not claimed yet.
    assert spans(row_of(chart, "after")) == [("queued", t_ok, chart.now, None, True)]
    assert spans(row_of(chart, "items")) == []  # its upstream has not ended

    # The rest of the run: waits resumes and ends, items returns three, each expands.
    clock.advance(2)
    [w] = await claim(store, "w", 1)
    assert w.task_id in ("waits", "after")
    rest = [w, *await claim(store, "w", 10)]
    await complete(store, [Succeeded(**attempt_of(r)) for r in rest])
    [items] = await claim(store, "w", 10)
    assert items.task_id == "items"
    await complete(store, [Succeeded(**attempt_of(items), output_json=json.dumps([1, 2, 3]))])
    t_items = clock()
    clock.advance(1)
    instances = await claim(store, "w", 10)
    assert sorted(i.map_index for i in instances) == [0, 1, 2]
    t_each = clock()
    clock.advance(2)
    await complete(store, [Succeeded(**attempt_of(i)) for i in instances])
    t_end = clock()

    chart = await store.runlist.gantt(run_id)
    assert chart is not None and not chart.live and chart.state == "SUCCESS"
    assert chart.end == t_end
    each = next(t for t in chart.tasks if t.row.task_id == "each")
    assert [i.map_index for i in each.instances] == [0, 1, 2] and each.hidden == 0
    for i in each.instances:  # each instance: claimable when items ended, then its attempt
        assert spans(i) == [
            ("queued", t_items, t_each, None, False),
            ("running", t_each, t_end, 1, False),
        ]
    assert not any(s.open for t in chart.tasks for r in (t.row, *t.instances) for s in r.segments)
    # A chart with fewer instances drawn counts the rest.
    small = await store.runlist.gantt(run_id, instances=2)
    assert small is not None
    each = next(t for t in small.tasks if t.row.task_id == "each")
    assert len(each.instances) == 2 and each.hidden == 1


async def test_no_such_run(store: Store) -> None:
    assert await store.runlist.gantt("nope") is None
    assert await store.runlist.gantt("a\x00b") is None


def test_segment_seconds() -> None:
    assert Segment("running", 10.0, 12.5, 1).seconds == 2.5


def test_a_row_that_ended_unclaimed_draws_no_wait() -> None:
    """Skipped (a cancel, a branch) or failed upstream while PENDING: it may never have
    been claimable, so nothing is drawn for it; a claimed row waited from ``ready``."""

    def ev(ts: float, a: str, b: str, attempt: int = 1) -> dict[str, Any]:
        return {"ts": ts, "from_state": a, "to_state": b, "attempt": attempt}

    for end in ("SKIPPED", "UPSTREAM_FAILED", "SUCCESS"):
        assert segments([ev(9.0, "PENDING", end)], ready=1.0, state=end, ready_at=None,
                        now=10.0) == []  # fmt: skip
    claimed = segments([ev(5.0, "PENDING", "RUNNING")], ready=2.0, state="RUNNING",
                       ready_at=None, now=7.0)  # fmt: skip
    assert [(s.kind, s.start, s.end, s.open) for s in claimed] == [
        ("queued", 2.0, 5.0, False), ("running", 5.0, 7.0, True)
    ]  # fmt: skip
    # Never moved: claimable (ready_at set) is queued up to now; not yet, nothing.
    assert [(s.kind, s.start, s.open) for s in segments([], ready=0.0, state="PENDING",
            ready_at=3.0, now=4.0)] == [("queued", 3.0, True)]  # fmt: skip
    assert segments([], ready=0.0, state="PENDING", ready_at=None, now=4.0) == []
