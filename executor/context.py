"""What a running task sees: ``ctx``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date
from typing import Any


@dataclass
class TaskContext:
    """Passed to every task callable.

    ``inputs`` maps each parent's task id to its output; a mapped parent gives the list of
    its instances' outputs in index order. A mapped instance also sees ``item``, ``index``
    and ``total``.
    """

    run_id: str
    dag_id: str
    task_id: str
    logical_date: date
    attempt: int
    max_attempts: int
    inputs: dict[str, Any] = field(default_factory=dict)
    map_index: int = -1
    item: Any = None
    total: int | None = None
    _logs: list[tuple[float, str]] = field(default_factory=list, repr=False)

    @property
    def ds(self) -> str:
        """The logical date as ``YYYY-MM-DD``, as in Airflow templates."""
        return self.logical_date.isoformat()

    @property
    def index(self) -> int | None:
        return self.map_index if self.map_index >= 0 else None

    def log(self, message: str) -> None:
        """Add a line to this task's log (written when the attempt ends)."""
        self._logs.append((time.time(), str(message)))
