"""Running one task callable in a worker slot: in a thread, or in a forked process.

A thread cannot be killed, so in thread isolation an execution timeout fails the attempt
but the slot stays taken until the callable returns; process isolation kills the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .context import TaskContext, TaskDeferred


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


def call(job: Job) -> Result:
    """Run a task's callable; its failure (or deferral) is data, never a worker crash."""
    try:
        return Result(ok=True, value=job())
    except TaskDeferred as deferral:
        return Result(ok=False, deferred=deferral, message=str(deferral))
    except BaseException as exc:
        return Result(
            ok=False,
            error=exc,
            message=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )


class ThreadSlots:
    def __init__(self, slots: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="slot")

    async def run(
        self,
        job: Job,
        ctx: TaskContext,
        timeout: float | None,
        release: asyncio.Event,
        key: int | None = None,
    ) -> Result:
        """Run in a thread; ``release`` is set when the thread is really free again."""
        fut = asyncio.get_running_loop().run_in_executor(self._pool, call, job)
        fut.add_done_callback(lambda _: release.set())
        done, _ = await asyncio.wait({fut}, timeout=timeout)
        if not done:
            return Result(
                ok=False,
                timed_out=True,
                message=f"execution timeout: still running after {timeout:g} s "
                "(thread isolation cannot stop it; its slot stays busy)",
            )
        return fut.result()

    def stop(self, key: int) -> None:
        """A thread cannot be stopped: the attempt runs to its end (its result discarded)."""

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ProcessSlots:
    """One forked child per attempt, so a hung or crashing task can be killed alone."""

    def __init__(self, slots: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="slot-proc")
        self._mp = multiprocessing.get_context("fork")
        self._children: dict[int, Any] = {}  # key -> the child running it, to stop it

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
        child = self._mp.Process(target=_child_main, args=(job, ctx, writer), daemon=True)
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
        try:
            if not reader.poll(timeout):
                child.kill()
                child.join()
                return Result(
                    ok=False,
                    timed_out=True,
                    message=f"execution timeout: killed after {timeout:g} s",
                )
            ok, payload, message, tb, logs, deferred = reader.recv()
        except EOFError:
            child.join()
            return Result(ok=False, message=f"task process died (exit code {child.exitcode})")
        finally:
            reader.close()
        child.join()
        ctx._logs.extend(logs)
        return Result(
            ok=ok, value=payload, message=message, traceback=tb, value_is_json=ok, deferred=deferred
        )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _child_main(job: Job, ctx: TaskContext, writer: Any) -> None:
    _close_inherited(keep=writer.fileno())
    result = call(job)
    payload: Any = None
    if result.ok:
        try:
            payload = json.dumps(result.value, allow_nan=False)  # NaN is not JSON
        except (TypeError, ValueError) as exc:
            result = Result(ok=False, message=f"output cannot be stored as JSON: {exc}")
    writer.send((result.ok, payload, result.message, result.traceback, ctx._logs, result.deferred))
    writer.close()
    os._exit(0)  # skip the parent's atexit handlers and inherited threads


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
