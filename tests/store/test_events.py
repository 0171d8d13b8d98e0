"""Events on both backends: an event settles the waits it matches in its own transaction;
a wait that begins sees an event stored within its lookback; each wait moves once; bad
events store nothing; retention prunes; and on PostgreSQL, events and waits registering
at the same moment never miss each other."""

from __future__ import annotations

import asyncio
import json
from datetime import date
from typing import Any

import pytest
from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of, ops

from executor import DAG
from executor.outcomes import Deferred
from executor.rows import MovedTask
from executor.sensing import deferral
from executor.store import Store, open_store
from executor.store.events import MAX_BATCH, UNREADABLE, UnknownEvent, prune_events
from triggers.events import EventError, EventTrigger
from triggers.limits import MAX_DEPTH, MAX_PATH_SHOWN, MAX_SERIALIZED_BYTES

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 11, 24)


def noop(ctx: Any) -> None:
    return None


def waiting_dag(n: int, dag_id: str = "waits") -> DAG:
    """``n`` independent tasks, each to defer on an event, and a child after the first."""
    dag = DAG(dag_id)
    for i in range(n):
        dag.task(noop, task_id=f"w{i}")
    dag.task(noop, task_id="after", parents=["w0"])
    return dag


def wait_on(
    row: MovedTask, trigger: EventTrigger, now: float, method: str | None = None
) -> Deferred:
    d = deferral(trigger, method=method, method_kwargs={}, wait_started_at=now, timeout=3600.0)
    return Deferred(**attempt_of(row), deferral=d)


async def defer_all(
    store: Store, n: int, trigger_for: Any, now: float, *, method: str | None = None,
    dag_id: str = "waits",
) -> tuple[str, dict[str, int]]:  # fmt: skip
    """A run of ``n`` tasks, each DEFERRED on ``trigger_for(i)``; (run id, task id -> row)."""
    run_id = await store.runs.create_run(waiting_dag(n, dag_id), DAY)
    claimed = await claim(store, "w", n + 1)
    rows = {r.task_id: r for r in claimed}
    await complete(store, [wait_on(rows[f"w{i}"], trigger_for(i), now, method) for i in range(n)])
    return run_id, {t: r.id for t, r in rows.items()}


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)}


async def row(store: Store, run_id: str, task_id: str) -> dict[str, Any]:
    async with store.db.read() as tx:
        r = await tx.fetchone("task_row", run_id=run_id, task_id=task_id, map_index=-1)
    assert r is not None
    return dict(r)


async def count(store: Store, table: str) -> int:
    async with store.db.read() as tx:
        if table == "event":
            return len(await tx.fetch("recent_events", limit=1_000_000))
    raise AssertionError(table)


# ------------------------------------------------------------------------------- waking


async def test_an_event_after_the_wait_wakes_a_sensor_with_its_payload(
    store: Store, clock: FakeClock
) -> None:
    run_id, rows = await defer_all(
        store, 2, lambda i: EventTrigger(name="export.ready", match={"partner": f"p{i}"}), clock.now
    )
    assert (await states(store, run_id))["w0"] == "DEFERRED"
    # A triggerer never loads an event wait: nothing to check, only a timeout to keep.
    assert await ops(store).load_triggers(range(64)) == []
    clock.advance(5)
    sent = await store.events.send_event(
        "export.ready", {"partner": "p0", "url": "s3://x/1"}, source="t"
    )
    assert sent.woke == [rows["w0"]]
    woken = await row(store, run_id, "w0")
    assert woken["state"] == "SUCCESS"
    assert json.loads(woken["output"]) == {"partner": "p0", "url": "s3://x/1"}
    got = await states(store, run_id)
    assert got["w1"] == "DEFERRED" and got["after"] == "PENDING"
    # Its downstream became claimable in the same transaction.
    assert [r.task_id for r in await claim(store, "w", 10)] == ["after"]
    # Sent again: the wait has ended, nothing moves twice.
    assert (await store.events.send_event("export.ready", {"partner": "p0"})).woke == []
    [listed] = await store.events.list_events("export.ready", limit=1)
    assert listed.woke == []
    [first] = [e for e in await store.events.list_events("export.ready") if e.id == sent.id]
    assert [(w.task_id, w.run_id) for w in first.woke] == [("w0", run_id)]


async def test_an_event_resumes_a_task_that_deferred_with_a_method(
    store: Store, clock: FakeClock
) -> None:
    run_id, rows = await defer_all(
        store, 1, lambda i: EventTrigger(name="job.done", match={"job": 7}), clock.now,
        method="resume",
    )  # fmt: skip
    # Equality of JSON values: "7" and true are not 7.
    assert (await store.events.send_event("job.done", {"job": "7"})).woke == []
    assert (await store.events.send_event("job.done", {"job": True})).woke == []
    assert (await store.events.send_event("job.done", {"job": 7, "ok": 1})).woke == [rows["w0"]]
    woken = await row(store, run_id, "w0")
    assert woken["state"] == "PENDING" and woken["ready_at"] is not None
    assert json.loads(woken["event"]) == {"job": 7, "ok": 1}


async def test_an_event_sent_before_the_wait_counts_within_the_lookback(
    store: Store, clock: FakeClock
) -> None:
    dag = waiting_dag(3)
    run_id = await store.runs.create_run(dag, DAY)
    clock.advance(10)
    early = await store.events.send_event("export.ready", {"partner": "acme", "n": 1})
    newer = await store.events.send_event("export.ready", {"partner": "acme", "n": 2})
    assert early.woke == newer.woke == []
    clock.advance(2)  # sent 2 s before the sensors defer
    rows = {r.task_id: r for r in await claim(store, "w", 10)}
    await complete(
        store,
        [
            # Default lookback: since the run started -> the newest matching event.
            wait_on(
                rows["w0"], EventTrigger(name="export.ready", match={"partner": "acme"}), clock.now
            ),
            # A lookback of 1 s: the events are 2 s old -> it waits.
            wait_on(
                rows["w1"],
                EventTrigger(name="export.ready", match={"partner": "acme"}, lookback=1),
                clock.now,
            ),
            # Another partner: nothing stored matches.
            wait_on(
                rows["w2"], EventTrigger(name="export.ready", match={"partner": "other"}), clock.now
            ),
        ],
    )
    got = await states(store, run_id)
    assert (got["w0"], got["w1"], got["w2"]) == ("SUCCESS", "DEFERRED", "DEFERRED")
    assert json.loads((await row(store, run_id, "w0"))["output"])["n"] == 2
    async with store.db.read() as tx:
        log = [e["message"] for e in await tx.fetch("task_events", task_row=rows["w0"].id)]
    assert any("2.0 s before the wait began" in m for m in log), log
    [ev] = [e for e in await store.events.list_events("export.ready") if e.id == newer.id]
    assert [w.task_id for w in ev.woke] == ["w0"]


async def test_an_event_wakes_a_task_once_even_when_it_waits_again(
    store: Store, clock: FakeClock
) -> None:
    """A task that waits on the same event again does not see the event that woke it."""
    trigger = EventTrigger(name="tick", match={})
    run_id, rows = await defer_all(store, 1, lambda i: trigger, clock.now, method="again")
    await store.events.send_event("tick", {"n": 1})
    [again] = [r for r in await claim(store, "w", 10) if r.task_id == "w0"]
    await complete(store, [wait_on(again, trigger, clock.now, method="again")])
    assert (await row(store, run_id, "w0"))["state"] == "DEFERRED"
    assert (await store.events.send_event("tick", {"n": 2})).woke == [rows["w0"]]


async def test_a_thousand_waits_on_ten_matches_each_woken_once(
    store: Store, clock: FakeClock
) -> None:
    pairs = 10
    per = 100
    run_id, rows = await defer_all(
        store, pairs * per,
        lambda i: EventTrigger(name="batch.ready", match={"batch": i % pairs, "kind": "x"}),
        clock.now,
    )  # fmt: skip
    woke: dict[int, list[int]] = {}
    for b in range(pairs):
        sent = await store.events.send_event("batch.ready", {"batch": b, "kind": "x", "extra": [b]})
        woke[b] = sent.woke
        got = await states(store, run_id)
        for i in range(pairs * per):
            expected = "SUCCESS" if i % pairs <= b else "DEFERRED"
            assert got[f"w{i}"] == expected, (b, i)
    for b in range(pairs):
        assert sorted(woke[b]) == sorted(rows[f"w{i}"] for i in range(b, pairs * per, pairs))
    # Each exactly once: one SUCCESS transition per wait.
    async with store.db.read() as tx:
        for i in (0, 1, 999):
            moves = [e for e in await tx.fetch("task_events", task_row=rows[f"w{i}"])
                     if e["to_state"] == "SUCCESS"]  # fmt: skip
            assert len(moves) == 1
    # The settled waits' trigger rows went with them: the index holds only live waits.
    assert await ops(store).load_triggers(range(64)) == []


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("name", "payload", "field"),
    [
        ("", {}, "name"),
        ("has space", {}, "name"),
        (".starts-with-dot", {}, "name"),
        ("x" * 201, {}, "name"),
        ("ok", {"n": float("nan")}, "payload.n"),
        ("ok", {"n": object()}, "payload.n"),
        ("ok", {"blob": "x" * MAX_SERIALIZED_BYTES}, "payload"),
    ],
)
async def test_a_bad_event_is_refused_naming_the_field_and_nothing_is_stored(
    store: Store, name: str, payload: Any, field: str
) -> None:
    with pytest.raises(EventError) as info:
        await store.events.send_event(name, payload)
    assert info.value.field == field
    assert info.value.too_large == (field == "payload" and "blob" in payload)
    assert await count(store, "event") == 0


def nested(depth: int) -> Any:
    """A list ``depth`` levels deep, built without recursion."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "field", "says"),
    [
        (nested(MAX_DEPTH + 1), "payload[0]", "deeper than"),
        (nested(990), "payload[0]", "deeper than"),
        (nested(100_000), "payload[0]", "deeper than"),
        ({"a": {"b": "\ud800"}}, "payload.a.b", "lone surrogate"),
        ({"\udfff": 1}, "payload", "lone surrogate"),
        ({"n": float("inf")}, "payload.n", "finite"),
        ({1: "x"}, "payload", "not text"),
        ({"s": {1, 2}}, "payload.s", "not JSON"),
    ],
)  # fmt: skip
async def test_a_payload_no_reader_could_serve_is_refused_by_the_store(
    store: Store, payload: Any, field: str, says: str
) -> None:
    """The Python API meets the same check as the CLI and the API: one, in the store."""
    with pytest.raises(EventError) as info:
        await store.events.send_event("deep", payload)
    assert info.value.field.startswith(field) and says in str(info.value), info.value
    assert len(info.value.field) <= MAX_PATH_SHOWN and len(str(info.value)) < 400
    assert await count(store, "event") == 0
    assert (await store.events.send_event("deep", nested(MAX_DEPTH))).id > 0  # the limit: taken


async def test_a_stored_row_no_reader_could_serve_still_lists(
    store: Store, clock: FakeClock
) -> None:
    """A row written behind the store's back (by hand, by an older version) must not make
    every listing fail for the whole retention: it reads as a note saying so."""
    deep = "[" * 990 + "]" * 990
    odd = '{"x":"\\ud800"}'  # JSON text of a lone surrogate
    async with store.db.write() as tx:
        await tx.fetch(
            "store_events",
            events=json.dumps([["deep", deep], ["odd", odd], ["fine", '{"a":1}']]),
            now=clock.now,
            source="by hand",
        )
    listed = {e.name: e.payload for e in await store.events.list_events()}
    assert listed["fine"] == {"a": 1}
    assert UNREADABLE in listed["deep"] and UNREADABLE in listed["odd"], listed
    for e in await store.events.list_events():
        assert (await store.events.get_event(e.id)).payload == listed[e.name]
    json.dumps(listed)  # servable as it is


async def test_one_bad_event_refuses_its_whole_batch(store: Store) -> None:
    with pytest.raises(EventError) as info:
        await store.events.send_events([("a", 1), ("b c", 2)])
    assert info.value.field == "events[1].name"
    with pytest.raises(EventError):
        await store.events.send_events([("a", i) for i in range(MAX_BATCH + 1)])
    assert await count(store, "event") == 0
    assert len(await store.events.send_events([("a", i) for i in range(3)])) == 3


async def test_listing_an_unknown_name_is_an_error(store: Store, clock: FakeClock) -> None:
    with pytest.raises(UnknownEvent):
        await store.events.list_events("never.sent")
    # A name that a wait is on, but with no event yet, is known: an empty list.
    await defer_all(store, 1, lambda i: EventTrigger(name="soon"), clock.now)
    assert await store.events.list_events("soon") == []


# ---------------------------------------------------------------------------- retention


async def test_events_past_their_retention_are_pruned_in_batches(
    store: Store, clock: FakeClock
) -> None:
    await store.events.send_events([("old", i) for i in range(25)])
    clock.advance(100)
    kept = await store.events.send_event("new", 1)
    assert await prune_events(store.db, before=clock.now - 50, batch=10) == 25
    assert [e.id for e in await store.events.list_events()] == [kept.id]
    # Through the triggerer's store, as its minutely cleanup calls it.
    clock.advance(100)
    assert await ops(store).prune_events(retention=50) == 1
    assert await store.events.list_events() == []


# ---------------------------------------------------------------------- the race, on PG


async def test_events_and_waits_racing_never_miss_each_other(
    url: str, backend: str, clock: FakeClock
) -> None:
    """Waits begin on several connections while their events are sent on others: every
    wait ends SUCCESS, whichever committed first (the lookback or the event's lookup)."""
    n = 40
    opened = [await open_store(url, clock=clock) for _ in range(4)]
    try:
        a, b, c, d = opened
        run_id = await a.runs.create_run(waiting_dag(n), DAY)
        rows = {r.task_id: r for r in await claim(a, "w", n + 1)}

        async def defer(i: int, s: Store) -> None:
            trigger = EventTrigger(name="race", match={"i": i})
            await complete(s, [wait_on(rows[f"w{i}"], trigger, clock.now)])

        async def send(i: int, s: Store) -> None:
            await s.events.send_event("race", {"i": i})

        jobs = []
        for i in range(n):
            jobs.append(defer(i, a if i % 2 else b))
            jobs.append(send(i, c if i % 2 else d))
        await asyncio.gather(*jobs)
        got = await states(a, run_id)
        assert {got[f"w{i}"] for i in range(n)} == {"SUCCESS"}, got
        total = sum(len(e.woke) for e in await a.events.list_events("race", limit=1000))
        assert total == n
    finally:
        for s in opened:
            await s.close()


async def test_the_race_widened_on_postgresql_is_still_not_lost(
    url: str, backend: str, clock: FakeClock
) -> None:
    """Each side made slow between its write and its look for the other (0.3 s sleeps in
    table triggers): without the name lock both would look before the other commits and
    the wait would sit until its timeout."""
    if backend.startswith("sqlite"):
        pytest.skip("SQLite serializes every write transaction: there is no window to widen")
    import asyncpg

    a = await open_store(url, clock=clock)  # migrated first
    b = await open_store(url, clock=clock)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            CREATE FUNCTION slow_down() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$;
            CREATE TRIGGER slow_event AFTER INSERT ON event
                FOR EACH ROW EXECUTE FUNCTION slow_down();
            CREATE TRIGGER slow_wait AFTER INSERT ON trigger
                FOR EACH ROW WHEN (NEW.event_key IS NOT NULL) EXECUTE FUNCTION slow_down();
            """
        )
    finally:
        await conn.close()
    try:
        run_id = await a.runs.create_run(waiting_dag(2), DAY)
        rows = {r.task_id: r for r in await claim(a, "w", 10)}

        async def defer(i: int, delay: float) -> None:
            await asyncio.sleep(delay)
            trigger = EventTrigger(name=f"slow{i}", match={"i": i})
            await complete(a, [wait_on(rows[f"w{i}"], trigger, clock.now)])

        async def send(i: int, delay: float) -> None:
            await asyncio.sleep(delay)
            await b.events.send_event(f"slow{i}", {"i": i})

        # The event first, the wait 0.1 s into its sleep; then the other way round (a name
        # of its own each, so that the wait's field set is new to the event's writer).
        await asyncio.gather(send(0, 0.0), defer(0, 0.1))
        await asyncio.gather(defer(1, 0.0), send(1, 0.1))
        got = await states(a, run_id)
        assert (got["w0"], got["w1"]) == ("SUCCESS", "SUCCESS"), got
    finally:
        await a.close()
        await b.close()
