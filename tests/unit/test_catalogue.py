"""The DAG catalogue on a SQLite store: a folder with a good DAG file and four broken ones
(a syntax error, an import error, an endless loop at import, ``sys.exit(3)``), each file
imported in a real child process. Broken files are listed with their error and the scan
returns; unchanged files are not imported again; changed ones are; removed ones go."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.helpers import async_wait_until, pid_alive, write_dag
from support.refused_dags import CYCLE, UNLISTED_SENSOR

from executor import catalogue
from executor.catalogue import ScanResult, scan
from executor.schedules import Schedule
from executor.store import Store

LIMIT = 2.0  # seconds per file: short, so the endless loop is cut off quickly

# Appends a line to MARKER each time it is imported: the proof of an import.
GOOD = """
from pathlib import Path

from executor import DAG

with open({marker!r}, "a") as f:
    f.write("imported\\n")
print("a DAG file that prints at import")

dag = DAG({dag_id!r})


@dag.task
def hello(ctx):
    return 1
"""

BROKEN = {
    "syntax.py": "def broken(:\n    pass\n",
    "imports.py": "import no_such_module_for_slotless_tests\n",
    "loops.py": "import time\n\nwhile True:\n    time.sleep(0.05)\n",
    "exits.py": "import sys\n\nsys.exit(3)\n",
}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir()
    return dags


def good_file(folder: Path, marker: Path, dag_id: str = "good", name: str = "good.py") -> Path:
    return write_dag(folder, GOOD.format(marker=str(marker), dag_id=dag_id), name)


def imports(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def bump_mtime(path: Path) -> None:
    # A rewrite within the filesystem's timestamp granularity could keep the mtime: move
    # it explicitly, as an editor saving a second later would.
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


async def dag_ids(store: Store) -> list[str]:
    return [d["dag_id"] for d in await store.catalogue.catalogue_dags()]


async def errors(store: Store) -> dict[str, str]:
    return {Path(b["path"]).name: b["parse_error"] for b in await store.catalogue.broken_files()}


async def test_broken_files_are_listed_with_their_error_and_the_good_one_is_catalogued(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "imports.log"
    good = good_file(folder, marker)
    for name, source in BROKEN.items():
        write_dag(folder, source, name)

    started = time.monotonic()
    result = await scan(store, folder, timeout=LIMIT)
    # The endless loop costs its limit (and the kill's grace), not the test's timeout.
    assert time.monotonic() - started < LIMIT + 10

    assert isinstance(result, ScanResult)
    assert len(result.parsed) == 5
    assert await dag_ids(store) == ["good"]
    [row] = await store.catalogue.catalogue_dags()
    assert row["file"] == str(good.resolve())
    assert (row["paused"], row["schedule"], row["timezone"]) == (0, None, "UTC")
    assert row["parse_error"] is None and row["last_run_state"] is None
    assert imports(marker) == 1

    broken = await errors(store)
    assert sorted(broken) == sorted(BROKEN)
    assert "SyntaxError" in broken["syntax.py"] and "line 1" in broken["syntax.py"]
    assert "ModuleNotFoundError" in broken["imports.py"]
    assert "no_such_module_for_slotless_tests" in broken["imports.py"]
    assert f"did not finish within {LIMIT:g} s" in broken["loops.py"]
    assert "(line 4)" in broken["loops.py"]  # where it was stuck: the sleep in the loop
    assert "sys.exit(3)" in broken["exits.py"] and "line 3" in broken["exits.py"]
    for error in broken.values():
        assert "\n" not in error
    assert result.errors.keys() == {str((folder / n).resolve()) for n in BROKEN}


async def test_only_changed_files_are_imported_again(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "imports.log"
    good = good_file(folder, marker)
    other_marker = tmp_path / "other.log"
    good_file(folder, other_marker, dag_id="other", name="other.py")
    await scan(store, folder, timeout=LIMIT)
    assert (imports(marker), imports(other_marker)) == (1, 1)

    result = await scan(store, folder, timeout=LIMIT)
    assert result.parsed == []
    assert len(result.unchanged) == 2
    assert (imports(marker), imports(other_marker)) == (1, 1)  # nothing imported again

    # The file now declares another DAG: re-parsed, the old id goes, the new one comes.
    good_file(folder, marker, dag_id="renamed")
    bump_mtime(good)
    result = await scan(store, folder, timeout=LIMIT)
    assert result.parsed == [str(good.resolve())]
    assert (imports(marker), imports(other_marker)) == (2, 1)
    assert await dag_ids(store) == ["other", "renamed"]


async def test_a_file_that_breaks_keeps_its_dag_and_pause_until_it_is_fixed(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "imports.log"
    good = good_file(folder, marker)
    await scan(store, folder, timeout=LIMIT)
    await store.catalogue.set_paused("good", True)

    good.write_text("raise RuntimeError('half-saved')\n")
    bump_mtime(good)
    await scan(store, folder, timeout=LIMIT)
    [row] = await store.catalogue.catalogue_dags()
    assert row["paused"] == 1
    assert "RuntimeError: half-saved" in row["parse_error"]
    assert "RuntimeError: half-saved" in (await errors(store))["good.py"]

    good_file(folder, marker)
    bump_mtime(good)
    await scan(store, folder, timeout=LIMIT)
    [row] = await store.catalogue.catalogue_dags()
    assert (row["paused"], row["parse_error"]) == (1, None)
    assert await errors(store) == {}


async def test_a_removed_file_leaves_the_catalogue(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    good = good_file(folder, tmp_path / "a.log")
    broken = write_dag(folder, BROKEN["syntax.py"], "syntax.py")
    # A file linked into the folder is the folder's (by its link's path), and leaves with it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = folder / "linked.py"
    linked.symlink_to(good_file(elsewhere, tmp_path / "b.log", dag_id="linked"))
    await scan(store, folder, timeout=LIMIT)
    assert await dag_ids(store) == ["good", "linked"]

    for path in (good, broken, linked):
        path.unlink()
    result = await scan(store, folder, timeout=LIMIT)
    assert result.removed == sorted(str(p) for p in (good, broken, linked))
    assert await dag_ids(store) == []
    assert await errors(store) == {}
    assert await store.catalogue.catalogue_files() == {}


async def test_a_dag_id_defined_twice_stays_with_the_first_file_until_it_lets_go(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    first = good_file(folder, tmp_path / "a.log", name="a.py")
    await scan(store, folder, timeout=LIMIT)
    good_file(folder, tmp_path / "b.log", name="b.py")  # a copy: the same dag_id
    await scan(store, folder, timeout=LIMIT)
    [row] = await store.catalogue.catalogue_dags()
    assert row["file"] == str(first.resolve())
    assert "already defined in" in (await errors(store))["b.py"]

    # a.py lets the id go: b.py, refused before, is parsed again and takes it.
    first.unlink()
    await scan(store, folder, timeout=LIMIT)
    [row] = await store.catalogue.catalogue_dags()
    assert Path(row["file"]).name == "b.py"
    assert await errors(store) == {}


async def test_the_scan_does_not_block_the_event_loop(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    """A file looping at import runs in a child: the caller's loop keeps turning."""
    write_dag(folder, BROKEN["loops.py"], "loops.py")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)  # the beat being measured, not a wait for something

    ticker = asyncio.create_task(tick())
    scanning = asyncio.create_task(scan(store, folder, timeout=5.0))
    await async_wait_until(lambda: ticks >= 50, what="50 ticks of the loop during the scan")
    assert not scanning.done()
    result = await scanning
    ticker.cancel()
    assert list(result.errors) == [str((folder / "loops.py").resolve())]


async def test_files_outside_the_pattern_and_a_missing_folder(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    write_dag(folder, "raise RuntimeError('never imported')\n", "_helpers.py")
    write_dag(folder, "raise RuntimeError('never imported')\n", "notes.txt")
    result = await scan(store, folder, timeout=LIMIT)
    assert (result.parsed, result.errors) == ([], {})
    with pytest.raises(NotADirectoryError):
        await scan(store, tmp_path / "nowhere", timeout=LIMIT)


SCHEDULED = """
from datetime import datetime, timedelta

from executor import DAG

daily = DAG("daily", schedule="0 6 * * *", timezone="Europe/Paris")
catching_up = DAG(
    "catching_up", schedule=timedelta(hours=1), start_date=datetime(2026, 1, 1), catchup=True
)
bounded = DAG("bounded", schedule="@daily", start_date=datetime(2026, 1, 1),
              end_date=datetime(2026, 1, 2))
by_hand = DAG("by_hand")
"""


async def test_a_scheduled_dag_is_stored_with_its_schedule_zone_and_next_logical_date(
    store: Store, folder: Path
) -> None:
    write_dag(folder, SCHEDULED, "scheduled.py")
    before = datetime.now(UTC)
    await scan(store, folder, timeout=10)
    after = datetime.now(UTC)
    rows = {d["dag_id"]: d for d in await store.catalogue.catalogue_dags()}
    stored = {
        k: None if r["schedule"] is None else Schedule.from_json(r["schedule"])
        for k, r in rows.items()
    }
    assert {k: (s and s.text, rows[k]["timezone"]) for k, s in stored.items()} == {
        "daily": ("0 6 * * *", "Europe/Paris"),
        "catching_up": ("PT1H", "UTC"),
        "bounded": ("@daily", "UTC"),
        "by_hand": (None, "UTC"),
    }
    # The whole schedule is stored: its zone, dates and catchup come back as declared.
    assert stored["daily"] == Schedule.parse("0 6 * * *", timezone="Europe/Paris")
    assert stored["catching_up"] == Schedule.parse(
        timedelta(hours=1), start_date=datetime(2026, 1, 1), catchup=True
    )
    assert stored["bounded"] == Schedule.parse(
        "@daily", start_date=datetime(2026, 1, 1), end_date=datetime(2026, 1, 2)
    )
    # catchup=False: the latest complete interval as of the parse.
    daily = Schedule.parse("0 6 * * *", timezone="Europe/Paris")
    expected = {daily.latest_complete(t).logical_date for t in (before, after)}  # type: ignore[union-attr]
    assert datetime.fromisoformat(rows["daily"]["next_logical_date"]) in expected
    # catchup=True: the first interval from start_date, however long ago.
    assert rows["catching_up"]["next_logical_date"] == "2026-01-01T00:00:00+00:00"
    # end_date passed with catchup=False: the last interval, still not created.
    assert rows["bounded"]["next_logical_date"] == "2026-01-02T00:00:00+00:00"
    assert rows["by_hand"]["next_logical_date"] is None


async def test_a_bad_schedule_is_the_files_error(store: Store, folder: Path) -> None:
    write_dag(folder, 'from executor import DAG\n\nDAG("typo", schedule="0 6 * * 9")\n', "typo.py")
    await scan(store, folder, timeout=10)
    assert await dag_ids(store) == []
    error = (await errors(store))["typo.py"]
    assert "DAG 'typo': bad cron '0 6 * * 9': day-of-week 9 out of range 0-7" in error


async def test_a_dag_that_run_and_trigger_would_refuse_is_a_broken_file_and_arms_nothing(
    store: Store, folder: Path
) -> None:
    write_dag(folder, CYCLE, "cycle.py")
    write_dag(folder, UNLISTED_SENSOR, "unlisted.py")
    await scan(store, folder, timeout=10)
    assert await dag_ids(store) == []
    assert await store.catalogue.start_waits() == []
    broken = await errors(store)
    assert broken["cycle.py"].endswith("DAG 'loops_back': cycle: a -> b -> c -> a")
    assert "sensor 'wait': trigger class " in broken["unlisted.py"]
    assert ".Unlisted is not allow-listed, so it cannot defer" in broken["unlisted.py"]
    assert "SLOTLESS_ALLOWED_TRIGGERS" in broken["unlisted.py"]


# Files parse in grandchildren forked by one forkserver per scan: a file may kill that
# forkserver, leave processes behind, or the forkserver may be killed from outside.

# Records its pid and its parent's (the forkserver), then waits for GO: the test's cue.
WAITS_FOR_GO = """
import os
import time
from pathlib import Path

from executor import DAG

with open({marker!r}, "a") as f:
    f.write(f"{{os.getpid()}} {{os.getppid()}}\\n")
while not Path({go!r}).exists():
    time.sleep(0.01)

dag = DAG({dag_id!r})
"""


def pids(marker: Path) -> list[list[int]]:
    return [[int(p) for p in line.split()] for line in marker.read_text().splitlines()]


async def test_a_forkserver_killed_mid_scan_kills_its_files_and_they_are_parsed_again(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    markers = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    for name, marker in markers.items():
        source = WAITS_FOR_GO.format(marker=str(marker), go=str(go), dag_id=name)
        write_dag(folder, source, f"{name}.py")
    scanning = asyncio.create_task(scan(store, folder, timeout=60, jobs=2))
    await async_wait_until(
        lambda: all(imports(m) == 1 for m in markers.values()), what="both files importing"
    )
    first = [pids(m)[0] for m in markers.values()]
    [forkserver] = {parent for _, parent in first}
    os.kill(forkserver, signal.SIGKILL)

    # Orphans now: the scan kills them at once (their limit is a minute away).
    await async_wait_until(
        lambda: not any(pid_alive(pid) for pid, _ in first), timeout=20, what="orphans killed"
    )
    await async_wait_until(
        lambda: all(imports(m) == 2 for m in markers.values()), what="both files imported again"
    )
    second = [pids(m)[1] for m in markers.values()]
    assert forkserver not in {parent for _, parent in second}
    go.touch()
    result = await scanning
    assert (result.errors, await dag_ids(store)) == ({}, ["a", "b"])


# Records its pid, then kills the forkserver that forked it; an orphan, it loops.
KILLS_ITS_FORKSERVER = """
import os
import signal
import time

with open({marker!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
os.kill(os.getppid(), signal.SIGKILL)
while True:
    time.sleep(0.05)
"""


async def test_files_that_kill_their_forkserver_or_themselves_are_each_an_error_line(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    good_file(folder, tmp_path / "a.log", dag_id="a", name="a.py")
    killer = tmp_path / "killer.log"
    write_dag(folder, KILLS_ITS_FORKSERVER.format(marker=str(killer)), "b_kills_forkserver.py")
    write_dag(folder, "import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)\n", "c.py")
    write_dag(folder, "import os\n\nos._exit(4)\n", "d.py")
    good_file(folder, tmp_path / "e.log", dag_id="e", name="e.py")

    # One file at a time: the killer takes down the forkserver of no other file.
    result = await scan(store, folder, timeout=60, jobs=1)
    assert await dag_ids(store) == ["a", "e"]
    broken = await errors(store)
    assert sorted(broken) == ["b_kills_forkserver.py", "c.py", "d.py"]
    assert broken["b_kills_forkserver.py"].endswith(
        "b_kills_forkserver.py: the process that imports it died twice: exited with status -9"
    )
    assert broken["c.py"].endswith("c.py: killed by signal 9: no output")
    assert broken["d.py"].endswith("d.py: exited with status 4: no output")
    assert len(result.errors) == 3
    # Tried twice, and each orphan was killed when its forkserver died, not at its limit.
    tried = [pid for [pid] in pids(killer)]
    assert len(tried) == 2
    await async_wait_until(
        lambda: not any(pid_alive(pid) for pid in tried), timeout=20, what="orphans killed"
    )


# Forks a child that hangs in the file's process group, records its pid, then THEN.
SPAWNS = """
import os
import signal
import time

from executor import DAG

child = os.fork()
if child == 0:
    signal.pause()
    os._exit(0)
with open({marker!r}, "a") as f:
    f.write(f"{{child}}\\n")
{then}
"""


async def test_what_a_file_started_is_killed_whether_the_file_ends_or_hangs(
    store: Store, folder: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "spawned.log"
    write_dag(folder, SPAWNS.format(marker=str(marker), then='dag = DAG("spawner")'), "ends.py")
    hangs = "while True:\n    time.sleep(0.05)"
    write_dag(folder, SPAWNS.format(marker=str(marker), then=hangs), "hangs.py")
    result = await scan(store, folder, timeout=LIMIT)
    assert await dag_ids(store) == ["spawner"]
    assert list(result.errors) == [str((folder / "hangs.py").resolve())]
    assert f"did not finish within {LIMIT:g} s (line 15)" in (await errors(store))["hangs.py"]
    spawned = [pid for [pid] in pids(marker)]
    assert len(spawned) == 2
    await async_wait_until(
        lambda: not any(pid_alive(pid) for pid in spawned), what="the spawned children killed"
    )


async def test_a_forkserver_that_cannot_start_fails_the_files_with_its_reason(
    store: Store, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalogue, "_SERVE", "import sys; sys.exit('no slotless here')")
    for name in ("a", "b", "c"):
        good_file(folder, tmp_path / f"{name}.log", dag_id=name, name=f"{name}.py")
    result = await scan(store, folder, timeout=LIMIT)
    assert len(result.errors) == 3
    for error in (await errors(store)).values():
        assert error.endswith(
            ": the process that imports DAG files failed: exited with status 1: no slotless here"
        )
