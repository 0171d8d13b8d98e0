"""FileTrigger: a local path or glob exists (batched: one listing per directory; pushed by
inotify, one watch per directory, where the filesystem has it)."""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from collections import defaultdict
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from pydantic import field_validator

from .base import BaseTrigger, TriggerEvent
from .context import TriggerContext, to_thread
from .inotify import HEARD_KEY, HeardNames, InotifyDirectory
from .push import PushInterest


class FileTrigger(BaseTrigger):
    """Fires when ``path`` (a file path or a glob such as ``/in/*.csv``) exists.

    ``min_size`` (bytes) waits until a matching file is at least that large.
    """

    path: str
    min_size: int = 0

    @field_validator("path")
    @classmethod
    def _valid_glob(cls, value: str) -> str:
        if not value:
            raise ValueError("path must not be empty")
        if value.count("[") != value.count("]"):
            raise ValueError(f"malformed glob {value!r}: unbalanced brackets")
        return value

    def describe(self) -> str:
        return f"file://{self.path}"

    @property
    def is_glob(self) -> bool:
        return glob.has_magic(self.path)

    def run_requests(self, payload: Any) -> list[tuple[str | None, Any]]:
        """As a start condition, a glob starts one run per matching file, keyed
        ``file://PATH`` (``ctx.start_event``: ``{"path": ...}``); a plain path starts one
        run per date."""
        if not self.is_glob:
            return [(None, payload)]
        return [(f"file://{p}", {"path": p}) for p in payload["paths"]]

    def push_interest(self, ctx: TriggerContext) -> PushInterest | None:
        """Woken by the inotify watch of its directory (one per directory, however many
        waits): by its file's name, or any name its glob matches. A glob in the directory
        part (``/in/*/done``) is polled."""
        directory, name = os.path.split(self.path)
        if glob.has_magic(directory):
            return None
        directory = os.path.abspath(directory or ".")
        opener = partial(InotifyDirectory, directory)
        if glob.has_magic(name):
            return PushInterest(("inotify", directory), opener, pattern=fnmatch.translate(name))
        return PushInterest(("inotify", directory), opener, topic=name)

    @classmethod
    async def poke_many(
        cls, triggers: Sequence[BaseTrigger], ctx: TriggerContext
    ) -> Sequence[TriggerEvent | BaseException | None]:
        heard: HeardNames = await ctx.shared(HEARD_KEY, HeardNames.create)
        by_dir: dict[str, list[FileTrigger]] = defaultdict(list)
        alone: list[FileTrigger] = []  # woken by their own name: a stat each, no listing
        for t in triggers:
            assert isinstance(t, FileTrigger)
            if heard.paths and not t.is_glob and heard.take(os.path.abspath(t.path)):
                alone.append(t)
            else:
                by_dir[os.path.dirname(t.path) or "."].append(t)
        listings, sizes = await to_thread(_read, list(by_dir), [t.path for t in alone])
        results: dict[int, TriggerEvent | BaseException | None] = {}
        for directory, group in by_dir.items():
            entries = listings.get(directory)
            for t in group:
                results[id(t)] = _match(t, directory, entries)
        for t in alone:
            directory = os.path.dirname(t.path) or "."
            size = sizes[t.path]
            entries = None if size is None else {os.path.basename(t.path): size}
            results[id(t)] = _match(t, directory, entries)
        return [results[id(t)] for t in triggers]


def _read(
    directories: list[str], paths: list[str]
) -> tuple[dict[str, dict[str, int] | None], dict[str, int | None]]:
    """The directories' listings and the paths' sizes (None: not a file, or not there),
    in one trip to a thread."""
    listings = _list_dirs(directories) if directories else {}
    return listings, {p: _file_size(p) for p in paths}


def _file_size(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _list_dirs(directories: list[str]) -> dict[str, dict[str, int] | None]:
    out: dict[str, dict[str, int] | None] = {}
    for d in directories:
        try:
            with os.scandir(d) as it:
                out[d] = _sizes(it)
        except OSError:  # the directory is not there (yet), or not readable
            out[d] = None
    return out


def _sizes(entries: Iterable[os.DirEntry[str]]) -> dict[str, int]:
    """Name -> size of the files among ``entries``. An entry that vanished between the
    directory read and its stat (a writer's temporary file renamed into place meanwhile)
    is left out alone: failing the whole listing would answer "not yet" for every wait of
    the directory, and a wait woken by a push would then sleep until its safety poll."""
    sizes: dict[str, int] = {}
    for e in entries:
        try:
            if e.is_file():
                sizes[e.name] = e.stat().st_size
        except OSError:
            continue
    return sizes


def _match(t: FileTrigger, directory: str, entries: dict[str, int] | None) -> TriggerEvent | None:
    if entries is None:
        return None
    pattern = os.path.basename(t.path)
    names = (
        fnmatch.filter(entries, pattern) if t.is_glob else [pattern] if pattern in entries else []
    )
    found = sorted(n for n in names if entries[n] >= t.min_size)
    if not found:
        return None
    return TriggerEvent(payload={"paths": [os.path.join(directory, n) for n in found]})
