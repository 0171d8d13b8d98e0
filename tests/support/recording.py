"""A file trigger that records every check it makes, for tests across processes.

Each check appends ``<pid> <epoch seconds> <path>`` to the file named by ``record``, so a
test can tell which triggerer process checked which wait, and when (``checks_in``).
Allowed in a ``slotless triggerer`` process by ``SLOTLESS_ALLOWED_TRIGGERS`` (see
``ALLOW``) with ``tests`` on its PYTHONPATH.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from triggers.base import BaseTrigger, TriggerEvent
from triggers.registry import register

ALLOW = "support.recording.LoggedFileTrigger"


@register
class LoggedFileTrigger(BaseTrigger):
    path: str
    record: str
    poke_interval: float = 0.2

    async def poke(self, ctx: Any) -> TriggerEvent | None:
        # One write(2) of one short line on an O_APPEND file: lines never interleave.
        line = f"{os.getpid()} {time.time():.6f} {self.path}\n".encode()
        fd = os.open(self.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return TriggerEvent(payload={"path": self.path}) if os.path.exists(self.path) else None


def checks_in(record: Path) -> list[tuple[int, float, str]]:
    """(pid, time, path) of every check recorded so far."""
    if not record.exists():
        return []
    out = []
    for line in record.read_text().splitlines():
        pid, t, path = line.split(" ", 2)
        out.append((int(pid), float(t), path))
    return out
