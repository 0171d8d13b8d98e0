"""The private-cluster helper itself: it starts, restarts, stops, and its log is readable."""

from __future__ import annotations

import asyncio

from support.pgcluster import PgCluster
from support.pgcluster import pg_cluster as pg_cluster  # the fixture


async def _select_one(dsn: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return int(await conn.fetchval("SELECT 1"))
    finally:
        await conn.close()


def test_private_cluster_restarts(pg_cluster: PgCluster) -> None:
    assert asyncio.run(_select_one(pg_cluster.dsn)) == 1
    pg_cluster.restart()
    assert asyncio.run(_select_one(pg_cluster.dsn)) == 1
    pg_cluster.stop()
    try:
        asyncio.run(_select_one(pg_cluster.dsn))
    except OSError:
        pass
    else:
        raise AssertionError("a stopped cluster answered")
    pg_cluster.start()
    assert asyncio.run(_select_one(pg_cluster.dsn)) == 1
    assert "database system is ready to accept connections" in pg_cluster.log_text()
