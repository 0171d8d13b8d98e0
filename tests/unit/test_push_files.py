"""File waits pushed by the real kernel's inotify: one watch per directory, woken on close
or rename, globs kept, polling when inotify cannot be had (forced), sources closed with
their last wait."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import date
from pathlib import Path

import pytest
from support.helpers import async_wait_until
from support.triggers import serving, spy_listings, task_rows

from executor import DAG
from triggers import files, inotify
from triggers.base import TriggerEvent
from triggers.checking import CheckContext
from triggers.files import FileTrigger

DAY = date(2026, 4, 25)
HOUR = 3600.0  # a poll interval no test waits for: only a push can wake these waits

pytestmark = pytest.mark.usefixtures("fresh_triggers")


def file_waits(dag_id: str, paths: list[str], interval: float = HOUR) -> DAG:
    dag = DAG(dag_id)

    @dag.task
    def items(ctx):
        return paths

    @dag.task(expand=items)
    def wait(ctx):
        ctx.defer(FileTrigger(path=ctx.item, poke_interval=interval), method="done")

    @wait.method
    def done(ctx):
        return ctx.event

    return dag


def waits(db_path: Path, run_id: str) -> list[dict]:
    return [r for r in task_rows(db_path, run_id, "wait") if r["map_index"] >= 0]


def all_in(db_path: Path, run_id: str, state: str, n: int) -> bool:
    rows = waits(db_path, run_id)
    return len(rows) == n and all(r["state"] == state for r in rows)


def reader_watches(trig) -> int:
    reader = trig.ctx._shared.get("inotify")
    return 0 if reader is None else len(reader._by_wd)


async def test_many_waits_in_one_directory_share_one_watch_and_wake_on_close(
    store, db_path, tmp_path
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    n = 30
    dag = file_waits("push_files", [str(inbox / f"{i}.csv") for i in range(n)])
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", n), what="deferred")
        key = ("inotify", str(inbox))
        await async_wait_until(lambda: trig.push.live(key), what="the watch is live")
        assert trig.push.sources == {key: True}  # one source for 30 waits ...
        assert reader_watches(trig) == 1  # ... and one kernel watch
        for i in range(n):
            # Written in place: the wait wakes at the close, not at the create.
            with open(inbox / f"{i}.csv", "w") as f:
                f.write("x")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", n), what="all woken")
        outputs = {json.loads(r["output"])["paths"][0] for r in waits(db_path, run_id)}
        assert outputs == {str(inbox / f"{i}.csv") for i in range(n)}
        # The last wait gone, the source and its watch are closed.
        await async_wait_until(lambda: not trig.push.sources, what="source closed")
        await async_wait_until(lambda: reader_watches(trig) == 0, what="watch removed")


async def test_a_wait_woken_by_its_own_name_reads_its_file_not_its_directory(
    store, db_path, tmp_path, monkeypatch
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "unrelated.txt").write_text("y")
    n = 20
    listed = spy_listings(monkeypatch)
    dag = file_waits("push_heard", [str(inbox / f"{i}.csv") for i in range(n)])
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", n), what="deferred")
        await async_wait_until(lambda: trig.push.live(("inotify", str(inbox))), what="live")

        # Checked once more when the watch went live (a listing: nothing heard yet), then
        # on the safety interval: every check far off and none running.
        def settled() -> bool:
            checks = list(trig.table.by_hash.values())
            far = trig.clock() + 60
            return len(checks) == n and all(not c.running and c.due > far for c in checks)

        await async_wait_until(settled, what="the checks the watch asked for")
        before = len(listed)
        for i in range(n):
            (inbox / f"{i}.csv").write_text("x")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", n), what="all woken")
        assert len(listed) == before  # each woken wait read its own file alone
        outputs = {json.loads(r["output"])["paths"][0] for r in waits(db_path, run_id)}
        assert outputs == {str(inbox / f"{i}.csv") for i in range(n)}


def test_heard_names_are_kept_a_while_and_bounded(monkeypatch) -> None:
    # A watch hears every name in its directory, waited on or not: none is kept for good.
    monkeypatch.setattr(inotify, "HEARD_NAMES", 3)
    heard = inotify.HeardNames()
    heard.note("/in", ["a", "b", None, "c", "d"])
    assert list(heard.paths) == ["/in/b", "/in/c", "/in/d"]  # the oldest went first
    assert heard.take("/in/c") and not heard.take("/in/c")
    heard.paths["/in/b"] = time.monotonic() - inotify.HEARD_FOR - 1  # heard long ago
    heard.note("/in", ["e"])
    assert list(heard.paths) == ["/in/d", "/in/e"]


async def test_a_glob_wakes_on_a_matching_name_and_a_rename_into_the_directory(
    store, db_path, tmp_path
) -> None:
    inbox, staging = tmp_path / "in", tmp_path / "staging"
    inbox.mkdir()
    staging.mkdir()
    dag = file_waits("push_glob", [str(inbox / "*.csv")])
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(
            lambda: trig.push.live(("inotify", str(inbox))), what="the watch is live"
        )
        woken = trig.push.woken
        (inbox / "notes.txt").write_text("not a csv")
        (staging / "data.csv").write_text("a,b\n")
        await async_wait_until(lambda: trig.push.pushes >= 2, what="the close was pushed")
        assert trig.push.woken == woken  # notes.txt matches nobody's glob
        assert all_in(db_path, run_id, "DEFERRED", 1)
        os.rename(staging / "data.csv", inbox / "data.csv")  # IN_MOVED_TO
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 1), what="woken")
        (row,) = waits(db_path, run_id)
        assert json.loads(row["output"]) == {"paths": [str(inbox / "data.csv")]}


async def test_without_inotify_the_waits_are_polled_with_a_log_line(
    store, db_path, tmp_path, monkeypatch, caplog
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    # Forced through the real detection: the test directory's own filesystem is listed
    # as one without inotify.
    fstype = inotify.fstype_of(str(inbox))
    assert fstype is not None
    monkeypatch.setenv(inotify.POLL_FSTYPES_ENV, fstype)
    caplog.set_level(logging.WARNING, logger="slotless.triggerer.push")
    dag = file_waits("push_fallback", [str(inbox / "a.csv")], interval=0.2)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(lambda: "unavailable" in caplog.text, what="the fallback")
        assert f"{fstype} filesystem" in caplog.text
        assert not trig.push.live(("inotify", str(inbox)))
        assert reader_watches(trig) == 0
        (inbox / "a.csv").write_text("x")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 1), what="polled")


async def test_a_watch_that_cannot_be_set_falls_back_and_polling_still_fires(
    store, db_path, tmp_path, caplog
) -> None:
    blocker = tmp_path / "a-file"  # where the directory should be: the kernel says ENOTDIR
    blocker.write_text("")
    caplog.set_level(logging.WARNING, logger="slotless.triggerer.push")
    dag = file_waits("push_missing", [str(blocker / "a.csv")], interval=0.2)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}):
        await async_wait_until(lambda: "cannot watch" in caplog.text, what="the fallback")
        blocker.unlink()
        blocker.mkdir()
        (blocker / "a.csv").write_text("x")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 1), what="polled")


async def test_a_directory_that_does_not_exist_yet_is_pushed_once_it_is_made(
    store, db_path, tmp_path, caplog
) -> None:
    missing = tmp_path / "drop" / "2026"  # two levels below the nearest existing one
    caplog.set_level(logging.WARNING, logger="slotless")
    dag = file_waits("push_not_yet", [str(missing / "a.csv")])  # polled hourly: push only
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(
            lambda: trig.push.live(("inotify", str(missing))), what="the ancestor watched"
        )
        missing.mkdir(parents=True)
        (missing / "a.csv").write_text("x")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 1), what="pushed")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_a_live_source_polls_only_at_the_safety_interval(store, db_path, tmp_path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    dag = file_waits("push_safety", [str(inbox / "a.csv")], interval=0.1)
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True, "push_safety_interval": 30.0}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(
            lambda: trig.push.live(("inotify", str(inbox))), what="the watch is live"
        )
        (check,) = trig.table.by_hash.values()
        # Its own interval is 0.1 s; with the watch live it is next due ~30 s on.
        await async_wait_until(
            lambda: check.due - trig.clock() > 20, what="the safety interval applied"
        )
        done = trig.checks_done
        (inbox / "a.csv").write_text("x")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 1), what="woken")
        assert trig.checks_done - done <= 2  # the pushed check (one more if one was in flight)


def test_an_entry_gone_before_its_stat_is_left_out_alone(tmp_path) -> None:
    (tmp_path / "kept.csv").write_text("xy")
    (tmp_path / "upload.part").write_text("x")
    with os.scandir(tmp_path) as it:
        entries = list(it)  # read from the directory: both names are in it
    os.rename(tmp_path / "upload.part", tmp_path / "data.csv")  # renamed before the stat
    assert files._sizes(entries) == {"kept.csv": 2}


async def test_renames_into_the_directory_while_it_is_listed_never_hide_a_present_file(
    tmp_path,
) -> None:
    # What a pushed wait sees in a burst: writers rename their temporary files into place
    # while the check lists the directory. One entry vanishing between the directory read
    # and its stat once made the whole listing "not yet" (every wait of the directory,
    # woken by the push, then slept until its safety poll).
    (tmp_path / "present.csv").write_text("x")
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            part = tmp_path / f"f{i % 100}.part"
            part.write_text("x")
            os.rename(part, tmp_path / f"f{i % 100}")
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    trigger = FileTrigger(path=str(tmp_path / "present.csv"))
    try:
        for _ in range(500):  # a listing raced a rename about one time in ten here
            (result,) = await FileTrigger.poke_many([trigger], CheckContext())
            assert isinstance(result, TriggerEvent), "a present file was reported missing"
    finally:
        stop.set()
        thread.join()


async def test_one_directory_named_two_ways_wakes_the_waits_of_both_names(
    store, db_path, tmp_path
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    alias = tmp_path / "alias"
    alias.symlink_to(inbox)  # two sources, one inode: the kernel gives both one watch
    dag = file_waits("push_alias", [str(inbox / "a.csv"), str(alias / "b.csv")])
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, config={"push": True}) as h:
        trig = h.triggerer
        assert trig is not None
        await async_wait_until(lambda: all_in(db_path, run_id, "DEFERRED", 2), what="deferred")
        keys = [("inotify", str(inbox)), ("inotify", str(alias))]
        await async_wait_until(lambda: all(trig.push.live(k) for k in keys), what="live")
        assert reader_watches(trig) == 1
        (inbox / "a.csv").write_text("x")
        (inbox / "b.csv").write_text("x")
        await async_wait_until(lambda: all_in(db_path, run_id, "SUCCESS", 2), what="both woken")
