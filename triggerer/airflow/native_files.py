"""The native FileTrigger checks of one process, by directory.

Airflow's FileTrigger globs its path every ``poke_interval`` in every trigger; the native
check used to do the same once per distinct path, so 100,000 waiting paths cost 20,000
globs a second at 5 s, for nothing. Here every path without glob characters is a name
waited for in its directory, and each directory is one :class:`_Directory`:

- pushed: one inotify watch per directory (slotless's own, :mod:`triggers.inotify`),
  woken by a waited name's creation or a rename into the directory, and then only that
  name is looked at. FileTrigger fires on *existence* (a file just created, even empty;
  a directory with a file somewhere below), so creations are what wake it, not closes;
- polled as the safety net: one listing of the directory (``os.scandir``) for every name
  waited in it, at the shortest ``poke_interval`` among them while the directory cannot
  be watched (a network filesystem, no watches left), else every :data:`SAFETY_S`;
- a waited name that exists but does not satisfy FileTrigger yet (an empty directory:
  files landing below it are not heard by the parent's watch) is looked at on its own
  at its interval until it does.

Whatever wakes a check, the answer is the provider's own test (:func:`.native.file_found`)
for the names present, so the event is the one Airflow's class would yield. Paths with
glob characters keep one glob per distinct path per interval (:func:`.native.file_events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from triggers.checking import CheckContext
from triggers.context import to_thread
from triggers.inotify import InotifyDirectory
from triggers.push import PushUnavailable

from .native import file_events as globbed_events
from .native import file_found

log = logging.getLogger("slotless.airflow")

# While its directory's watch is live, a name is listed only this often (the watch can
# miss nothing slotless knows of on a local filesystem; the listing covers what it cannot).
SAFETY_S = 300.0
# More waited names due than this are answered from one listing of the directory instead
# of looking at each name (one scandir beats thousands of stats).
SINGLE_NAMES = 256
# After a watch failed, how long the directory is polled before trying to watch it again.
REWATCH_S = 60.0


@dataclass(eq=False)
class _Wait:
    interval: Callable[[], float]
    on_check: Callable[[], None]
    found: asyncio.Future[None]


@dataclass(eq=False)
class _Directory:
    path: str
    waits: dict[str, list[_Wait]] = field(default_factory=dict)  # name -> its waits
    # Names to look at now (a new wait, a pushed name); None in it: the whole directory.
    due: set[str | None] = field(default_factory=set)
    unsure: set[str] = field(default_factory=set)  # present, not satisfying FileTrigger yet
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    pushed: bool = False  # the watch is live: polling is the safety net only
    interval: float = 5.0  # the shortest poke_interval among the waits (s)
    task: asyncio.Task[None] | None = None
    watch: asyncio.Task[None] | None = None


class FileHub:
    """Every literal-path FileTrigger check of the process; :meth:`wait` returns when the
    path satisfies FileTrigger."""

    def __init__(self, *, safety_s: float = SAFETY_S) -> None:
        self.safety_s = safety_s
        self.directories: dict[str, _Directory] = {}
        self.ctx = CheckContext()  # the inotify descriptor, shared by every watch
        self.listings = 0  # whole-directory listings made
        self.lookups = 0  # single names looked at (a push, a new wait, an unsure name)

    async def wait(
        self, path: str, interval: Callable[[], float], on_check: Callable[[], None]
    ) -> None:
        directory, name = os.path.split(path)
        d = self.directories.get(directory or ".")
        if d is None:
            d = self.directories[directory or "."] = _Directory(directory or ".")
            d.task = asyncio.create_task(self._serve(d), name=f"airflow files {d.path}")
        w = _Wait(interval, on_check, asyncio.get_running_loop().create_future())
        d.interval = w.interval() if not d.waits else min(d.interval, w.interval())
        d.waits.setdefault(name, []).append(w)
        d.due.add(name)  # its first check at once, as the provider's run() starts with one
        d.woken.set()
        try:
            await w.found
        finally:
            waits = d.waits.get(name)
            if waits is not None and w in waits:
                waits.remove(w)
                if not waits:
                    del d.waits[name]
                    d.unsure.discard(name)
            if not d.waits:
                self._close(d)

    def _close(self, d: _Directory) -> None:
        if self.directories.get(d.path) is d:
            del self.directories[d.path]
        for task in (d.task, d.watch):
            if task is not None and task is not asyncio.current_task():
                task.cancel()

    async def close(self) -> None:
        tasks = [t for d in self.directories.values() for t in (d.task, d.watch) if t]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.directories.clear()
        await self.ctx.aclose()

    # -- one directory ------------------------------------------------------------

    async def _serve(self, d: _Directory) -> None:
        d.watch = asyncio.create_task(self._watch(d), name=f"airflow inotify {d.path}")
        listed_at = time.monotonic()
        while d.waits:
            if not d.due:
                timeout = self._between_listings(d) - (time.monotonic() - listed_at)
                if d.unsure:  # looked at on their own, at their interval
                    timeout = min(timeout, d.interval)
                if timeout > 0:
                    d.woken.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(d.woken.wait(), timeout)
                if not d.due:
                    if time.monotonic() - listed_at >= self._between_listings(d):
                        d.due.add(None)
                    else:
                        d.due.update(d.unsure)
            # Every name at the listing's time (or after a watch said "anything"); else
            # only the names due (new waits, pushed names), answered from one listing
            # when they are many: 100,000 waits joining 1,000 at a time must not answer
            # every name each time.
            every = None in d.due
            asked = list(d.waits) if every else [n for n in d.due if n in d.waits]
            whole = every or len(asked) > SINGLE_NAMES
            d.due.clear()
            if whole:
                self.listings += 1
            else:
                self.lookups += len(asked)
            if every:
                listed_at = time.monotonic()
                # Recomputed here only: a wait gone since leaves it shorter, not wrong.
                d.interval = min((w.interval() for ws in d.waits.values() for w in ws), default=5.0)
            try:
                found, present = await to_thread(_look, d.path, asked, whole)
            except Exception as exc:  # a failed look is tried again at the interval
                log.warning("cannot look in %s: %s", d.path, exc)
                found, present = set(), set()
            self._answer(d, asked, found, present)

    def _answer(
        self, d: _Directory, asked: Iterable[str], found: set[str], present: set[str]
    ) -> None:
        for name in asked:
            waits = d.waits.get(name, ())
            for w in waits:
                w.on_check()
            if name in found:
                d.unsure.discard(name)
                for w in waits:
                    if not w.found.done():
                        w.found.set_result(None)
            elif name in present:
                d.unsure.add(name)
            else:
                d.unsure.discard(name)

    def _between_listings(self, d: _Directory) -> float:
        """Seconds between two listings of the whole directory."""
        return max(d.interval, self.safety_s) if d.pushed else d.interval

    async def _watch(self, d: _Directory) -> None:
        """The directory's inotify watch, while it can be had; a failed one is tried again
        after :data:`REWATCH_S` (its waits are polled at their interval meanwhile)."""
        source = InotifyDirectory(d.path, creations=True)

        def ready() -> None:
            d.pushed = True
            d.due.add(None)  # what landed before the watch was set
            d.woken.set()

        def wake(names: Iterable[str | None]) -> None:
            for name in names:
                if name is None or name in d.waits:
                    d.due.add(name)
                    d.woken.set()

        said: str | None = None
        while True:
            try:
                await source.run(self.ctx, ready, wake)
                why = "the watch ended"
            except PushUnavailable as exc:
                why = str(exc)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
            if d.pushed:
                d.pushed = False
                d.woken.set()  # back to listing at the waits' own interval
            if why != said:  # once per reason: thousands of directories on NFS retry
                said = why
                log.info("%s is polled: %s (tried again every %.0f s)", d.path, why, REWATCH_S)
            await asyncio.sleep(REWATCH_S)


def _look(directory: str, names: list[str], whole: bool) -> tuple[set[str], set[str]]:
    """Which of ``names`` in ``directory`` satisfy FileTrigger, and which are present at
    all. ``whole``: one listing of the directory; else each name on its own."""
    if whole:
        try:
            with os.scandir(directory) as entries:
                listed = {e.name for e in entries}
        except (FileNotFoundError, NotADirectoryError):
            return set(), set()
        present = [n for n in names if n in listed]
    else:
        present = [n for n in names if os.path.lexists(os.path.join(directory, n))]
    found = {n for n in present if file_found(os.path.join(directory, n), False)}
    return found, set(present)


def is_literal(path: str) -> bool:
    """A path the hub can wait for by name: no glob characters, naming an entry."""
    return not glob.has_magic(path) and bool(os.path.basename(path))


async def file_events(
    hub: FileHub,
    path: str,
    recursive: bool,
    interval: Callable[[], float],
    on_check: Callable[[], None],
) -> AsyncGenerator[Any, None]:
    """Yields ``TriggerEvent(True)`` once ``path`` satisfies FileTrigger, as Airflow's
    class does: by name in its directory for a literal path, by glob otherwise."""
    if not is_literal(path):
        async with contextlib.aclosing(globbed_events(path, recursive, interval, on_check)) as ev:
            async for event in ev:
                yield event
        return
    from airflow.triggers.base import TriggerEvent

    await hub.wait(path, interval, on_check)
    yield TriggerEvent(True)
