"""The runs list on both backends: each filter alone and together, the logical date's
range, the text search taken literally (``%``, ``_`` and ``\\`` are not wildcards), keyset
paging that visits every run exactly once either way, and bad filters refused by name."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from support import backends
from support.exchanging import claim, complete
from support.helpers import FakeClock, attempt_of

from executor import DAG
from executor.outcomes import Failed, Succeeded
from executor.runnames import RunType
from executor.store import Store
from executor.store.runlist import BadFilter, Cursor, ListedRun, RunFilter, like_pattern

backend, url, store = backends.backend, backends.url, backends.store  # fixtures
pg_server = backends.pg_server  # fixture
DAY = date(2026, 11, 1)


def one_task(dag_id: str) -> DAG:
    dag = DAG(dag_id)

    @dag.task
    def only(ctx: Any) -> None:
        return None

    return dag


async def make_runs(store: Store, clock: FakeClock) -> list[dict[str, Any]]:
    """Twelve runs of three DAGs, a second apart, of every type, on four logical dates;
    some ended SUCCESS or FAILED. Returns what each is, oldest first."""
    made = []
    types = [RunType.MANUAL, RunType.SCHEDULED, RunType.BACKFILL, RunType.EVENT]
    for i in range(12):
        dag_id = ("alpha", "beta", "gamma")[i % 3]
        day = DAY + timedelta(days=i // 3)
        kind = types[i % 4]
        key = f"key_{i}%" if i == 5 else f"k{i:02d}-{dag_id}"
        started = await store.runs.start_run(one_task(dag_id), day, run_key=key, run_type=kind)
        made.append(
            {"run_id": started.run_id, "dag_id": dag_id, "day": day, "type": kind.value,
             "key": key, "state": "RUNNING", "created_at": clock()}
        )  # fmt: skip
        clock.advance(1)
    # End some: run 0 and 6 succeed, 3 and 9 fail; the rest stay RUNNING.
    ends = {0: "SUCCESS", 6: "SUCCESS", 3: "FAILED", 9: "FAILED"}
    for row in await claim(store, "w", 100):
        i = next(n for n, m in enumerate(made) if m["run_id"] == row.run_id)
        if i in ends:
            outcome = (
                Succeeded(**attempt_of(row))
                if ends[i] == "SUCCESS"
                else Failed(**attempt_of(row), message="boom")
            )
            await complete(store, [outcome])
            made[i]["state"] = ends[i]
    return made


def ids(runs: list[ListedRun]) -> list[str]:
    return [r.run_id for r in runs]


def newest_first(made: list[dict[str, Any]], keep: Any = lambda m: True) -> list[str]:
    return [m["run_id"] for m in reversed(made) if keep(m)]


async def test_each_filter_alone_and_together(store: Store, clock: FakeClock) -> None:
    made = await make_runs(store, clock)
    page = await store.runlist.runs_page()
    assert ids(page.runs) == newest_first(made)
    assert page.older is None and page.newer is None
    first = page.runs[-1]
    assert first.counts == {"SUCCESS": 1} and first.run_type == "manual"
    assert first.logical == "2026-11-01" and first.logical_date == "2026-11-01"
    assert first.started_at is not None and first.duration(page.now) is not None
    assert page.runs[0].counts == {"RUNNING": 1} and page.runs[0].ended_at is None

    async def found(**kw: Any) -> list[str]:
        return ids((await store.runlist.runs_page(RunFilter(**kw))).runs)

    assert await found(dags=("beta",)) == newest_first(made, lambda m: m["dag_id"] == "beta")
    assert await found(dags=("beta", "gamma")) == newest_first(
        made, lambda m: m["dag_id"] in ("beta", "gamma")
    )
    assert await found(states=("FAILED",)) == newest_first(made, lambda m: m["state"] == "FAILED")
    assert await found(states=("SUCCESS", "FAILED")) == newest_first(
        made, lambda m: m["state"] != "RUNNING"
    )
    assert await found(types=("backfill",)) == newest_first(made, lambda m: m["type"] == "backfill")
    assert await found(from_day=DAY + timedelta(days=1), to_day=DAY + timedelta(days=2)) == (
        newest_first(made, lambda m: DAY + timedelta(days=1) <= m["day"] <= DAY + timedelta(days=2))
    )
    assert await found(from_day=DAY + timedelta(days=3)) == newest_first(
        made, lambda m: m["day"] >= DAY + timedelta(days=3)
    )
    assert await found(to_day=DAY) == newest_first(made, lambda m: m["day"] == DAY)
    # The text is found in the run id (a DAG's id is part of it) or the run key, any case.
    assert await found(text="K07-") == [made[7]["run_id"]]
    assert await found(text="GAMMA") == newest_first(made, lambda m: m["dag_id"] == "gamma")
    # Together: every filter must hold.
    assert await found(
        dags=("alpha", "gamma"), states=("RUNNING", "FAILED"), types=("event", "backfill"),
        from_day=DAY + timedelta(days=1),
    ) == newest_first(
        made,
        lambda m: m["dag_id"] in ("alpha", "gamma") and m["state"] in ("RUNNING", "FAILED")
        and m["type"] in ("event", "backfill") and m["day"] >= DAY + timedelta(days=1),
    )  # fmt: skip
    assert await found(dags=("beta",), states=("FAILED",), text="k") == newest_first(
        made, lambda m: m["dag_id"] == "beta" and m["state"] == "FAILED"
    )
    assert await found(dags=("nosuch",)) == []
    assert await found(states=("CANCELLED",)) == []


async def test_search_takes_wildcards_literally(store: Store, clock: FakeClock) -> None:
    made = await make_runs(store, clock)
    run = await store.runs.start_run(one_task("alpha"), DAY, run_key="a\\b_c")

    async def found(text: str) -> list[str]:
        return ids((await store.runlist.runs_page(RunFilter(text=text))).runs)

    assert await found("%") == [made[5]["run_id"]]  # only the key with a literal %
    assert await found("y_5%") == [made[5]["run_id"]]
    assert await found("_") == [run.run_id, made[5]["run_id"]]  # "_" only where it is
    assert await found("a\\b_c") == [run.run_id]
    assert await found("a\\b%c") == []
    assert await found("k0_-") == []  # "_" is not "any one character"
    assert await found("%%") == []
    assert like_pattern("50%_a\\") == "%50\\%\\_a\\\\%"


@pytest.mark.parametrize("size", [1, 5, 12, 50])
async def test_keyset_paging_visits_every_run_once(
    store: Store, clock: FakeClock, size: int
) -> None:
    made = await make_runs(store, clock)
    # Two runs created at the same instant: run_id breaks the tie, neither is lost.
    a = await store.runs.start_run(one_task("alpha"), DAY, run_key="same-a")
    b = await store.runs.start_run(one_task("beta"), DAY, run_key="same-b")
    everything = [*sorted([a.run_id, b.run_id], reverse=True), *newest_first(made)]

    seen: list[str] = []
    pages = []
    page = await store.runlist.runs_page(limit=size)
    while True:
        pages.append(page)
        seen += ids(page.runs)
        if page.older is None:
            break
        page = await store.runlist.runs_page(limit=size, before=page.older)
    assert seen == everything  # each once, in order
    assert len(pages) == -(-len(everything) // size)
    assert all(len(p.runs) == size for p in pages[:-1])
    # And back up with the newer cursors: the same pages, newest first within each.
    back: list[list[str]] = []
    page = pages[-1]
    while page.newer is not None:
        page = await store.runlist.runs_page(limit=size, after=page.newer)
        back.append(ids(page.runs))
    assert back == [ids(p.runs) for p in reversed(pages[:-1])]

    # Filtered paging too, two at a time, through each way the runs are found.
    for which in [
        RunFilter(dags=("alpha", "gamma"), states=("RUNNING",)),
        RunFilter(from_day=DAY, to_day=DAY + timedelta(days=2), types=("manual", "event")),
        RunFilter(from_day=DAY + timedelta(days=1), text="K"),
    ]:
        want = (await store.runlist.runs_page(which, limit=500)).runs
        seen, cursor = [], None
        while True:
            page = await store.runlist.runs_page(which, limit=2, before=cursor)
            seen += ids(page.runs)
            if (cursor := page.older) is None:
                break
        assert seen == ids(want) and len(seen) == len(set(seen)) and len(seen) > 2, which


async def test_a_cursor_reads_back_exactly(store: Store, clock: FakeClock) -> None:
    await make_runs(store, clock)
    run = (await store.runlist.runs_page(limit=1)).runs[0]
    text = run.cursor.text()
    assert Cursor.parse(text, "before") == run.cursor
    older = await store.runlist.runs_page(limit=100, before=Cursor.parse(text, "before"))
    assert run.run_id not in ids(older.runs) and len(older.runs) == 11


async def test_bad_filters_name_their_field(store: Store) -> None:
    for make, field in [
        (lambda: RunFilter(states=("NOPE",)), "state"),
        (lambda: RunFilter(types=("cron",)), "type"),
        (lambda: RunFilter(from_day=DAY, to_day=DAY - timedelta(days=1)), "from"),
        (lambda: RunFilter(text="x" * 201), "q"),
        (lambda: RunFilter(text="a\x00b"), "q"),
        (lambda: RunFilter(dags=("a\x00",)), "dag"),
        (lambda: Cursor.parse("abc", "before"), "before"),
        (lambda: Cursor.parse("nan:x", "after"), "after"),
        (lambda: Cursor.parse("12.5", "before"), "before"),
    ]:
        with pytest.raises(BadFilter) as caught:
            make()
        assert caught.value.field == field, str(caught.value)
    with pytest.raises(BadFilter, match=r"^limit: "):
        await store.runlist.runs_page(limit=501)
    with pytest.raises(BadFilter, match=r"^after: "):
        await store.runlist.runs_page(before=Cursor(1.0, "a"), after=Cursor(2.0, "b"))
