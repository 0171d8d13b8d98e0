"""Whole numbers taken from a URL or a form, bounded by what both databases can hold.

Python's ``int`` has no limit but SQLite's and PostgreSQL's integers are 64-bit: an id
of 2**63 sent to a lookup is an OverflowError (SQLite) or a DataError (PostgreSQL) at the
driver, a 500 where the caller deserves a 4xx. Reading through :func:`whole_number` turns
such input into a refusal before the store sees it.
"""

from __future__ import annotations

BIGGEST = 2**63 - 1  # the largest BIGINT / SQLite INTEGER


def whole_number(text: str, low: int = 0) -> int | None:
    """``text`` as an int from ``low`` to :data:`BIGGEST`, or None if it is not one.

    >>> whole_number("12"), whole_number("9223372036854775808"), whole_number("x")
    (12, None, None)
    """
    text = text.strip()
    # Bounded before int(): a 100,000-digit string costs quadratic time to convert.
    if not text or len(text) > 20:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if low <= value <= BIGGEST else None
