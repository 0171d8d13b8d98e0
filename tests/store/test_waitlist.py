"""The waits page's reads (executor/store/waitlist.py) and the triggerers' samples
(triggerer/sampling.py through TriggererStore.triggerer_beat), on SQLite and PostgreSQL.

Waits are written behind the store's back (as support.triggers.write_flag_waits does): two
tasks of different DAGs on two trigger rows with one poke hash are one condition with two
waiters; an event wait and a finished task are not conditions being checked.
"""

from __future__ import annotations

import pytest
from support import backends
from support.helpers import FakeClock

from executor.store import Store
from executor.store.waitlist import FIRST_WAITERS, WaitFilter
from triggerer.sampling import KEPT, Gauges, Sampler
from triggerer.store import TriggererStore

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture

FILE = "triggers.files.FileTrigger"
TIME = "triggers.temporal.DateTimeTrigger"
NOW = 1_000_000.0  # FakeClock's start
A5 = '{"path": "/in/a", "poke_interval": 5}'
A9 = '{"path": "/in/a", "poke_interval": 9}'


async def _sql(store: Store, *statements: str) -> None:
    async with store.db.write() as tx:
        for s in statements:
            await tx.script(s)


async def _waits(store: Store) -> None:
    """hA: t1 (DAG d1, since NOW-900, timeout at NOW+300: 75% used) and t2 (DAG d2, since
    NOW-100, timeout at NOW+200: the nearest, a third used); hB: t3 (d1, since NOW-100, no
    timeout); an event wait (t4) and a finished task on hA's row (t5) are not counted."""
    n = NOW
    await _sql(
        store,
        "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at, tasks_unfinished)"
        " VALUES ('r1', 'd1', '2026-01-01', 'RUNNING', 0, 3),"
        " ('r2', 'd2', '2026-01-01', 'RUNNING', 0, 1)",
        "INSERT INTO trigger (id, classpath, kwargs, poke_hash, shard, created_at, event_key,"
        " description) VALUES"
        f" (1, '{FILE}', '{A5}', 'hA', 5, 0, NULL, 'file /in/a'),"
        f" (2, '{FILE}', '{A9}', 'hA', 5, 0, NULL, 'file /in/a'),"
        f" (3, '{TIME}', '{{\"moment\": \"2030-01-01T00:00:00+00:00\"}}', 'hB', 7, 0, NULL, 'at'),"
        f" (4, 'triggers.events.EventTrigger', '{{}}', 'hE', 9, 0, 'ev', 'event')",
        "INSERT INTO task (id, run_id, task_id, state, trigger_rule, updated_at, trigger_id,"
        " wait_started_at, wait_timeout_at) VALUES"
        f" (1, 'r1', 't1', 'DEFERRED', 'all_success', 0, 1, {n - 900}, {n + 300}),"
        f" (2, 'r2', 't2', 'DEFERRED', 'all_success', 0, 2, {n - 100}, {n + 200}),"
        f" (3, 'r1', 't3', 'DEFERRED', 'all_success', 0, 3, {n - 100}, NULL),"
        f" (4, 'r1', 't4', 'DEFERRED', 'all_success', 0, 4, {n - 50}, NULL),"
        f" (5, 'r1', 't5', 'SUCCESS', 'all_success', 0, 1, {n - 999}, {n + 1})",
        "INSERT INTO task_event (task_row, ts, kind, message) VALUES"
        f" (1, {n - 60}, 'check', 'checked file /in/a: not yet; next in 5 s'),"
        f" (1, {n - 30}, 'check', 'checked file /in/a: not yet; next in 5 s (2)'),"
        f" (1, {n - 10}, 'log', 'not a check')",
        f"UPDATE shard_lease SET owner = 'trig-a', expires_at = {n + 10} WHERE shard = 5",
    )


async def test_tasks_sharing_a_check_are_one_condition(store: Store) -> None:
    await _waits(store)
    page = await store.waitlist.conditions(WaitFilter())
    assert (page.conditions, page.waits) == (2, 3)
    a, b = page.groups  # most waiters first
    assert (a.poke_hash, a.waiters, a.shard, a.classpath) == ("hA", 2, 5, FILE)
    assert a.since == NOW - 900
    # The nearest timeout is t2's (NOW+200): 100 of its 300 s used; t1 has used more of its
    # own (900 of 1200 s), which worst_share says.
    assert a.timeout_at == NOW + 200
    assert a.timeout_share == pytest.approx(1 / 3)
    assert a.worst_share == pytest.approx(0.75)
    assert [(w.dag_id, w.task_id) for w in a.first] == [("d1", "t1"), ("d2", "t2")]
    assert a.more == 0
    assert (a.owner, a.lease_expires_at) == ("trig-a", NOW + 10)
    assert a.last_check_at == NOW - 30 and a.last_check is not None
    assert a.last_check.endswith("(2)")  # the newest check line, not the log line after it
    assert a.description == "file /in/a"
    assert (b.poke_hash, b.waiters, b.timeout_at, b.timeout_share) == ("hB", 1, None, None)
    assert b.owner is None and b.last_check_at is None


async def test_filters_by_class_and_dag(store: Store) -> None:
    await _waits(store)
    by_dag = await store.waitlist.conditions(WaitFilter(dag_id="d2"))
    assert [(g.poke_hash, g.waiters) for g in by_dag.groups] == [("hA", 1)]
    assert (by_dag.conditions, by_dag.waits) == (1, 1)
    assert [w.task_id for w in by_dag.groups[0].first] == ["t2"]
    by_class = await store.waitlist.conditions(WaitFilter(classpath=TIME))
    assert [g.poke_hash for g in by_class.groups] == ["hB"]
    both = await store.waitlist.conditions(WaitFilter(classpath=TIME, dag_id="d2"))
    assert (both.groups, both.conditions, both.waits) == ([], 0, 0)
    events = await store.waitlist.conditions(WaitFilter(classpath="triggers.events.EventTrigger"))
    assert events.groups == []  # never checked by a triggerer: not on the page


async def test_pages_and_orders(store: Store) -> None:
    await _waits(store)
    first = await store.waitlist.conditions(WaitFilter(limit=1))
    assert [g.poke_hash for g in first.groups] == ["hA"]
    assert (first.conditions, first.waits) == (2, 3)  # what the page leaves out, counted
    oldest_first = await store.waitlist.conditions(WaitFilter(order="oldest"))
    assert [g.poke_hash for g in oldest_first.groups] == ["hA", "hB"]
    with pytest.raises(ValueError):
        await store.waitlist.conditions(WaitFilter(limit=0))


async def test_many_waiters_list_the_first_few(store: Store) -> None:
    n = FIRST_WAITERS + 7
    await _sql(
        store,
        "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at, tasks_unfinished)"
        " VALUES ('r1', 'd1', '2026-01-01', 'RUNNING', 0, 1)",
        f"INSERT INTO trigger (id, classpath, kwargs, poke_hash, shard, created_at) VALUES"
        f" (1, '{FILE}', '{{\"path\": \"/in/x\"}}', 'hX', 1, 0)",
        "INSERT INTO task (run_id, task_id, state, trigger_rule, updated_at, trigger_id) "
        f"WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < {n}) "
        "SELECT 'r1', 'm' || i, 'DEFERRED', 'all_success', 0, 1 FROM k",
    )
    (g,) = (await store.waitlist.conditions(WaitFilter())).groups
    assert (g.waiters, len(g.first), g.more) == (n, FIRST_WAITERS, 7)


class _Counters:
    def __init__(self) -> None:
        self.done = 0
        self.t = 0.0


async def test_samples_are_kept_an_hour(store: Store, clock: FakeClock) -> None:
    """A sample per period at the heartbeat, never per beat; the rows older than an hour go
    in the same transaction, so the table stays at an hour of rows per triggerer."""
    c = _Counters()
    ops = TriggererStore(store.db, clock)
    ops.sampler = Sampler(
        Gauges(
            checks_done=lambda: c.done,
            lags=lambda: (0.002, 0.010),
            waits=lambda: 40,
            checks=lambda: 20,
            shards=lambda: 64,
        ),
        every=30.0,
        clock=lambda: c.t,
    )

    async def rows() -> list[tuple[float, float]]:
        async with store.db.read() as tx:
            found = await tx.fetch("triggerer_samples", since=0)
        return [(r["at"], r["checks_per_s"]) for r in found]

    for _beat in range(2 * 1200 + 1):  # two hours of beats every 3 s
        await ops.triggerer_beat("t1", 40, 2.0)
        c.t += 3.0
        c.done += 300  # 100 checks a second
        clock.advance(3.0)
    kept = await rows()
    assert len(kept) <= KEPT / 30 + 1
    assert min(at for at, _ in kept) >= clock() - 3 - KEPT
    assert kept[-1][1] == pytest.approx(100.0)
    history = await store.waitlist.triggerers()
    (t,) = history
    assert (t.id, t.listed, t.waits) == ("t1", True, 40)
    assert t.samples[-1].shards == 64 and t.samples[-1].lag_max_ms == pytest.approx(10.0)


async def test_grouped_query_over_many_waits_of_many_dags(store: Store) -> None:
    """The page's reads over 10,000 waits (5,000 conditions, two waiters each, over 100
    DAGs): a page of 50 conditions, every wait counted, each filter. Its speed at 100,000
    waits is measured, not asserted here (docs/operations.md gives the times measured)."""
    n = 10_000
    await _sql(
        store,
        "INSERT INTO dag_run (run_id, dag_id, logical_date, state, created_at, tasks_unfinished) "
        "WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i < 99) "
        "SELECT 'r' || i, 'd' || i, '2026-01-01', 'RUNNING', 0, 1000 FROM k",
        "INSERT INTO trigger (id, classpath, kwargs, poke_hash, shard, created_at) "
        f"WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < {n}) "
        f"SELECT i, '{FILE}', '{{\"path\": \"/in/' || (i % {n // 2}) || '\"}}', "
        f"'h' || (i % {n // 2}), (i % {n // 2}) % 64, 0 FROM k",
        "INSERT INTO task (run_id, task_id, state, trigger_rule, updated_at, trigger_id, "
        "wait_started_at, wait_timeout_at) "
        f"SELECT 'r' || (g.id % 100), 'w' || g.id, 'DEFERRED', 'all_success', 0, g.id, "
        f"{NOW} - g.id, {NOW} + g.id FROM trigger g",
    )
    for name, f in [
        ("all", WaitFilter()),
        ("oldest", WaitFilter(order="oldest")),
        ("dag", WaitFilter(dag_id="d7")),
        ("class", WaitFilter(classpath=FILE)),
    ]:
        page = await store.waitlist.conditions(f)
        assert len(page.groups) == 50
        assert page.waits == (n if name != "dag" else n // 100)


def test_a_sample_not_written_is_taken_again_over_the_longer_span() -> None:
    c = _Counters()
    sampler = Sampler(
        Gauges(
            checks_done=lambda: c.done,
            lags=lambda: (0.0, 0.0),
            waits=lambda: 0,
            checks=lambda: 0,
            shards=lambda: 0,
        ),
        every=30.0,
        clock=lambda: c.t,
    )
    assert sampler.take() is not None  # the first beat samples at once
    c.t, c.done = 10.0, 100
    assert sampler.take() is None  # not due: nothing to write
    c.t, c.done = 30.0, 300
    lost = sampler.take()
    assert lost is not None and lost.checks_per_s == pytest.approx(10.0)
    sampler.put_back()  # its beat failed
    c.t, c.done = 33.0, 600
    again = sampler.take()
    assert again is not None and again.checks_per_s == pytest.approx(600 / 33)
