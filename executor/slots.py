"""Running one task callable in a worker slot: in a thread, or in a forked process.

A thread cannot be killed, so in thread isolation an execution timeout fails the attempt
but the slot stays taken until the callable returns; an attempt the worker lost (reaped
after a pause, cancelled) is interrupted at its next Python instruction (an exception
raised in its thread), which cannot cut short a call blocked in C (a sleep, a socket
read): it ends when that call returns. Process isolation kills the child; and a child
stops by itself once its worker's heartbeats no longer cover its attempt (the worker
paused or cut off from the database), before another worker may run it again. A child's
log lines reach the worker as they are written, so a child killed keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import math
import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .context import TaskContext, TaskDeferred

# A child's exit status when it stopped itself: its worker's heartbeats lapsed.
FENCED_EXIT = 75
FENCE_POLL = 0.05  # seconds between two looks of a child at its fence


@dataclass(slots=True)
class Result:
    ok: bool
    value: Any = None  # the callable's return value (thread mode) or its JSON (process)
    error: BaseException | None = None
    message: str = ""
    traceback: str | None = None
    timed_out: bool = False
    value_is_json: bool = False
    deferred: TaskDeferred | None = None


Job = Callable[[], Any]


class AttemptLost(BaseException):
    """Raised in a slot thread whose attempt its worker no longer holds. A BaseException,
    so that a task's ``except Exception`` does not swallow it."""


LOST_MESSAGE = "stopped: this worker no longer holds the attempt (reaped, cancelled or cleared)"


def call(job: Job) -> Result:
    """Run a task's callable; its failure (or deferral) is data, never a worker crash."""
    try:
        return Result(ok=True, value=job())
    except TaskDeferred as deferral:
        return Result(ok=False, deferred=deferral, message=str(deferral))
    except AttemptLost:
        return Result(ok=False, message=LOST_MESSAGE)
    except BaseException as exc:
        return Result(
            ok=False,
            error=exc,
            message=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Have ``thread_id`` raise ``exc`` at its next Python instruction (None: forget one
    asked for and not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class ThreadSlots:
    def __init__(self, slots: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="slot")
        self._lock = threading.Lock()
        self._threads: dict[int, int] = {}  # key -> the thread running its attempt

    async def run(
        self,
        job: Job,
        ctx: TaskContext,
        timeout: float | None,
        release: asyncio.Event,
        key: int | None = None,
    ) -> Result:
        """Run in a thread; ``release`` is set when the thread is really free again."""
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self._call, job, key)
        fut.add_done_callback(lambda _: release.set())
        done, _ = await asyncio.wait({fut}, timeout=timeout)
        if not done:
            return Result(
                ok=False,
                timed_out=True,
                message=f"execution timeout: still running after {timeout:g} s "
                "(thread isolation cannot stop it; its slot stays busy)",
            )
        try:
            return fut.result()
        except AttemptLost:  # raised as the callable returned, past call()'s own handler
            return Result(ok=False, message=LOST_MESSAGE)

    def _call(self, job: Job, key: int | None) -> Result:
        if key is None:
            return call(job)
        me = threading.get_ident()
        with self._lock:
            self._threads[key] = me
        try:
            return call(job)
        finally:
            with self._lock:
                if self._threads.get(key) == me:
                    del self._threads[key]
                # Asked for as the callable returned and not raised yet: it must not reach
                # the next attempt this thread runs.
                _raise_in(me, None)

    def stop(self, key: int) -> None:
        """Interrupt the attempt of ``key`` at its next Python instruction: AttemptLost is
        raised in its thread (a call blocked in C, a sleep, returns first)."""
        with self._lock:
            thread = self._threads.pop(key, None)
            if thread is not None:
                _raise_in(thread, AttemptLost)

    def fence(self, until: float) -> None:
        """A thread stops with its process: paused together, nothing to fence."""

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ProcessSlots:
    """One forked child per attempt, so a hung or crashing task can be killed alone."""

    def __init__(self, slots: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="slot-proc")
        self._mp = multiprocessing.get_context("fork")
        self._children: dict[int, Any] = {}  # key -> the child running it, to stop it
        # The monotonic time (one clock for every process of the host) until which the
        # worker's last heartbeat covers its attempts, in memory the children share: a
        # child past it stops by itself, although its worker is paused and cannot say so.
        self._fence = self._mp.RawValue("d", math.inf)

    def fence(self, until: float) -> None:
        self._fence.value = until

    async def run(
        self,
        job: Job,
        ctx: TaskContext,
        timeout: float | None,
        release: asyncio.Event,
        key: int | None = None,
    ) -> Result:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._pool, self._fork_and_wait, job, ctx, timeout, key
            )
        finally:
            release.set()

    def stop(self, key: int) -> None:
        """Kill the child running ``key`` (if any): its attempt ends "task process died"."""
        child = self._children.get(key)
        if child is not None:
            with contextlib.suppress(ProcessLookupError, ValueError, AttributeError):
                child.kill()

    def _fork_and_wait(
        self, job: Job, ctx: TaskContext, timeout: float | None, key: int | None
    ) -> Result:
        reader, writer = self._mp.Pipe(duplex=False)
        child = self._mp.Process(
            target=_child_main, args=(job, ctx, writer, self._fence), daemon=True
        )
        child.start()
        if key is not None:
            self._children[key] = child
        writer.close()
        try:
            return self._wait(child, reader, ctx, timeout)
        finally:
            if key is not None:
                self._children.pop(key, None)

    def _wait(self, child: Any, reader: Any, ctx: TaskContext, timeout: float | None) -> Result:
        """The child's log lines as they come, then its result; or its death, or the
        timeout (the child killed: the lines it wrote before are kept all the same)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not reader.poll(left):
                    child.kill()
                    child.join()
                    return Result(
                        ok=False,
                        timed_out=True,
                        message=f"execution timeout: killed after {timeout:g} s",
                    )
                kind, body = reader.recv()
                if kind == "log":
                    ctx._logs.append(body)
                    continue
                if kind == "value":  # ctx.push in the child: key, JSON
                    ctx._pushed[body[0]] = body[1]
                    continue
                if kind == "asset":  # ctx.asset_event in the child: (uri, extra JSON)
                    ctx._asset_extras[body[0]] = body[1]
                    continue
                ok, payload, message, tb, deferred = body
                break
        except EOFError:
            child.join()
            if child.exitcode == FENCED_EXIT:
                return Result(
                    ok=False,
                    message="task process stopped by itself: its worker's heartbeats had "
                    "lapsed (paused, or cut off from the database), so the attempt may "
                    "run elsewhere",
                )
            return Result(ok=False, message=f"task process died (exit code {child.exitcode})")
        finally:
            reader.close()
        child.join()
        return Result(
            ok=ok, value=payload, message=message, traceback=tb, value_is_json=ok, deferred=deferred
        )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Streamed(list[tuple[float, str]]):
    """A child's log: each line goes to the worker as it is written, not at the end, so
    that a child killed (its timeout, its attempt lost) keeps what it logged."""

    def __init__(self, writer: Any, lock: threading.Lock) -> None:
        super().__init__()
        self._writer = writer
        self._lock = lock

    def append(self, line: Any) -> None:
        with self._lock:
            self._writer.send(("log", line))


class _StreamedValues(dict[str, str]):
    """A child's ``ctx.push`` values, each sent to the worker as it is pushed (the worker
    records them with the attempt's SUCCESS)."""

    def __init__(self, writer: Any, lock: threading.Lock) -> None:
        super().__init__()
        self._writer = writer
        self._lock = lock

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        with self._lock:
            self._writer.send(("value", (key, value)))


class _StreamedExtras(dict[str, str]):
    """A child's ``ctx.asset_event`` extras, sent to the worker as they are set."""

    def __init__(self, writer: Any, lock: threading.Lock) -> None:
        super().__init__()
        self._writer = writer
        self._lock = lock

    def __setitem__(self, uri: str, extra: str) -> None:
        with self._lock:
            self._writer.send(("asset", (uri, extra)))


def _child_main(job: Job, ctx: TaskContext, writer: Any, fence: Any) -> None:
    _close_inherited(keep=writer.fileno())
    lock = threading.Lock()  # one message at a time on the pipe: the task's threads log too
    ctx._logs = _Streamed(writer, lock)
    ctx._pushed = _StreamedValues(writer, lock)
    ctx._asset_extras = _StreamedExtras(writer, lock)
    threading.Thread(target=_keep_fence, args=(fence,), daemon=True).start()
    result = call(job)
    payload: Any = None
    if result.ok:
        try:
            payload = json.dumps(result.value, allow_nan=False)  # NaN is not JSON
        except (TypeError, ValueError) as exc:
            result = Result(ok=False, message=f"output cannot be stored as JSON: {exc}")
    with lock:
        writer.send(
            ("result", (result.ok, payload, result.message, result.traceback, result.deferred))
        )
    writer.close()
    os._exit(0)  # skip the parent's atexit handlers and inherited threads


def _keep_fence(fence: Any) -> None:
    """Exit once the worker's heartbeats no longer cover this attempt: the worker is
    paused or cut off, and the attempt may be given to another worker. A worker that is
    not paused kills its lost children itself; this is for the one that cannot."""
    while time.monotonic() < fence.value:
        time.sleep(FENCE_POLL)
    os._exit(FENCED_EXIT)


def _close_inherited(keep: int) -> None:
    """Close every descriptor the fork copied but stdio and the result pipe.

    The fork happens in a slot thread while the worker's other threads go on: a pipe that
    is open in the worker at that instant (another slot's result pipe before the worker
    closes its end, or the pipe through which ``subprocess`` learns that a child it starts
    has exec'd) would stay open here, and the process waiting for its EOF would wait until
    this task ends: a worker whose loop hung for as long as a slow task ran, in the
    middle of starting its DAG-import helper.
    """
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
