"""Durations as users write them: seconds, ``timedelta`` or strings like ``"14h"``, ``"1h30m"``."""

from __future__ import annotations

import re
from datetime import timedelta

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}

Duration = float | int | str | timedelta


def seconds(value: Duration | None) -> float | None:
    """Parse a duration into seconds; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative: {value}")
        return float(value)
    text = value.strip().lower().replace(" ", "")
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"cannot read {value!r} as a duration (try 30s, 15m, 14h, 1h30m)")
    return total
