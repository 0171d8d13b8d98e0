"""Rows the triggerer loads at its edges, on SQLite and PostgreSQL, with a real triggerer
and worker in-process:

- a trigger class whose module takes seconds to import is imported off the event loop: the
  loop keeps turning (a ticker counts its turns), no shard is lost on a lease shorter than
  the import, the wait fires, and the watchdog names the module;
- a trigger row whose kwargs are over the 64 KiB limit, written behind the store's back,
  fails its task at load with the limit in its reason (a deferral refuses it already), on
  the lazy path (validated at its first check) and on the validated one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import textwrap
import time
import uuid
from datetime import date
from pathlib import Path

import pytest
from support import backends
from support.helpers import async_wait_until, raw_sql
from support.triggers import FlagTrigger, serving

from executor import DAG
from executor.store import Store
from triggers import registry
from triggers.limits import MAX_SERIALIZED_BYTES

backend, url, pg_server = backends.backend, backends.url, backends.pg_server  # fixtures
live_store = backends.live_store  # fixture

DAY = date(2026, 11, 26)
IMPORT_SECONDS = 2.5  # longer than the lease below: on the loop, it would lapse
LEASE_TTL = 2.0

pytestmark = pytest.mark.usefixtures("fresh_triggers")


async def state(url: str, run_id: str) -> str:
    rows = await raw_sql(url, f"SELECT state FROM task WHERE run_id = '{run_id}'")
    return str(rows[0]["state"])


async def log_of(url: str, run_id: str) -> str:
    rows = await raw_sql(
        url,
        "SELECT e.message FROM task_event e JOIN task t ON t.id = e.task_row "
        f"WHERE t.run_id = '{run_id}' ORDER BY e.id",
    )
    return "\n".join(str(r["message"]) for r in rows)


async def deferred_then_rewritten(store: Store, url: str, dag_id: str, sets: str) -> str:
    """A sensor DEFERRED by a worker alone, then its trigger row rewritten (``sets``)
    behind the store's back, as a hand edit, an old version or a bug would."""
    dag = DAG(dag_id)
    dag.sensor("wait", FlagTrigger(name=dag_id, poke_interval=0.05), mode="deferrable")
    run_id = await store.runs.create_run(dag, DAY)
    async with serving(store, dag, triggerer=False):

        async def is_deferred() -> bool:
            return await state(url, run_id) == "DEFERRED"

        await async_wait_until(is_deferred, timeout=30, what="the sensor deferred")
    await raw_sql(
        url,
        f"UPDATE trigger SET {sets} WHERE id IN "
        f"(SELECT trigger_id FROM task WHERE run_id = '{run_id}')",
    )
    return run_id


def slow_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real module on sys.path whose import sleeps; its trigger class fires at once."""
    name = f"slow_trigger_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(f"""
            import time

            from triggers.base import BaseTrigger, TriggerEvent

            time.sleep({IMPORT_SECONDS})


            class SlowTrigger(BaseTrigger):
                name: str

                async def poke(self, ctx):
                    return TriggerEvent(payload={{"imported": self.name}})
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    classpath = f"{name}.SlowTrigger"
    monkeypatch.setenv("SLOTLESS_ALLOWED_TRIGGERS", classpath)
    return classpath


async def test_a_slow_trigger_import_runs_off_the_loop(
    live_store: Store,
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    classpath = slow_module(tmp_path, monkeypatch)
    module = classpath.rpartition(".")[0]
    kwargs = json.dumps({"name": "slow", "poke_interval": 0.05})
    run_id = await deferred_then_rewritten(
        live_store, url, "slow_import", f"classpath = '{classpath}', kwargs = '{kwargs}'"
    )
    caplog.set_level(logging.WARNING)
    turns: list[float] = []

    async def ticker() -> None:
        while True:
            turns.append(time.monotonic())
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    try:
        async with serving(live_store, worker=False, config={"lease_ttl": LEASE_TTL}) as h:
            assert h.triggerer is not None
            trig = h.triggerer
            began = time.monotonic()

            async def fired() -> bool:
                return await state(url, run_id) == "SUCCESS"

            await async_wait_until(fired, timeout=30, what="the slow class's wait fired")
            took = time.monotonic() - began
            # The import did run in the triggerer (the wait waited for it), and the loop
            # turned all along: no gap between turns near the import's length.
            assert took >= IMPORT_SECONDS
            window = [t for t in turns if began <= t <= began + took]
            gaps = [b - a for a, b in itertools.pairwise(window)]
            assert max(gaps) < 1.0, max(gaps)
            assert trig.leases.shards_lost == 0
            assert trig.watch.slow_imports[module] == 1, trig.watch.slow_imports
    finally:
        ticking.cancel()
    assert registry.is_resolved(classpath)
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"importing module {module} took" in m for m in logged), logged
    assert any(f"importing module {module} for" in m for m in logged), logged


@pytest.mark.parametrize("interval", ["0.05", '"0.05"'], ids=["lazy", "validated"])
async def test_an_oversize_row_written_behind_the_store_fails_at_load(
    live_store: Store, url: str, interval: str
) -> None:
    # A poke_interval given as a string is not read by the loader's fast path: that row
    # is validated as it loads; a plain number is held unvalidated until its first check.
    name = "x" * (MAX_SERIALIZED_BYTES + 1000)
    kwargs = f'{{"name": "{name}", "poke_interval": {interval}}}'
    run_id = await deferred_then_rewritten(live_store, url, "oversize", f"kwargs = '{kwargs}'")
    async with serving(live_store, worker=False):

        async def failed() -> bool:
            return await state(url, run_id) == "FAILED"

        await async_wait_until(failed, timeout=30, what="the oversize wait failed")
    text = await log_of(url, run_id)
    assert f"over the limit of {MAX_SERIALIZED_BYTES} bytes" in text, text[-2000:]
    assert "64 KiB" in text
