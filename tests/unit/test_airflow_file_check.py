"""The native FileTrigger check by directory (triggerer/airflow/native_files.py), on this
machine's filesystem and its real inotify, without Airflow.

What is shown: every literal path waiting in one directory costs one listing per safety
interval while the directory is watched, not one glob per path per interval; a created
name wakes its waits alone; FileTrigger's own answer (an empty file counts, an empty
directory does not until a file lands below it); a directory that does not exist yet; the
directory polled at the waits' interval where inotify is turned off; a wait left cancels
its interest and the last one closes the directory.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.helpers import async_wait_until

from triggerer.airflow.native_files import FileHub, is_literal
from triggers.inotify import POLL_FSTYPES_ENV


@pytest.fixture
async def hub() -> AsyncIterator[FileHub]:
    h = FileHub(safety_s=3600.0)
    yield h
    await h.close()


def _start(hub: FileHub, path: Path, interval: float, checks: list[str]) -> asyncio.Task[None]:
    return asyncio.create_task(hub.wait(str(path), lambda: interval, lambda: checks.append("x")))


def _at_least(items: list[str], n: int) -> bool:
    return len(items) >= n


async def _pushed(hub: FileHub, directory: Path) -> None:
    await async_wait_until(
        lambda: (d := hub.directories.get(str(directory))) is not None and d.pushed,
        what=f"the inotify watch on {directory}",
    )


async def test_a_watched_directory_is_listed_once_however_many_paths_wait(
    hub: FileHub, tmp_path: Path
) -> None:
    checks: list[str] = []
    waits = {i: _start(hub, tmp_path / f"f{i}", 0.02, checks) for i in range(1000)}
    await _pushed(hub, tmp_path)
    await async_wait_until(lambda: len(checks) >= 1000, what="every path checked once")
    listings = hub.listings
    # Fifty of their intervals: polled, this would be 50 listings (or 50,000 globs).
    await asyncio.sleep(1.0)
    assert hub.listings == listings <= 2
    (tmp_path / "f7").write_text("")  # empty: FileTrigger fires on existence
    await async_wait_until(lambda: waits[7].done(), what="the created path's wait")
    await asyncio.sleep(0.1)  # time for a wrong wake to fire the others
    assert [i for i, w in waits.items() if w.done()] == [7]
    assert hub.listings == listings  # the push looked at the one name
    for w in waits.values():
        w.cancel()
    await asyncio.gather(*waits.values(), return_exceptions=True)
    await async_wait_until(lambda: not hub.directories, what="the directory closed")


async def test_an_empty_directory_waits_for_a_file_below_it(hub: FileHub, tmp_path: Path) -> None:
    checks: list[str] = []
    target = tmp_path / "partition=1"
    wait = _start(hub, target, 0.05, checks)
    await _pushed(hub, tmp_path)
    target.mkdir()
    await async_wait_until(lambda: "partition=1" in hub.directories[str(tmp_path)].unsure)
    looked = len(checks)
    await async_wait_until(lambda: len(checks) >= looked + 3, what="looks at its interval")
    assert not wait.done()
    (target / "deeper").mkdir()
    (target / "deeper" / "part-0").write_text("x")
    await asyncio.wait_for(wait, 10)


async def test_a_directory_that_does_not_exist_yet(hub: FileHub, tmp_path: Path) -> None:
    checks: list[str] = []
    later = tmp_path / "later" / "in"
    wait = _start(hub, later / "_SUCCESS", 3600.0, checks)
    await _pushed(hub, later)
    later.mkdir(parents=True)
    (later / "_SUCCESS").write_text("")
    await asyncio.wait_for(wait, 10)  # pushed: its own interval is an hour


async def test_inotify_turned_off_polls_at_the_waits_interval(
    hub: FileHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POLL_FSTYPES_ENV, "*")
    checks: list[str] = []
    waits = [_start(hub, tmp_path / f"g{i}", 0.05, checks) for i in range(20)]
    await async_wait_until(lambda: hub.listings >= 3, what="listings at the interval")
    d = hub.directories[str(tmp_path)]
    assert not d.pushed
    os.symlink(tmp_path / "elsewhere", tmp_path / "g3")  # dangling: not a file
    (tmp_path / "elsewhere").write_text("")
    await asyncio.wait_for(waits[3], 10)
    assert not any(w.done() for i, w in enumerate(waits) if i != 3)
    for w in waits:
        w.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


async def test_paths_with_glob_characters_are_not_waited_by_name() -> None:
    assert is_literal("/in/_SUCCESS")
    assert not is_literal("/in/*.csv")
    assert not is_literal("/in/[ab]/done")
    assert not is_literal("/in/dir/")  # names no entry: globbed, as the provider does


async def test_waits_joining_in_slices_are_each_looked_at_once(
    hub: FileHub, tmp_path: Path
) -> None:
    """A big pool joins a slice at a time (the engine yields between slices): each slice's
    names are answered from one listing, without answering every name held again."""
    checks: list[str] = []
    waits: list[asyncio.Task[None]] = []
    for part in range(10):
        waits += [_start(hub, tmp_path / f"s{part}-{i}", 3600.0, checks) for i in range(500)]
        looked = functools.partial(_at_least, checks, len(waits))
        await async_wait_until(looked, what="the slice looked at")
    # Once each (the watch's own first listing, if it lands meanwhile, adds one round).
    assert len(checks) <= 2 * len(waits)
    for w in waits:
        w.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
