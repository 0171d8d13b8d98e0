"""The DAG catalogue: which DAGs a folder of DAG files declares, kept in the store.

:func:`scan` lists the ``*.py`` files at the top of a folder, imports each file whose
mtime changed since its last parse **in a child process of its own** (``python -c``,
through :func:`executor.loader.import_dags`, the import the workers use), and records what
each declares, or its one-line error, through the store (:mod:`executor.store.catalogue`).
Files that left the folder are dropped with their DAGs.

A child process, because a DAG file is user code: it may hang, raise, fail to compile,
call ``sys.exit()`` or ``os._exit()``, print, or leak threads. A child can be killed at
its time limit and its exit costs the caller nothing; nothing a file does at import
reaches the caller's interpreter or event loop (the children are asyncio subprocesses,
the folder listing runs in a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .dag import DAG
from .loader import DagImportError, import_dags
from .store.catalogue import DeclaredDag
from .store.runs import RunShape

if TYPE_CHECKING:  # the child process imports this module, and needs no store
    from .store.jobs import Store

DEFAULT_PARSE_TIMEOUT = 30.0
# How often a service with --dags lists its folder for changed files (mtimes only: cheap).
DEFAULT_RESCAN = 10.0
DAGS_ENV = "SLOTLESS_DAGS"
# A file's error is one line of the listing; a traceback-sized message is cut here.
MAX_ERROR = 500

# The child: `python -c _CHILD PATH TIMEOUT`. It imports only slotless and the DAG file.
_CHILD = "import sys; from executor.catalogue import _child; _child(sys.argv[1], sys.argv[2])"
# The root of the checkout or site-packages this slotless runs from, for the child's path.
_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True, slots=True)
class Parsed:
    """One file's parse: the DAGs it declares, or why it could not be imported."""

    dags: list[DeclaredDag] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ScanResult:
    parsed: list[str]  # files imported by this scan (new or changed)
    unchanged: list[str]  # files whose mtime matched their last parse: not imported
    removed: list[str]  # files that left the folder, dropped with their DAGs
    errors: dict[str, str]  # of the files parsed now: path -> the error stored


def dags_folder(given: str | Path | None) -> Path | None:
    """The folder named by ``--dags``, else by ``$SLOTLESS_DAGS``, else None."""
    given = given or os.environ.get(DAGS_ENV)
    return Path(given) if given else None


def dag_files(folder: Path) -> dict[str, float]:
    """``*.py`` at the top of ``folder`` (resolved) -> mtime. Names starting with ``_`` or ``.`` are
    skipped: ``__init__.py`` and private helpers are imported by DAG files, not DAGs."""
    if not folder.is_dir():
        raise NotADirectoryError(f"DAG folder {folder} is not a directory")
    found = {}
    for entry in os.scandir(folder):
        if entry.name.endswith(".py") and not entry.name.startswith(("_", ".")):
            with contextlib.suppress(FileNotFoundError):  # removed while we list
                if entry.is_file():
                    # The folder's path and the file's name, not the link's target: a
                    # symlinked file stays this folder's, and leaves it when removed.
                    found[str(folder / entry.name)] = entry.stat().st_mtime
    return found


async def scan(
    store: Store,
    folder: str | Path,
    *,
    timeout: float = DEFAULT_PARSE_TIMEOUT,
    jobs: int | None = None,
) -> ScanResult:
    """Bring the catalogue up to date with ``folder``: parse new and changed files (at most
    ``jobs`` at once, default one per core, each within ``timeout`` seconds), drop files
    that are gone. Never raises for what a DAG file does; raises for a missing folder."""
    folder = Path(folder).resolve()
    found = await asyncio.to_thread(dag_files, folder)
    known = await store.catalogue_files()
    # Only this folder's files: another process may catalogue another folder in this store.
    removed = sorted(p for p in known if Path(p).parent == folder and p not in found)
    await store.forget_files(removed)
    # The mtime is read before the import: a file changed during its parse is parsed again.
    changed = sorted(p for p, mtime in found.items() if known.get(p) != mtime)
    limit = asyncio.Semaphore(jobs or os.cpu_count() or 1)

    async def one(path: str) -> Parsed:
        async with limit:
            return await parse_file(path, timeout)

    results = await asyncio.gather(*(one(p) for p in changed))
    errors = {}
    for path, parsed in zip(changed, results, strict=True):
        stored = await store.record_parse(path, found[path], parsed.dags, parsed.error)
        if stored is not None:
            errors[path] = stored
    unchanged = sorted(set(found) - set(changed))
    return ScanResult(changed, unchanged, removed, errors)


async def keep_scanning(
    store: Store,
    folder: str | Path,
    *,
    every: float = DEFAULT_RESCAN,
    timeout: float = DEFAULT_PARSE_TIMEOUT,
    say: Callable[[str], None] = print,
) -> None:
    """:func:`scan` every ``every`` seconds until cancelled (a service's ``--dags DIR``):
    changed files are parsed again, which re-arms the schedules they changed. Each file
    that breaks is reported once through ``say``; a scan that fails (the database is down,
    the folder is gone) is reported and tried again, never ending the service."""
    reported: dict[str, str] = {}
    while True:
        try:
            result = await scan(store, folder, timeout=timeout)
        except Exception as exc:
            say(f"cannot scan DAG folder {folder}: {type(exc).__name__}: {exc}")
        else:
            for path in result.parsed:
                error = result.errors.get(path)
                if error is None:
                    reported.pop(path, None)
                elif reported.get(path) != error:
                    say(f"DAG file {path} is broken: {error}")
                    reported[path] = error
            for path in result.removed:
                reported.pop(path, None)
            if result.parsed:
                say(f"parsed {len(result.parsed)} DAG file(s) of {folder}")
        await asyncio.sleep(every)


async def parse_file(path: str, timeout: float = DEFAULT_PARSE_TIMEOUT) -> Parsed:
    """Import ``path`` in a child process, killed after ``timeout`` seconds."""
    # The child imports the slotless this process runs, wherever it was started from.
    path_var = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, path, repr(timeout),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path_var},
        # Its own process group, so that a kill also ends what the file started.
        start_new_session=True,
    )  # fmt: skip
    try:
        # A little over the limit: the child dumps its stack at the limit and exits itself.
        out, err = await asyncio.wait_for(proc.communicate(), timeout + 2.0)
    except TimeoutError:
        out, err = b"", b""
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    return _judge(path, timeout, proc.returncode, out, err.decode(errors="replace"))


def _judge(path: str, timeout: float, code: int | None, out: bytes, err: str) -> Parsed:
    """What the child's output says: its JSON result, or why there is none."""
    try:
        result = json.loads(out)
    except ValueError:
        result = None
    if isinstance(result, dict) and "error" in result:
        return Parsed(error=_one_line(result["error"]))
    if isinstance(result, dict):
        return Parsed(dags=[DeclaredDag(**d) for d in result["dags"]])
    if "Timeout (" in err or code is None or code == -signal.SIGKILL:
        # faulthandler's dump lists the innermost frame first: where the import was stuck.
        stuck = re.search(rf'File "{re.escape(path)}", line (\d+)', err)
        where = f" (line {stuck.group(1)})" if stuck else ""
        return Parsed(error=f"cannot import {path}: did not finish within {timeout:g} s{where}")
    last = next((line for line in reversed(err.splitlines()) if line.strip()), "no output")
    return Parsed(error=_one_line(f"cannot import {path}: exited with status {code}: {last}"))


def _one_line(text: str) -> str:
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."


def _declared(dag: object, dag_id: str) -> dict[str, object]:
    """What the catalogue stores of a DAG: when it starts (its schedule's text, zone and
    dates, the logical date of the first run its schedule would create now, its start
    condition) and its shape, so that the triggerer creates runs without importing it."""
    assert isinstance(dag, DAG)
    schedule = dag.schedule
    nxt = None
    if schedule is not None:
        first = schedule.first_interval(datetime.now(UTC), catchup=dag.catchup)
        nxt = None if first is None else first.logical_date.isoformat()
    when = None
    if dag.start_when is not None:
        when = json.dumps(list(dag.start_when.serialize()), sort_keys=True)
    return {
        "dag_id": dag_id,
        "schedule": None if schedule is None else str(schedule),
        "timezone": str(dag.timezone),
        "next_logical_date": nxt,
        "start_date": _iso(None if schedule is None else schedule.start_date),
        "end_date": _iso(None if schedule is None else schedule.end_date),
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "start_when": when,
        "shape": RunShape.of(dag).to_json(),
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _child(path: str, timeout: str) -> None:
    """In the child process: import ``path``, write one JSON object to the real stdout."""
    result = os.fdopen(os.dup(1), "w")
    # What the DAG file prints goes to stderr, so that stdout carries only the result.
    os.dup2(2, 1)
    # At the limit, write every thread's stack to stderr and exit: the parent reads where
    # the import was stuck from it (and kills the child anyway shortly after).
    faulthandler.dump_traceback_later(float(timeout), exit=True)
    try:
        payload: dict[str, object] = {
            "dags": [_declared(dag, dag_id) for dag_id, dag in import_dags(path).items()]
        }
    except DagImportError as exc:
        payload = {"error": str(exc)}
    faulthandler.cancel_dump_traceback_later()
    result.write(json.dumps(payload))
    result.flush()
    # Threads the file started must not keep the child (and the parent's wait) alive.
    os._exit(0)
