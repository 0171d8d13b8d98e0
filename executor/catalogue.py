"""The DAG catalogue: which DAGs a folder of DAG files declares, kept in the store.

:func:`scan` lists the ``*.py`` files at the top of a folder, imports each file whose
mtime changed since its last parse **in a child process of its own** (through
:func:`executor.loader.import_dags`, the import the workers use), and records what each
declares, or its one-line error, through the store (:mod:`executor.store.catalogue`).
Files that left the folder are dropped with their DAGs.

A child process, because a DAG file is user code: it may hang, raise, fail to compile,
call ``sys.exit()`` or ``os._exit()``, kill itself, print, leak threads or start processes
of its own. A child can be killed at its time limit, with its process group (what the file
started), and its exit costs the caller nothing; nothing a file does at import reaches the
caller's interpreter or event loop (the caller only exchanges pipe messages on its loop;
the folder listing runs in a thread).

**A forkserver**, because a fresh interpreter per file costs a Python start-up and
``import executor`` (~45 ms of CPU): 1,000 files took ~50 s on 2 cores. A scan with files to
parse starts one ``python -c`` child, the forkserver, that imports slotless (the executor,
pydantic, cronsim, the triggers) once and then forks one grandchild per DAG file. A fork of
a process that has imported all that costs ~1 ms, and each grandchild still starts from a
state no DAG file has touched: nothing one file imports or patches is seen by the next.
The grandchild is :func:`_child` (its own process group, the import within
a faulthandler time limit, a JSON result on a pipe, ``os._exit``); it starts the
import only once the caller has been told its pid. The forkserver reads its pipes, and
when it exits kills what is left of its group, reaps it and reports its exit status and
output to the caller. The caller still enforces the limit from outside: a grandchild not
done :data:`KILL_GRACE` after its limit is killed with its process group (SIGKILL), so a
forkserver that is slow or stuck cannot stretch a file's limit.

Why not the alternatives: ``multiprocessing``'s forkserver gives no process group per task
and no control over the child's file descriptors or how it ends; a fork of the caller itself
would copy its event loop, threads and database connections into user code; a pool of
long-lived interpreters that import files one after another would let one file's imports
and monkey-patches leak into the next.

The forkserver lives for one scan (an unchanged folder starts none): a service rescans its
folder every few seconds and most rescans parse nothing, so one kept between scans would
mostly idle, and one per scan needs no restart logic beyond the retry below. If it dies,
every file in flight in it (their groups killed at once) is tried once more in a fresh
one, then listed with the reason; a forkserver that dies before it says it is ready (it
cannot import slotless) fails the rest of the scan's files with its error at once rather
than start again for each file.

Linux only: ``os.fork``, ``os.pidfd_open`` (Linux 5.3) and process groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import itertools
import json
import os
import re
import selectors
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .assets import declared
from .dag import DAG
from .errors import DagError
from .loader import DagImportError, import_dags
from .store.catalogue import DeclaredDag
from .store.lines import one_line
from .store.runs import RunShape

if TYPE_CHECKING:  # the forkserver imports this module, and needs no store
    from .store import Store

DEFAULT_PARSE_TIMEOUT = 30.0
# How often a service with --dags lists its folder for changed files (mtimes only: cheap).
DEFAULT_RESCAN = 10.0
DAGS_ENV = "SLOTLESS_DAGS"
# After a file's limit, before the caller kills it: time for the grandchild's own dump of
# its stack (which says where it was stuck) to arrive.
KILL_GRACE = 2.0
# After that kill, for the forkserver to report the exit; a process the kernel cannot end
# (stuck in uninterruptible I/O) is given up on rather than hang the scan.
REPLY_GRACE = 5.0
# The end of a file's stderr kept: its last line, or the stack dumped at the limit. What a
# file prints at import goes there too, and may be any size.
ERR_TAIL = 64 * 1024

# The forkserver: it imports slotless, the triggers and the DAG file's usual imports once.
_SERVE = "import triggers; from executor.catalogue import _serve; _serve()"
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
    by_hand: bool = False,
) -> ScanResult:
    """Bring the catalogue up to date with ``folder``: parse new and changed files (at most
    ``jobs`` at once, default one per core, each within ``timeout`` seconds), drop files
    that are gone. Never raises for what a DAG file does; raises for a missing folder.

    ``by_hand``: a command run from a shell, whose environment (``PYTHONPATH``, installed
    packages, ``SLOTLESS_ALLOWED_TRIGGERS``) may not be the one the services run DAGs in.
    What it parses is recorded as provisional: every scan, a service's included, parses
    those files again, and only a service's parse settles a file. So a hand-run command
    never decides for the services that a file is broken (or healthy), and it never
    re-parses a file the services have settled (its mtime is unchanged)."""
    folder = Path(folder).resolve()
    found = await asyncio.to_thread(dag_files, folder)
    known = await store.catalogue.catalogue_files()
    # Only this folder's files: another process may catalogue another folder in this store.
    removed = sorted(p for p in known if Path(p).parent == folder and p not in found)
    await store.catalogue.forget_files(removed)
    # The mtime is read before the import: a file changed during its parse is parsed again.
    changed = sorted(p for p, mtime in found.items() if known.get(p) != mtime)
    limit = asyncio.Semaphore(jobs or os.cpu_count() or 1)
    parser = _Parser(timeout)

    async def one(path: str) -> Parsed:
        async with limit:
            return await parser.parse(path)

    try:
        results = await asyncio.gather(*(one(p) for p in changed))
    finally:
        await parser.close()
    errors = {}
    for path, parsed in zip(changed, results, strict=True):
        stored = await store.catalogue.record_parse(
            path, found[path], parsed.dags, parsed.error, settled=not by_hand
        )
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
    """Import one file as :func:`scan` does, in a forkserver started for it alone."""
    parser = _Parser(timeout)
    try:
        return await parser.parse(path)
    finally:
        await parser.close()


class _ServerDied(Exception):
    """The forkserver ended with files in flight; the message says why, in one line."""


class _Parser:
    """A scan's files, parsed in its forkserver: started for the first file, and again
    after it died (each file is tried in at most two)."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._server: _ForkServer | None = None
        self._starting = asyncio.Lock()
        self._broken: str | None = None  # why a forkserver could not start

    async def parse(self, path: str) -> Parsed:
        why = ""
        for _ in range(2):
            if self._broken is not None:
                break
            server = await self._running()
            try:
                return await server.parse(path, self._timeout)
            except _ServerDied as died:
                why = str(died)
        why = self._broken or f"the process that imports it died twice: {why}"
        return Parsed(error=one_line(f"cannot import {path}: {why}"))

    async def _running(self) -> _ForkServer:
        # A lock: the files in flight when a forkserver dies all ask for the next at once.
        async with self._starting:
            if self._server is not None and not self._server.alive:
                await self._server.close()
                if not self._server.ready:
                    self._broken = f"the process that imports DAG files failed: {self._server.why}"
                self._server = None
            if self._server is None:
                self._server = await _ForkServer.start()
            return self._server

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()


@dataclass(slots=True)
class _Job:
    """One file in flight: its grandchild's pid once forked, then the forkserver's report."""

    reply: asyncio.Future[dict[str, Any]]
    pid: int | None = None


class _ForkServer:
    """The caller's side of one forkserver: requests on its stdin, reports on its stdout
    (length-prefixed JSON frames), read by one task on the caller's loop."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._jobs: dict[int, _Job] = {}
        self._ids = itertools.count()
        self.ready = False  # it has imported slotless and serves
        self.why: str | None = None  # set when it ended: why, from its stderr
        assert proc.stderr is not None
        # Read all along: a forkserver blocked on a full stderr pipe would stop serving.
        self._stderr = asyncio.create_task(proc.stderr.read())
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls) -> _ForkServer:
        # It imports the slotless this process runs, wherever it was started from.
        path_var = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _SERVE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path_var},
            # Out of the caller's process group: a Ctrl-C in a terminal reaches the caller,
            # which ends the forkserver by closing its stdin (and so its grandchildren).
            start_new_session=True,
        )  # fmt: skip
        return cls(proc)

    @property
    def alive(self) -> bool:
        return self.why is None

    async def parse(self, path: str, timeout: float) -> Parsed:
        """Import ``path`` in a grandchild, killed with its group after ``timeout`` (and
        the grace for its own dump). Raises :class:`_ServerDied` if the forkserver ends."""
        if self.why is not None:
            raise _ServerDied(self.why)
        key = next(self._ids)
        job = _Job(asyncio.get_running_loop().create_future())
        self._jobs[key] = job
        killed = False
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(_frame({"id": key, "path": path, "timeout": timeout}))
            with contextlib.suppress(ConnectionError):  # it died: the reader fails the job
                await self._proc.stdin.drain()
            try:
                report = await asyncio.wait_for(asyncio.shield(job.reply), timeout + KILL_GRACE)
            except TimeoutError:
                killed = True
                _kill_group(job.pid)
                try:
                    report = await asyncio.wait_for(job.reply, REPLY_GRACE)
                except TimeoutError:
                    report = {"code": None, "out": "", "err": ""}
        finally:
            del self._jobs[key]
        return _judge(path, timeout, report["code"], report["out"], report["err"], killed)

    async def _read(self) -> None:
        assert self._proc.stdout is not None
        try:
            while True:
                size = int.from_bytes(await self._proc.stdout.readexactly(4), "big")
                report = json.loads(await self._proc.stdout.readexactly(size))
                if "ready" in report:
                    self.ready = True
                    continue
                job = self._jobs.get(report["id"])
                if job is None:
                    continue  # the late report of a file already given up on
                if "pid" in report:
                    job.pid = report["pid"]
                elif not job.reply.done():
                    job.reply.set_result(report)
        except asyncio.IncompleteReadError:
            pass  # its stdout is closed: only its exit closes it (grandchildren never hold it)
        err = (await self._stderr).decode(errors="replace")
        code = await self._proc.wait()
        last = next((line for line in reversed(err.splitlines()) if line.strip()), None)
        self.why = one_line(f"exited with status {code}" + (f": {last}" if last else ""))
        for job in self._jobs.values():
            # Its grandchildren are orphans now, and nobody would end them at their limit.
            _kill_group(job.pid)
            if not job.reply.done():
                job.reply.set_exception(_ServerDied(self.why))

    async def close(self) -> None:
        """End it: at EOF on its stdin it kills what is still running and exits."""
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        await self._reader


def _kill_group(pid: int | None) -> None:
    if pid is not None:
        # A grandchild's pid is its process group's id (it leads its group).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return len(body).to_bytes(4, "big") + body


def _judge(path: str, timeout: float, code: int | None, out: str, err: str, killed: bool) -> Parsed:
    """What the grandchild's output says: its JSON result, or why there is none."""
    try:
        result = json.loads(out)
    except ValueError:
        result = None
    if isinstance(result, dict) and "error" in result:
        return Parsed(error=one_line(result["error"]))
    if isinstance(result, dict):
        return Parsed(dags=[DeclaredDag(**d) for d in result["dags"]])
    if "Timeout (" in err or killed:
        # faulthandler's dump lists the innermost frame first: where the import was stuck.
        stuck = re.search(rf'File "{re.escape(path)}", line (\d+)', err)
        where = f" (line {stuck.group(1)})" if stuck else ""
        return Parsed(error=f"cannot import {path}: did not finish within {timeout:g} s{where}")
    last = next((line for line in reversed(err.splitlines()) if line.strip()), "no output")
    how = f"exited with status {code}"
    if code is not None and code < 0:  # a signal we did not send: the file killed itself
        how = f"killed by signal {-code}"
    return Parsed(error=one_line(f"cannot import {path}: {how}: {last}"))


def _declared(dag: object, dag_id: str) -> dict[str, object]:
    """What the catalogue stores of a DAG: when it starts (its schedule as JSON, the
    logical date of the first run that schedule would create now, its start condition)
    and its shape, so that the triggerer creates runs without importing it."""
    assert isinstance(dag, DAG)
    schedule = dag.schedule
    nxt = None
    if schedule is not None:
        first = schedule.first_interval(datetime.now(UTC))
        nxt = None if first is None else first.logical_date.isoformat()
    when = None
    if dag.start_when is not None:
        when = json.dumps(list(dag.start_when.serialize()), sort_keys=True)
    return {
        "dag_id": dag_id,
        "schedule": None if schedule is None else schedule.to_json(),
        "timezone": str(dag.timezone),
        "next_logical_date": nxt,
        "max_active_runs": dag.max_active_runs,
        "start_when": when,
        "shape": RunShape.of(dag).to_json(),
        "assets": _assets_declared(dag),
    }


def _assets_declared(dag: DAG) -> str | None:
    """What the catalogue stores of a DAG's assets (None: it names none)."""
    outlets = {t.task_id: t.outlets for t in dag.tasks.values() if t.outlets}
    if dag.asset_schedule is None and not outlets:
        return None
    return json.dumps(declared(dag.asset_schedule, outlets), sort_keys=True)


def _validated(path: str, dag_id: str, dag: DAG) -> None:
    """Check ``dag`` as ``slotless run`` and ``slotless trigger`` do before they start a
    run: a cycle or a refused trigger class breaks the file here, where it is listed, rather
    than a scheduled run that never has a task ready (or a sensor that cannot defer)."""
    try:
        dag.validate()
    except DagError as exc:
        raise DagImportError(f"{path}: DAG {dag_id!r}: {exc}") from None


def _child(path: str, timeout: str) -> None:
    """In the grandchild: import ``path``, write one JSON object to the real stdout."""
    result = os.fdopen(os.dup(1), "w")
    # What the DAG file prints goes to stderr, so that stdout carries only the result.
    os.dup2(2, 1)
    # At the limit, write every thread's stack to stderr and exit: the parent reads where
    # the import was stuck from it (and kills the child anyway shortly after).
    faulthandler.dump_traceback_later(float(timeout), exit=True)
    try:
        dags = import_dags(path)
        for dag_id, dag in dags.items():
            _validated(path, dag_id, dag)
        payload: dict[str, object] = {
            "dags": [_declared(dag, dag_id) for dag_id, dag in dags.items()]
        }
    except DagImportError as exc:
        payload = {"error": str(exc)}
    faulthandler.cancel_dump_traceback_later()
    result.write(json.dumps(payload))
    result.flush()
    # Threads the file started must not keep the child (and the parent's wait) alive.
    os._exit(0)


# -- in the forkserver -----------------------------------------------------------------


def _serve() -> None:
    """The forkserver: one grandchild per request read on stdin until EOF, then it kills the
    groups of grandchildren still running and returns. Single-threaded, so that a fork
    copies no lock held by another thread; every wait is one ``select``."""
    requests, replies = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    # Nothing printed in this process may land among the reports.
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    # The imported modules' objects stay out of the collector's reach: a collection in a
    # grandchild would otherwise write to (and so copy) every page they live on.
    gc.freeze()
    server = _Server(requests, replies, devnull)
    server.reply({"ready": True})
    while server.serving:
        for key, _ in server.selector.select():
            key.data()
    server.stop()


@dataclass(eq=False, slots=True)
class _Grandchild:
    key: int  # the caller's id for the request
    pid: int
    pidfd: int
    out_fd: int | None
    err_fd: int | None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)


class _Server:
    """The forkserver's state: its pipes to the caller, and its grandchildren by pid. Each
    registered fd's data is the callable that handles it being readable."""

    def __init__(self, requests: int, replies: int, devnull: int) -> None:
        self._requests, self._replies, self._devnull = requests, replies, devnull
        self._pending = bytearray()
        self._children: dict[int, _Grandchild] = {}
        self.serving = True
        self.selector = selectors.DefaultSelector()
        self.selector.register(requests, selectors.EVENT_READ, self._on_request)

    def _on_request(self) -> None:
        data = os.read(self._requests, 65536)
        if not data:
            self.serving = False
            return
        self._pending += data
        while len(self._pending) >= 4:
            size = int.from_bytes(self._pending[:4], "big")
            if len(self._pending) < 4 + size:
                break
            request = json.loads(self._pending[4 : 4 + size])
            del self._pending[: 4 + size]
            self._fork(request["id"], request["path"], request["timeout"])

    def _fork(self, key: int, path: str, timeout: float) -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _grandchild(path, timeout, self._devnull, (go_r, go_w), out_w, err_w)
        # Its own process group, here as well as in the grandchild: whichever runs first,
        # the group exists before anyone is told the pid and may kill it.
        os.setpgid(pid, pid)
        for fd in (go_r, out_w, err_w):
            os.close(fd)
        child = _Grandchild(key, pid, os.pidfd_open(pid), out_r, err_r)
        self._children[pid] = child
        for fd, on_ready in (
            (out_r, lambda: self._on_output(child, "out")),
            (err_r, lambda: self._on_output(child, "err")),
            (child.pidfd, lambda: self._on_exit(child)),
        ):
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ, on_ready)
        self.reply({"id": key, "pid": pid})
        # Only now may the file run: the caller knows its pid, and can kill its group even
        # if the file kills this process first.
        os.write(go_w, b"x")
        os.close(go_w)

    def _on_output(self, child: _Grandchild, which: str) -> None:
        """Read what is there now; at EOF stop watching the pipe."""
        fd = child.out_fd if which == "out" else child.err_fd
        assert fd is not None
        buffer = child.out if which == "out" else child.err
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not data:
                self.selector.unregister(fd)
                os.close(fd)
                setattr(child, f"{which}_fd", None)
                return
            buffer += data
            if which == "err":
                del buffer[:-ERR_TAIL]

    def _on_exit(self, child: _Grandchild) -> None:
        # Unreaped, the grandchild's pid (and so its group's id) cannot be reused: the kill
        # of what it left running reaches no stranger.
        _kill_group(child.pid)
        _, status = os.waitpid(child.pid, 0)
        # What it wrote before it exited is in the pipes; a process it started elsewhere
        # (a new session) may hold them open for ever, so no wait for EOF.
        for which in ("out", "err"):
            if getattr(child, f"{which}_fd") is not None:
                self._on_output(child, which)
        for fd in (child.out_fd, child.err_fd):
            if fd is not None:
                self.selector.unregister(fd)
                os.close(fd)
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        del self._children[child.pid]
        self.reply(
            {
                "id": child.key,
                "code": os.waitstatus_to_exitcode(status),
                "out": child.out.decode(errors="replace"),
                "err": child.err.decode(errors="replace"),
            }
        )

    def reply(self, message: dict[str, Any]) -> None:
        frame = _frame(message)
        while frame:
            frame = frame[os.write(self._replies, frame) :]

    def stop(self) -> None:
        """The caller is done (or gone): end what is still running."""
        for pid in list(self._children):
            _kill_group(pid)
            os.waitpid(pid, 0)


def _grandchild(
    path: str, timeout: float, devnull: int, go: tuple[int, int], out_w: int, err_w: int
) -> NoReturn:
    try:
        # A process group of its own: one kill ends the file and what it started. (No new
        # session needed: the forkserver's has no terminal for a file to read or be hung up by.)
        os.setpgid(0, 0)
        os.close(go[1])
        if not os.read(go[0], 1):
            os._exit(70)  # the forkserver died first: no one would know of this process
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        # The forkserver's pipes and the other files' pipes: a file (or a process it leaves
        # behind) holding them would keep them open.
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        _child(path, repr(timeout))
    finally:
        os._exit(70)  # never back into the forkserver's loop, whatever happened
