"""What the store tests of schedules and backfills share: a DAG file catalogued as the
services would catalogue it (parsed in a child), and every run the store holds."""

from __future__ import annotations

from pathlib import Path

from executor.catalogue import parse_file
from executor.store import Store


async def catalogue_file(store: Store, path: Path) -> None:
    """Parse ``path`` in a child process and record what it declares (arming its starts)."""
    parsed = await parse_file(str(path))
    assert parsed.error is None, parsed.error
    assert (
        await store.catalogue.record_parse(str(path), path.stat().st_mtime, parsed.dags, None)
        is None
    )


async def all_runs(store: Store) -> list[dict]:
    async with store.db.read() as tx:
        return [dict(r) for r in await tx.fetch("list_runs", n=100_000)]
