"""Local files pushed by the kernel: one inotify watch per directory, shared by every wait.

Built on asyncinotify (pinned in constraints.txt): a thin ctypes binding with no
dependencies of its own that reads the inotify descriptor from the asyncio loop itself
(``add_reader``: no thread, no debounce) and reports the kernel's own masks, so a wait
is woken by ``IN_CLOSE_WRITE`` (a writer closed the file) or ``IN_MOVED_TO`` (a file was
renamed into the directory) and never by a half-written file's ``IN_CREATE``. watchfiles
was the other candidate; it watches a fixed set of paths from a Rust thread and reports
debounced "added/modified" changes (50 ms steps at best), so adding a directory means
restarting the watcher and a close cannot be told from a write.

One inotify descriptor serves the whole process (the kernel allows 128 per user by
default); each directory is one watch on it (8,192 per user by default:
``fs.inotify.max_user_watches``). A directory that does not exist yet is waited for by a
watch on its nearest existing ancestor. A watch that cannot be set (a file where the
directory should be, the limit is reached) or a filesystem where inotify does not see other hosts'
writes (NFS, SMB, FUSE mounts, ...: :data:`POLLED_FSTYPES`, extended by
``SLOTLESS_INOTIFY_POLL_FSTYPES``) raises :class:`~triggers.push.PushUnavailable`: the
directory's waits are polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from .context import to_thread
from .push import PushSource, PushUnavailable, Wake

log = logging.getLogger("slotless.push.inotify")

# Filesystems where inotify hears only this host's writes, or nothing at all.
POLLED_FSTYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "davfs",
        "ncpfs",
        "proc",
        "sysfs",
    }
)
POLL_FSTYPES_ENV = "SLOTLESS_INOTIFY_POLL_FSTYPES"
HEARD_NAMES = 100_000  # paths heard and not yet checked, kept at most (HeardNames)
HEARD_FOR = 60.0  # seconds a heard path is kept for its check (it runs within ms)
HEARD_KEY = "inotify-heard"  # the trigger context's shared HeardNames


def polled_fstypes() -> frozenset[str]:
    """:data:`POLLED_FSTYPES` and those named in ``SLOTLESS_INOTIFY_POLL_FSTYPES`` (comma
    separated; ``*`` polls every filesystem, i.e. turns inotify off)."""
    extra = {t.strip() for t in os.environ.get(POLL_FSTYPES_ENV, "").split(",") if t.strip()}
    return POLLED_FSTYPES | extra


def fstype_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The filesystem type of the mount that holds ``path`` (None if unknown)."""
    real = os.path.realpath(path)
    best, best_type = -1, None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mount = fields[4].replace("\\040", " ").replace("\\011", "\t")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) > best:
                    best, best_type = len(mount), right.split()[0]
    except OSError:
        return None
    return best_type


def _poll_reason(directory: str) -> str | None:
    polled = polled_fstypes()
    fstype = fstype_of(directory)
    if "*" in polled:
        return f"inotify is turned off ({POLL_FSTYPES_ENV}=*)"
    if fstype is None:
        return None
    if fstype in polled or fstype.startswith("fuse."):  # FUSE: writes may come from elsewhere
        return f"{directory} is on a {fstype} filesystem, where inotify does not see every write"
    return None


class HeardNames:
    """Paths the watches heard closed or moved in and that no check has read since
    (shared through the trigger context as ``inotify-heard``): a woken wait on an exact
    path stats that path alone instead of reading its whole directory (a burst of 1,000
    files over 10 directories would read a directory, and stat each of its entries, in
    every call). A watch hears every name in its directory, waited on or not, so a path
    is kept :data:`HEARD_FOR` seconds and at most :data:`HEARD_NAMES` of them; one
    forgotten is read with its directory, as when polled."""

    def __init__(self) -> None:
        self.paths: dict[str, float] = {}  # path -> when heard (monotonic), oldest first

    @classmethod
    async def create(cls) -> HeardNames:
        return cls()

    def note(self, directory: str, names: Iterable[str | None]) -> None:
        paths = self.paths
        now = time.monotonic()
        for name in names:
            if name is not None:
                path = os.path.join(directory, name)
                paths.pop(path, None)  # moved to the end: the newest
                paths[path] = now
        stale = now - HEARD_FOR
        while paths:
            oldest = next(iter(paths))
            if paths[oldest] >= stale and len(paths) <= HEARD_NAMES:
                break
            del paths[oldest]

    def take(self, path: str) -> bool:
        """Whether ``path`` was heard since it was last taken (and take it)."""
        try:
            del self.paths[path]
        except KeyError:
            return False
        return True


class InotifyDirectory(PushSource):
    """Wakes the waits of one directory: topics are the names closed or moved into it.

    ``creations``: the names created or moved into it instead, for waits on a name's mere
    existence (Airflow's FileTrigger fires on an empty file, or on a directory).
    """

    def __init__(self, directory: str, *, creations: bool = False) -> None:
        self.directory = directory
        self.creations = creations

    def describe(self) -> str:
        return f"inotify watch on {self.directory}"

    async def run(self, ctx: Any, ready: Callable[[], None], wake: Wake) -> None:
        # Reads /proc/self/mountinfo: not on the loop.
        reason = await to_thread(_poll_reason, self.directory)
        if reason is not None:
            raise PushUnavailable(reason)
        reader: _Reader = await ctx.shared("inotify", _Reader.open)
        heard: HeardNames = await ctx.shared(HEARD_KEY, HeardNames.create)
        directory = self.directory
        loop = asyncio.get_running_loop()

        # A directory that does not exist yet (a drop folder a producer creates with its
        # first file) is pushed all the same: the nearest existing ancestor is watched for
        # the next path component, one level at a time, until the directory itself can be.
        # Its waits count as pushed meanwhile; nothing can land before the directory does,
        # and once watched every one of them re-checks (a file may have landed between its
        # mkdir and the watch).
        announced = False
        while not os.path.lexists(directory):
            ancestor, below = _nearest_existing(directory)
            appeared: asyncio.Future[str] = loop.create_future()
            gone: asyncio.Future[str] = loop.create_future()

            def created(
                names: Iterable[str | None],
                below: str = below,
                appeared: asyncio.Future[str] = appeared,
            ) -> None:
                if (below in names or None in names) and not appeared.done():
                    appeared.set_result(below)

            watch = reader.watch(ancestor, created, gone, creations=True)
            try:
                if os.path.lexists(os.path.join(ancestor, below)):
                    continue  # created before the watch was set: look again
                if not announced:
                    ready()
                    announced = True
                done, _ = await asyncio.wait([appeared, gone], return_when=asyncio.FIRST_COMPLETED)
                if gone in done:
                    raise PushUnavailable(f"{ancestor}: {gone.result()}")
            finally:
                reader.unwatch(watch)
                for f in (appeared, gone):
                    f.cancel()

        def noted(names: Iterable[str | None]) -> None:
            names = list(names)
            heard.note(directory, names)  # before the wake: the woken checks read it
            wake(names)

        gone = loop.create_future()
        watch = reader.watch(directory, noted, gone, creations=self.creations)
        try:
            if announced:
                wake([None])
            else:
                ready()
            why = await gone
        finally:
            reader.unwatch(watch)
        raise PushUnavailable(why)


def _nearest_existing(directory: str) -> tuple[str, str]:
    """The deepest existing ancestor of ``directory``, and the name below it on the way."""
    path = os.path.abspath(directory)
    while True:
        parent, name = os.path.split(path)
        if os.path.lexists(parent) or parent == path:
            return parent, name
        path = parent


class _Reader:
    """The process's one inotify descriptor, read on the loop, events routed by watch."""

    def __init__(self) -> None:
        from asyncinotify import Inotify

        # Events read per wake-up of the loop: a burst of 1,000 files is a few reads.
        self._ino = Inotify(cache_size=512)
        # One kernel watch per inode: two sources on one directory (named through a
        # symlink, or one closing while its successor opens) get the same wd, so each wd
        # keeps every source that asked for it and is removed with the last.
        self._by_wd: dict[int, list[tuple[Wake, asyncio.Future[str], Any]]] = {}
        self._task = asyncio.get_running_loop().create_task(self._read(), name="inotify")

    @classmethod
    async def open(cls) -> _Reader:
        try:
            return cls()
        except ImportError as exc:  # not Linux: asyncinotify is not installed there
            raise PushUnavailable(f"no inotify binding here ({exc})") from exc
        except OSError as exc:  # EMFILE: fs.inotify.max_user_instances reached
            raise PushUnavailable(f"cannot open inotify: {exc}") from exc

    def watch(
        self, directory: str, wake: Wake, gone: asyncio.Future[str], *, creations: bool = False
    ) -> Any:
        """Route ``directory``'s names closed or moved in to ``wake``; with ``creations``,
        the names created in it instead (an ancestor watched for a directory to appear)."""
        from asyncinotify import Mask

        wanted = (Mask.CREATE | Mask.MOVED_TO) if creations else (Mask.CLOSE_WRITE | Mask.MOVED_TO)
        # MASK_ADD: one kernel watch per inode, and a second source on it must not take the
        # first one's events away; each source is handed only the events it asked for.
        mask = wanted | Mask.ONLYDIR | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.MASK_ADD
        try:
            watch = self._ino.add_watch(directory, mask)
        except OSError as exc:
            raise PushUnavailable(f"cannot watch {directory}: {exc.strerror or exc}") from exc
        self._by_wd.setdefault(watch.wd, []).append((wake, gone, wanted))
        return watch, gone

    def unwatch(self, token: Any) -> None:
        watch, gone = token
        held = self._by_wd.get(watch.wd)
        if held is None:
            return
        held[:] = [entry for entry in held if entry[1] is not gone]
        if not held:
            del self._by_wd[watch.wd]
            with contextlib.suppress(OSError, ValueError):
                self._ino.rm_watch(watch)

    async def _read(self) -> None:
        from asyncinotify import Mask

        try:
            async for event in self._ino:
                if Mask.Q_OVERFLOW in event.mask:  # events were lost: every wait re-checks
                    log.warning("inotify queue overflowed: every watched directory re-checks")
                    for held in list(self._by_wd.values()):
                        for wake, _, _ in held:
                            wake([None])
                    continue
                watch = event.watch
                entries = self._by_wd.get(watch.wd) if watch is not None else None
                if not entries:
                    continue
                if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED):
                    for _, gone, _ in entries:
                        if not gone.done():
                            gone.set_result("the directory was removed or moved")
                    continue
                if event.name is not None:
                    name = [str(event.name)]
                    for wake, _, wanted in entries:
                        if event.mask & wanted:
                            wake(name)
        except Exception as exc:  # the descriptor failed: every watch falls back
            for held in self._by_wd.values():
                for _, gone, _ in held:
                    if not gone.done():
                        gone.set_result(f"reading inotify failed: {exc}")

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        for held in self._by_wd.values():
            for _, gone, _ in held:
                if not gone.done():
                    gone.set_result("closed")
        self._by_wd.clear()
        self._ino.close()
