"""Size limits shared by everything a wait carries.

One constant, so that a trigger's serialized kwargs (checked when a task defers) and an
event's payload (checked when it is sent) are held to the same bound: both are stored in
a row that the triggerer or a worker reads back whole.
"""

from __future__ import annotations

# The most a serialized trigger's kwargs or an event's payload may hold, in bytes of its
# compact JSON (UTF-8). 64 KiB: far above a bucket and a key or a partner's callback, far
# below what would make loading 100,000 waits or listing events costly.
MAX_SERIALIZED_BYTES = 64 * 1024


def kwargs_over_limit(kwargs_json: str) -> str | None:
    """Why a trigger row's serialized kwargs are refused for their size (the reason its
    task fails with), or None when they fit in :data:`MAX_SERIALIZED_BYTES`. Cheap: a
    length, and an encoding only for non-ASCII text near the limit."""
    n = len(kwargs_json)
    if n * 4 <= MAX_SERIALIZED_BYTES:  # UTF-8 takes at most 4 bytes a character
        return None
    size = n if kwargs_json.isascii() else len(kwargs_json.encode("utf-8", "surrogatepass"))
    if size <= MAX_SERIALIZED_BYTES:
        return None
    return (
        f"trigger kwargs are {size} bytes, over the limit of {MAX_SERIALIZED_BYTES} bytes "
        "(64 KiB): pass a reference (a path, a key), not the data"
    )


# How deep an event's payload or a person's answer may nest (objects and lists). Far above
# any record a partner sends; far below Python's recursion limit, which the JSON encoder,
# pydantic and the page all hit near 1,000: a value deeper than this could be stored but
# not read back.
MAX_DEPTH = 64

# How much of a JSON path an error names: a path 64 levels deep is not read by anyone.
MAX_PATH_SHOWN = 120


class JsonLimitError(ValueError):
    """A value that is JSON in Python's eyes but that slotless will not store: too deep,
    a string that is not valid Unicode (a lone surrogate), a key that is not a string, a
    number that is not finite. ``field`` is where, e.g. ``payload.a[3]``."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def short_path(path: str) -> str:
    """``path`` cut to :data:`MAX_PATH_SHOWN` characters, keeping its start and end."""
    if len(path) <= MAX_PATH_SHOWN:
        return path
    keep = (MAX_PATH_SHOWN - 1) // 2
    return f"{path[:keep]}…{path[-keep:]}"


def check_json_value(value: object, field: str) -> None:
    """Refuse (:class:`JsonLimitError`, naming the place) a value slotless could store but
    not serve back: nested over :data:`MAX_DEPTH`, a lone surrogate in a string or a key,
    a non-string key, a number that is NaN or infinite, anything that is not JSON.

    Iterative, with an explicit stack: a value nested 100,000 deep is refused, not a
    RecursionError."""
    stack: list[tuple[object, str, int]] = [(value, field, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth >= MAX_DEPTH:
                raise JsonLimitError(
                    f"{short_path(where)} nests deeper than {MAX_DEPTH} levels of objects "
                    "and lists; flatten it",
                    short_path(where),
                )
            if isinstance(v, dict):
                for k, item in v.items():
                    if not isinstance(k, str):
                        raise JsonLimitError(
                            f"{short_path(where)} has a key that is not text: {k!r:.40}",
                            short_path(where),
                        )
                    _text(k, where)
                    stack.append((item, f"{where}.{k}" if _plain(k) else f"{where}[{k!r}]",
                                  depth + 1))  # fmt: skip
            else:
                stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(v))
        elif isinstance(v, str):
            _text(v, where)
        elif isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise JsonLimitError(
                    f"{short_path(where)} is {v}, which JSON cannot hold: send a finite "
                    "number (or a string)",
                    short_path(where),
                )
        elif v is not None and not isinstance(v, bool | int):
            raise JsonLimitError(
                f"{short_path(where)} is a {type(v).__name__}, not JSON", short_path(where)
            )


def storable_text(s: str) -> bool:
    """Whether ``s`` can be a parameter of a statement on both backends: PostgreSQL's text
    holds no NUL character, and neither backend takes a lone surrogate. A lookup by a name
    that is not storable finds nothing, rather than failing in the driver."""
    if "\x00" in s:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain(key: str) -> bool:
    return key.isidentifier() and len(key) <= 40


def _text(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JsonLimitError(
            f"{short_path(where)} holds a lone surrogate ({s[exc.start]!r}) at character "
            f"{exc.start}: not valid Unicode; send UTF-8 text",
            short_path(where),
        ) from None
