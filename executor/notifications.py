"""Callbacks and notifications: what a DAG declares, and how an event is recorded.

An *event* (a task failed, will retry, succeeded, its sensor timed out; a run failed or
succeeded; or an event another feature raises: a sensor is ``late``, a run missed its
``deadline``, a run was ``paused``) is a ``callback`` row written **in the same
transaction** as the change that causes it, so it is recorded at most once per event and
never lost. A worker claims the row like a task (owner, heartbeat, lease taken back when
the worker dies), loads the DAG file as an attempt does, and runs the event's handlers in
a worker slot, each bounded by a timeout and retried with backoff
(:mod:`executor.callbacks`). A handler is a Python callable (``on_failure=...``) or a
notification URL (``notify="slack://..."``, sent by apprise). Nothing here ever changes a
task's or a run's state; a handler that fails is written in the task's log.

Recording an event from the store (the public interface; inside an open write
transaction, next to the change that causes it)::

    from executor import notifications

    async with store.db.write() as tx:
        ...  # e.g. the trigger fire that finds a sensor late
        await notifications.record(
            tx,
            "late",                              # the event: it picks the handlers
            run_id=run_id,
            task_row=row_id,                     # None for a run's own event
            now=now,
            message="settlements.csv not there at 05:30 (expected_by)",
            context={"expected_by": "05:30"},    # JSON-able; handlers see it as ctx.context
            key=f"late:{row_id}",                # optional: one row ever for this key
        )

Which handlers an event gets is decided when it is delivered, from the DAG: the task's
callable for that event (else the DAG's default), and the task's ``notify=`` URLs for it
(else the DAG's). A URL given without naming events (``notify="mailto://..."``) is sent
for :data:`ALERT_EVENTS`; ``notify={"on_success": [...]}`` names them. An event with no
handler ends DONE with nothing sent.

Task and run transitions record their events themselves (:func:`after_transition`,
:func:`after_run`, called by :mod:`executor.statemachine`), only for tasks and runs whose
``hooks`` mask (written when the run is created, :func:`task_mask`) asks for them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .driver.db import Tx
    from .rows import MovedTask

log = logging.getLogger("slotless.notifications")

# The events a task's transitions raise, and a run's.
ON_RETRY = "on_retry"
ON_FAILURE = "on_failure"
ON_SUCCESS = "on_success"
ON_SENSOR_TIMEOUT = "on_sensor_timeout"
ON_RUN_FAILURE = "on_run_failure"
ON_RUN_SUCCESS = "on_run_success"
TASK_EVENTS = (ON_RETRY, ON_FAILURE, ON_SUCCESS, ON_SENSOR_TIMEOUT)
RUN_EVENTS = (ON_RUN_FAILURE, ON_RUN_SUCCESS)

# Events other features record with :func:`record` (deadlines, expected_by, pause).
LATE = "late"
DEADLINE_MISSED = "deadline_missed"
RUN_PAUSED = "run_paused"

# What a bare notify= URL (no event named) is sent for: what someone must be told about.
ALERT_EVENTS = frozenset(
    {ON_FAILURE, ON_SENSOR_TIMEOUT, ON_RUN_FAILURE, LATE, DEADLINE_MISSED, RUN_PAUSED}
)

# The stored mask (task.hooks, dag_run.hooks): which transitions write a callback row.
HOOK_BITS: dict[str, int] = {
    ON_RETRY: 1,
    ON_FAILURE: 2,
    ON_SUCCESS: 4,
    ON_SENSOR_TIMEOUT: 8,
    ON_RUN_FAILURE: 16,
    ON_RUN_SUCCESS: 32,
}

# A sensor's timeout is recorded with a message starting so (executor/attempt.py,
# triggerer/store.py): the state machine tells it from other failures by it.
SENSOR_TIMEOUT_PREFIX = "sensor timeout"

DEFAULT_TIMEOUT = 30.0  # seconds one handler may take
DEFAULT_RETRIES = 3  # a failed handler is retried this often, then logged for good
BACKOFF_BASE = 2.0  # seconds before the first retry; doubled each time (callback_retry_delay)
BACKOFF_MAX = 300.0
LOG_TAIL = 20  # the task's last log lines a handler sees

Callback = Callable[["CallbackContext"], Any]
NotifySpec = str | Sequence[str] | Mapping[str, str | Sequence[str]] | None


class BadHook(ValueError):
    """A callback that is not callable, an unknown event, or a URL apprise cannot use."""


@dataclass(frozen=True)
class Hooks:
    """The handlers one task (or a DAG, as the defaults) declares: event -> callable, and
    event -> notification URLs."""

    callbacks: Mapping[str, Callback] = field(default_factory=dict)
    notify: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def declare(
        cls, owner: str, callbacks: Mapping[str, Callback | None], notify: NotifySpec
    ) -> Hooks:
        """Check and keep ``owner``'s declared handlers; :class:`BadHook` names the problem."""
        kept: dict[str, Callback] = {}
        for event, fn in callbacks.items():
            if fn is None:
                continue
            if not callable(fn):
                raise BadHook(f"{owner}: {event} must be a callable, not {fn!r}")
            kept[event] = fn
        return cls(kept, parse_notify(owner, notify))

    def __bool__(self) -> bool:
        return bool(self.callbacks or self.notify)


def parse_notify(owner: str, spec: NotifySpec) -> dict[str, tuple[str, ...]]:
    """``notify=`` as event -> URLs, every URL checked by apprise (invalid: BadHook naming it)."""
    if spec is None:
        return {}
    if isinstance(spec, str):
        spec = [spec]
    per_event: dict[str, tuple[str, ...]]
    if isinstance(spec, Mapping):
        per_event = {}
        for event, urls in spec.items():
            if not isinstance(event, str) or not event:
                raise BadHook(f"{owner}: notify= keys are event names, not {event!r}")
            per_event[event] = (urls,) if isinstance(urls, str) else tuple(urls)
    else:
        urls = tuple(spec)
        per_event = dict.fromkeys(sorted(ALERT_EVENTS), urls)
    for urls in per_event.values():
        for url in urls:
            check_url(owner, url)
    return per_event


def check_url(owner: str, url: Any) -> None:
    """Refuse a notification URL apprise cannot send to (naming it; secrets and all: it is
    the owner's own file that holds it)."""
    import apprise  # 0.1 s to import: only where URLs are used

    # apprise logs its own complaint too; ours names the owner, so keep just ours (this
    # thread's records only: a send in another thread still logs its reason).
    me = threading.get_ident()
    quiet = _ThreadFilter(me)
    logger = logging.getLogger("apprise")
    logger.addFilter(quiet)
    try:
        ok = isinstance(url, str) and apprise.Apprise().add(url)
    finally:
        logger.removeFilter(quiet)
    if not ok:
        raise BadHook(
            f"{owner}: invalid notification URL {url!r} "
            "(see https://github.com/caronc/apprise/wiki for the forms apprise accepts)"
        )


class _ThreadFilter(logging.Filter):
    def __init__(self, thread: int) -> None:
        super().__init__()
        self.thread = thread

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


def task_mask(task: Hooks, dag: Hooks) -> int:
    """Which of a task's transitions write a callback row: events with any handler."""
    return _mask(TASK_EVENTS, task, dag)


def run_mask(dag: Hooks) -> int:
    return _mask(RUN_EVENTS, Hooks(), dag)


def _mask(events: Iterable[str], task: Hooks, dag: Hooks) -> int:
    bits = 0
    for event in events:
        if handlers_for(event, task, dag):
            bits |= HOOK_BITS[event]
    return bits


@dataclass(frozen=True, slots=True)
class Handler:
    """One thing to do for an event: ``key`` is what the row remembers once it is done
    (a URL is remembered by a hash: no secret in the database)."""

    key: str
    fn: Callback | None = None
    url: str | None = None

    @property
    def describe(self) -> str:
        if self.fn is not None:
            return f"callback {getattr(self.fn, '__qualname__', repr(self.fn))}"
        assert self.url is not None
        return f"notification to {redact(self.url)}"


def handlers_for(event: str, task: Hooks | None, dag: Hooks) -> list[Handler]:
    """An event's handlers: the task's callable (else the DAG's), the task's URLs (else the
    DAG's). ``task`` is None for a run's own event."""
    out: list[Handler] = []
    fn = (task.callbacks.get(event) if task else None) or dag.callbacks.get(event)
    if fn is not None:
        out.append(Handler("callback", fn=fn))
    urls = (task.notify.get(event) if task else None) or dag.notify.get(event) or ()
    for url in urls:
        out.append(Handler("notify:" + hashlib.sha256(url.encode()).hexdigest()[:16], url=url))
    return out


def redact(url: str) -> str:
    """A URL as logs may show it: scheme and host, no credentials, path or tokens."""
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
    return (
        f"{scheme}://{host}/..."
        if scheme in ("json", "jsons", "mailto", "mailtos")
        else (f"{scheme}://...")
    )


@dataclass(frozen=True)
class CallbackContext:
    """What a callback receives (and what a notification says).

    ``error`` is the transition's message (a failure's error; for a retry, the failed
    attempt's); ``log_tail`` the task's last log lines of that attempt; ``context`` what
    the code that recorded the event added (e.g. ``expected_by``).
    """

    event: str
    dag_id: str
    run_id: str
    logical_date: date | None
    task_id: str | None
    attempt: int | None
    error: str | None
    log_tail: list[str]
    context: dict[str, Any]
    callback_try: int = 1
    # The run's logical time as people read it (executor.runnames.logical_shown):
    # "2026-11-26 06:00" for an hourly run, where logical_date is the day alone.
    logical_shown: str | None = None

    def title(self) -> str:
        what = f"{self.dag_id}.{self.task_id}" if self.task_id else self.dag_id
        return f"slotless: {what} {self.event.removeprefix('on_').replace('_', ' ')}"

    def body(self) -> str:
        logical = self.logical_shown or self.logical_date
        lines = [f"run {self.run_id}" + (f" ({logical})" if logical else "")]
        if self.attempt is not None:
            lines.append(f"attempt {self.attempt}")
        if self.error:
            lines.append(self.error)
        for k, v in self.context.items():
            lines.append(f"{k}: {v}")
        if self.log_tail:
            lines += ["", "last log lines:", *self.log_tail]
        return "\n".join(lines)


# -- recording: in the store's transaction ------------------------------------------------


async def record(
    tx: Tx,
    event: str,
    *,
    run_id: str,
    now: float,
    task_row: int | None = None,
    task_id: str | None = None,
    attempt: int | None = None,
    message: str | None = None,
    context: Mapping[str, Any] | None = None,
    key: str | None = None,
) -> None:
    """Record ``event`` for a run (and one of its tasks) inside the open transaction ``tx``;
    a worker delivers it after the commit. With ``key``, a second record of the same key
    records nothing (a replayed fire). ``task_id`` defaults to ``task_row``'s."""
    await tx.execute(
        "insert_callback",
        run_id=run_id,
        task_row=task_row,
        task_id=task_id,
        event=event,
        attempt=attempt,
        message=message,
        context=json.dumps(dict(context or {}), default=str),
        dedup_key=key,
        now=now,
    )


async def after_transition(
    tx: Tx, moved: Sequence[MovedTask], new: str, message: str | Mapping[int, str], now: float
) -> None:
    """The events ``moved`` rows raise by reaching ``new`` (called by the state machine for
    every compare-and-set, in its transaction; rows without hooks cost nothing)."""
    rows: list[dict[str, Any]] = []
    for row in moved:
        if not row.hooks:
            continue
        why = message[row.id] if isinstance(message, Mapping) else message
        attempt = row.attempt
        events: list[str] = []
        if new == "RETRYING":
            events.append(ON_RETRY)
            attempt -= 1  # the attempt that failed: the row already counts the next one
        elif new == "SUCCESS":
            events.append(ON_SUCCESS)
        elif new in ("FAILED", "SKIPPED"):
            if why.startswith(SENSOR_TIMEOUT_PREFIX):
                events.append(ON_SENSOR_TIMEOUT)
            if new == "FAILED":
                events.append(ON_FAILURE)
        if (
            ON_FAILURE in events
            and row.hooks & HOOK_BITS[ON_FAILURE]
            and row.map_index == -1
            and row.map_total is not None
        ):
            # A mapped task fails as a whole once its instances ended; the person told
            # needs which of them failed, and why, not only how many.
            why += await _failed_instances(tx, row.run_id, row.task_id)
        for event in events:
            if row.hooks & HOOK_BITS[event]:
                rows.append(
                    {
                        "run_id": row.run_id,
                        "task_row": row.id,
                        "task_id": row.task_id,
                        "event": event,
                        "attempt": attempt,
                        "message": why,
                        "context": "{}",
                        "dedup_key": None,
                        "now": now,
                    }
                )
    if rows:
        await tx.executemany("insert_callback", rows)


NOTICE_INSTANCES = 10  # a mapped task's failed instances a failure notice names, at most
_ATTEMPT_FAILED = re.compile(r"^attempt \d+ of \d+ failed: ")


def failure_text(message: str | None) -> str:
    """A failure transition's message as a person reads it: the error, on one line."""
    return " ".join(_ATTEMPT_FAILED.sub("", message or "").split())


async def _failed_instances(tx: Tx, run_id: str, task_id: str) -> str:
    rows = await tx.fetch("failed_tasks", run_id=run_id, task_id=task_id, n=NOTICE_INSTANCES + 1)
    lines = [
        f"{r['task_id']}[{r['map_index']}]: {failure_text(r['error'])}"
        for r in rows[:NOTICE_INSTANCES]
    ]
    if len(rows) > NOTICE_INSTANCES:
        lines.append("... and more instances failed")
    return "".join(f"\n{line}" for line in lines)


async def after_run(tx: Tx, run_id: str, new: str, hooks: int, now: float) -> None:
    """A run ended: its on_run_failure / on_run_success, if it declared them."""
    event = {"FAILED": ON_RUN_FAILURE, "SUCCESS": ON_RUN_SUCCESS}.get(new)
    if event is not None and hooks & HOOK_BITS[event]:
        await record(tx, event, run_id=run_id, now=now, message=f"run {run_id} ended {new}")


# -- sending: blocking, in a worker slot's thread, never on an event loop ------------------


def send(url: str, ctx: CallbackContext, timeout: float) -> None:
    """Send one notification with apprise (blocking I/O); raise with apprise's reason if it
    was not delivered."""
    import apprise

    asset = apprise.AppriseAsset(async_mode=False)
    ap = apprise.Apprise(asset=asset)
    if not ap.add(url):
        raise BadHook(f"invalid notification URL {redact(url)}")
    for service in ap:
        # apprise's own socket timeouts, so a black-holed target cannot outlast ours
        for attr in ("socket_connect_timeout", "socket_read_timeout", "timeout"):
            if hasattr(service, attr):
                setattr(service, attr, timeout)
    with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as captured:
        ok = ap.notify(body=ctx.body(), title=ctx.title(), notify_type=_kind(ctx.event))
    if not ok:
        reason = " ".join(str(captured.getvalue()).split()) or "apprise reported a failure"
        raise OSError(f"{redact(url)}: {reason}")


def _kind(event: str) -> str:
    if event in (ON_SUCCESS, ON_RUN_SUCCESS):
        return "success"
    if event in (ON_RETRY, LATE):
        return "warning"
    return "failure"
