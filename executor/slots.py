"""Running one task callable in a worker slot: in a thread, or in a forked process.

A thread cannot be killed, so in thread isolation an execution timeout fails the attempt
but the slot stays taken until the callable returns; process isolation kills the child.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .context import TaskContext
from .dag import TaskSpec


@dataclass(slots=True)
class Result:
    ok: bool
    value: Any = None  # the callable's return value (thread mode) or its JSON (process)
    error: BaseException | None = None
    message: str = ""
    traceback: str | None = None
    timed_out: bool = False
    value_is_json: bool = False


def call(spec: TaskSpec, ctx: TaskContext) -> Result:
    try:
        return Result(ok=True, value=spec(ctx))
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

    async def run(self, spec: TaskSpec, ctx: TaskContext, release: asyncio.Event) -> Result:
        """Run in a thread; ``release`` is set when the thread is really free again."""
        fut = asyncio.get_running_loop().run_in_executor(self._pool, call, spec, ctx)
        fut.add_done_callback(lambda _: release.set())
        timeout = spec.execution_timeout
        done, _ = await asyncio.wait({fut}, timeout=timeout)
        if not done:
            return Result(
                ok=False,
                timed_out=True,
                message=f"execution timeout: still running after {timeout:g} s "
                "(thread isolation cannot stop it; its slot stays busy)",
            )
        return fut.result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ProcessSlots:
    """One forked child per attempt, so a hung or crashing task can be killed alone."""

    def __init__(self, slots: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="slot-proc")
        self._mp = multiprocessing.get_context("fork")

    async def run(self, spec: TaskSpec, ctx: TaskContext, release: asyncio.Event) -> Result:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self._fork_and_wait, spec, ctx)
        finally:
            release.set()

    def _fork_and_wait(self, spec: TaskSpec, ctx: TaskContext) -> Result:
        reader, writer = self._mp.Pipe(duplex=False)
        child = self._mp.Process(target=_child_main, args=(spec, ctx, writer), daemon=True)
        child.start()
        writer.close()
        timeout = spec.execution_timeout
        try:
            if not reader.poll(timeout):
                child.kill()
                child.join()
                return Result(
                    ok=False,
                    timed_out=True,
                    message=f"execution timeout: killed after {timeout:g} s",
                )
            ok, payload, message, tb, logs = reader.recv()
        except EOFError:
            child.join()
            return Result(ok=False, message=f"task process died (exit code {child.exitcode})")
        finally:
            reader.close()
        child.join()
        ctx._logs.extend(logs)
        return Result(ok=ok, value=payload, message=message, traceback=tb, value_is_json=ok)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _child_main(spec: TaskSpec, ctx: TaskContext, writer: Any) -> None:
    result = call(spec, ctx)
    payload: Any = None
    if result.ok:
        try:
            payload = json.dumps(result.value)
        except (TypeError, ValueError) as exc:
            result = Result(ok=False, message=f"output cannot be stored as JSON: {exc}")
    writer.send((result.ok, payload, result.message, result.traceback, ctx._logs))
    writer.close()
    os._exit(0)  # skip the parent's atexit handlers and inherited threads
