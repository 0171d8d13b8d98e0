"""A trigger's lines in its task instance's log, where Airflow's UI reads them.

Airflow's triggerer writes each task instance's trigger lines to
``<base_log_folder>/<log_filename_template rendered for the TI>.trigger.<job id>.log``
(``TriggerLoggingFactory``), JSON lines as ``airflow.sdk.log`` writes task logs. Airflow's
``FileTaskHandler`` reads every file beside the task's log whose name starts with it, so
those lines appear in the task instance's log in the UI (local files: an api-server on
this host, or a ``base_log_folder`` shared with it). This writes the same files, with the
same names, through Airflow's own ``init_log_file`` (its folder and file permissions).

What is written: when this instance starts checking the row (the check, and how many task
instances share it), its outcome (the event, or the failure), and an adapted trigger's
own lines (what its ``self.log`` says, through structlog, as Airflow's ``BaseTrigger``
logs), copied to every task instance its one ``run()`` serves. Writes are batched and
made in a thread, never on the event loop; a file that cannot be written is said once on
stderr and skipped (the check goes on).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, MutableMapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from triggers.context import to_thread

log = logging.getLogger("slotless.airflow")


# Where a log call made by the running trigger goes: set in each adapted check's own task
# (so in its run() and in the threads it starts with a copied context), unset elsewhere.
Sink = Callable[[str, str], None]  # (level, text)
SINK: ContextVar[Sink | None] = ContextVar("slotless_trigger_sink", default=None)


def capture_trigger_lines() -> None:
    """A structlog processor in front of Airflow's: a line logged inside an adapted check
    is also given to its SINK. Airflow's triggers log through structlog (``LoggingMixin``),
    not the logging module; the level filter runs before processors, so only lines at the
    configured level are copied. Then Airflow's own processors render it as before."""
    import structlog  # type: ignore[import-not-found]

    processors = list(structlog.get_config()["processors"])
    if _capture not in processors:
        structlog.configure(processors=[_capture, *processors])


def _capture(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    sink = SINK.get()
    if sink is not None:
        text = str(event.get("event", ""))
        args = event.get("positional_args")
        if args:
            try:
                text = text % tuple(args)
            except (TypeError, ValueError):
                text = f"{text} {args!r}"
        sink(method, text)
    return event


def _line(at: float, level: str, event: str) -> bytes:
    """One line as Airflow's task logs are written (JSON; what its FileTaskHandler parses)."""
    line = {
        "timestamp": datetime.fromtimestamp(at, UTC).isoformat(),
        "level": level,
        "event": event,
        "logger": "slotless.airflow_triggerer",
    }
    return json.dumps(line).encode() + b"\n"


class TaskLogs:
    """Lines queued per task instance log file, written by :meth:`flush` in a thread."""

    def __init__(self) -> None:
        self.job_id: int | None = None
        # path -> (epoch s, level, text); made into JSON lines in the writing thread, so
        # holding 100,000 rows at a start costs the loop a tuple each, not a json.dumps.
        self.pending: dict[str, list[tuple[float, str, str]]] = {}
        self.written = 0  # lines written, for /metrics and the tests
        self._failed_said = False

    def add(self, log_path: str | None, level: str, event: str) -> None:
        if log_path is None or self.job_id is None:
            return
        path = f"{log_path}.trigger.{self.job_id}.log"
        self.pending.setdefault(path, []).append((time.time(), level, event))

    async def flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, {}
        await to_thread(self._write, batch)

    def _write(self, batch: dict[str, list[tuple[float, str, str]]]) -> None:
        from airflow.sdk.log import init_log_file

        for path, lines in batch.items():
            try:
                with init_log_file(path).open("ab") as f:
                    f.write(b"".join(_line(*line) for line in lines))
                self.written += len(lines)
            except OSError as exc:
                if not self._failed_said:
                    self._failed_said = True
                    log.warning(
                        "cannot write the trigger log %s (%s); trigger lines stay on stderr "
                        "(said once)",
                        path,
                        exc,
                    )
