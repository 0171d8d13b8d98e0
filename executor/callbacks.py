"""Delivering one claimed callback row in a worker slot: its handlers, bounded and retried.

The worker claims callback rows with its free slots (``Exchange.exchange``) and hands each to
:meth:`Deliveries.deliver`, which finds the run's DAG the way an attempt does (the DAG
the worker was given, else the run's file: a run the triggerer started from the catalogue
carries only a stored shape, so its callables come from importing its file here), picks
the event's handlers (:func:`executor.notifications.handlers_for`), and runs each in a
slot of the attempts' runner with the DAG's ``callback_timeout``: a callable, or an
apprise send (blocking I/O, so in the slot's thread or child process, never on the
worker's event loop). A handler done is remembered on the row at once; a failure is
retried with backoff up to the DAG's ``callback_retries``, then logged for good. Every
try, failure and give-up is written in the task's log; the task's state never changes.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import date
from functools import partial

from .attempt import Attempts
from .context import TaskContext
from .dag import DAG
from .notifications import (
    BACKOFF_BASE,
    BACKOFF_MAX,
    DEFAULT_RETRIES,
    LOG_TAIL,
    CallbackContext,
    Handler,
    handlers_for,
    send,
)
from .store import Callbacks
from .store.callbacks import CallbackRow

log = logging.getLogger("slotless.callbacks")


class Deliveries:
    """Runs claimed callback rows in the worker's slots."""

    def __init__(self, callbacks: Callbacks, attempts: Attempts) -> None:
        self.callbacks = callbacks
        self.attempts = attempts

    async def deliver(self, row: CallbackRow, owner: str, release: asyncio.Event) -> None:
        """Run ``row``'s handlers not yet done; ``release`` is set when every thread (or
        child) it used is free again (a handler past its timeout in thread isolation keeps
        its thread until it returns)."""
        releases: list[asyncio.Event] = []
        try:
            await self._deliver(row, owner, releases)
        except Exception as exc:  # a bug of ours: the row is retried, the worker lives on
            log.exception("delivering callback row %s failed", row.id)
            await self._end(row, owner, [*row.delivered], [f"worker error: {exc!r}"], None)
        finally:
            if releases:
                await asyncio.gather(*(r.wait() for r in releases))
            release.set()

    async def _deliver(self, row: CallbackRow, owner: str, releases: list[asyncio.Event]) -> None:
        dag, dag_id, logical_date, problem = await self.attempts.run_dag(row.run_id)
        if dag is None:
            # Perhaps a file being rewritten: retried like any failure, then logged.
            await self._end(row, owner, [*row.delivered], [problem or "no DAG"], None)
            return
        spec = dag.tasks.get(row.task_id) if row.task_id else None
        handlers = handlers_for(row.event, spec.hooks if spec else None, dag.hooks)
        tail: list[str] = []
        if row.task_row is not None:
            tail = await self.callbacks.callback_log_tail(row.task_row, row.created_at, LOG_TAIL)
        ctx = CallbackContext(
            event=row.event,
            dag_id=dag_id,
            run_id=row.run_id,
            logical_date=logical_date,
            task_id=row.task_id,
            attempt=row.attempt,
            error=row.message,
            log_tail=tail,
            context=row.context,
            callback_try=row.tries,
            logical_shown=await self.attempts.logical_shown(row.run_id),
        )
        slot_ctx = TaskContext(
            run_id=row.run_id,
            dag_id=dag_id,
            task_id=row.task_id or "",
            logical_date=logical_date or date.today(),
            attempt=row.attempt or 0,
            max_attempts=0,
        )
        timeout = dag.callback_timeout
        done = list(row.delivered)
        errors: list[str] = []
        lines: list[str] = []
        for h in handlers:
            if h.key in done:
                continue
            released = asyncio.Event()
            releases.append(released)
            result = await self.attempts.runner.run(
                partial(_run_handler, h, ctx, timeout), slot_ctx, timeout, released
            )
            if result.ok:
                done.append(h.key)
                lines.append(f"{row.event}: {h.describe} done")
                if not await self.callbacks.callback_delivered(row, owner, done):
                    return  # taken back (we were presumed dead): the new owner carries on
            else:
                msg = result.message
                if result.timed_out:
                    msg = f"timed out after {timeout:g} s ({msg})"
                errors.append(f"{h.describe} failed: {msg}")
                if result.traceback:
                    lines.append(result.traceback.rstrip())
        if not handlers:
            lines.append(f"{row.event}: no handler declared for it any more; nothing sent")
        await self._end(row, owner, done, errors, dag, lines)

    async def _end(
        self,
        row: CallbackRow,
        owner: str,
        done: list[str],
        errors: list[str],
        dag: DAG | None,
        lines: list[str] | None = None,
    ) -> None:
        lines = list(lines or [])
        tries = (dag.callback_retries if dag else DEFAULT_RETRIES) + 1
        state, ready_at, error = "DONE", None, None
        if errors:
            error = "; ".join(errors)
            if row.tries < tries:
                base = dag.callback_retry_delay if dag else BACKOFF_BASE
                delay = min(BACKOFF_MAX, base * 2 ** (row.tries - 1))
                state, ready_at = "PENDING", self.callbacks.clock() + delay
                lines.append(
                    f"{row.event}: try {row.tries} of {tries}: {error}; "
                    f"trying again in {delay:g} s (the task's outcome is unchanged)"
                )
            else:
                state = "FAILED"
                lines.append(
                    f"{row.event}: gave up after {tries} tr{'y' if tries == 1 else 'ies'}: {error} "
                    "(the task's outcome is unchanged)"
                )
        if row.task_row is None:  # a run's own event: no task log, so the worker's
            for line in lines:
                log.log(logging.WARNING if errors else logging.INFO, "run %s: %s", row.run_id, line)
        await self.callbacks.end_callback(
            row, owner, state=state, done=done, error=error, ready_at=ready_at, log_lines=lines
        )


def _run_handler(h: Handler, ctx: CallbackContext, timeout: float) -> None:
    """In the slot: call the callable, or send the notification (blocking)."""
    if h.fn is not None:
        h.fn(ctx)  # its return value is not kept (it need not be JSON)
    else:
        assert h.url is not None
        send(h.url, ctx, timeout)
