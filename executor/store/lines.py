"""An error as the store keeps it for people: one line, at most :data:`MAX_ERROR`
characters (a parse error, a start condition's error: one line of `slotless dags list`)."""

from __future__ import annotations

MAX_ERROR = 500


def one_line(text: str) -> str:
    """``text``'s non-blank lines joined with spaces, cut to :data:`MAX_ERROR` characters."""
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return line if len(line) <= MAX_ERROR else line[: MAX_ERROR - 3] + "..."
