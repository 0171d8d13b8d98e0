"""Triggerers as real processes (``slotless triggerer``) sharing one SQLite file: a SIGKILL
with 1,000 waits held, a restart, and two triggerers splitting and rebalancing the shards.

Runs are created in the test with Runs.create_run and served by an in-process worker; the
waits are files in tmp_path, so the moment each condition holds is the test's to choose.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from pathlib import Path

import pytest
from support.helpers import async_wait_until, sql
from support.triggers import shard_owners

from executor import DAG
from executor.store import Store
from executor.worker import Worker
from triggers.base import SHARDS
from triggers.files import FileTrigger

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DAY = date(2026, 4, 25)
LEASE_TTL = "2"


def waits_dag(inbox: Path, n: int, name_of=lambda i: f"{i}.flag") -> DAG:
    """``n`` mapped instances; instance i waits for ``inbox/name_of(i)`` and returns the event."""
    dag = DAG("handover")

    @dag.task
    def items(ctx):
        return list(range(n))

    @dag.task(expand=items)
    def wait(ctx):
        path = inbox / name_of(ctx.item)
        ctx.defer(FileTrigger(path=str(path), poke_interval=0.2), method="done", timeout=300)

    @wait.method
    def done(ctx):
        return ctx.event

    return dag


class Triggerers:
    """``slotless triggerer`` processes started by one test, all stopped at its end."""

    def __init__(self, db_url: str, logs: Path) -> None:
        self.db_url = db_url
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
        env.pop("SLOTLESS_DB", None)
        log = open(self.logs / f"triggerer-{len(self.procs)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "slotless",
                "triggerer",
                "--db",
                self.db_url,
                "--lease-ttl",
                LEASE_TTL,
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.logs.glob("*.log"))
        )


@pytest.fixture
def triggerers(db_url: str, tmp_path: Path):
    logs = tmp_path / "logs"
    logs.mkdir()
    t = Triggerers(db_url, logs)
    try:
        yield t
    finally:
        t.stop_all()
        print(t.output())  # shown by pytest only when the test failed


@asynccontextmanager
async def worker_serving(store: Store, dag: DAG) -> AsyncIterator[Worker]:
    worker = Worker(store, slots=16, dags={dag.dag_id: dag}, poll_interval=0.02)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


def triggerer_id(db_path: Path, proc: subprocess.Popen) -> str | None:
    for r in sql(db_path, "SELECT id FROM triggerer"):
        if f":{proc.pid}:" in r["id"]:
            return str(r["id"])
    return None


def holding(db_path: Path, proc: subprocess.Popen) -> tuple[int, int]:
    """(live shards held, subscriptions loaded) of one triggerer process."""
    tid = triggerer_id(db_path, proc)
    if tid is None:
        return 0, 0
    (row,) = sql(db_path, "SELECT triggers FROM triggerer WHERE id = ?", tid)
    return shard_owners(db_path).get(tid, 0), row["triggers"]


def states(db_path: Path, run_id: str) -> Counter:
    rows = sql(db_path, "SELECT state FROM task WHERE run_id = ? AND map_index >= 0", run_id)
    return Counter(r["state"] for r in rows)


def transition_counts(db_path: Path, run_id: str) -> dict[int, Counter]:
    rows = sql(
        db_path,
        "SELECT t.map_index, e.from_state, e.to_state FROM task_event e"
        " JOIN task t ON t.id = e.task_row"
        " WHERE t.run_id = ? AND t.map_index >= 0 AND e.kind = 'transition'",
        run_id,
    )
    out: dict[int, Counter] = {}
    for r in rows:
        out.setdefault(r["map_index"], Counter())[(r["from_state"], r["to_state"])] += 1
    return out


def assert_each_resumed_exactly_once(db_path: Path, run_id: str, n: int) -> None:
    assert states(db_path, run_id) == Counter({"SUCCESS": n})
    counts = transition_counts(db_path, run_id)
    assert len(counts) == n
    for index, c in counts.items():
        assert c[("DEFERRED", "PENDING")] == 1, (index, c)
        assert c[("RUNNING", "DEFERRED")] == 1, (index, c)
        assert c[("PENDING", "RUNNING")] == 2, (index, c)  # the first run and the resume
        bad = {k: v for k, v in c.items() if "FAILED" in k or "RETRYING" in k}
        assert not bad, (index, c)
    (run,) = sql(db_path, "SELECT state FROM dag_run WHERE run_id = ?", run_id)
    assert run["state"] == "SUCCESS"


def touch(inbox: Path, indexes) -> None:
    for i in indexes:
        (inbox / f"{i}.flag").write_text("")


async def test_sigkill_with_1000_waits_another_triggerer_takes_over(
    store, db_path, tmp_path, triggerers
) -> None:
    n = 1000
    inbox = tmp_path / "in"
    inbox.mkdir()
    dag = waits_dag(inbox, n)
    run_id = await store.runs.create_run(dag, DAY)
    async with worker_serving(store, dag):
        await async_wait_until(lambda: states(db_path, run_id)["DEFERRED"] == n, timeout=60)
        first = triggerers.start()
        await async_wait_until(
            lambda: holding(db_path, first) == (SHARDS, n), what="all 1,000 held"
        )

        # Half of the conditions hold while the first triggerer is alive ...
        touch(inbox, range(n // 2))
        await async_wait_until(lambda: states(db_path, run_id)["SUCCESS"] == n // 2, what="half")
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        dead = triggerer_id(db_path, first)
        assert dead is not None

        # ... some while no triggerer holds their shards (they fire after the takeover) ...
        touch(inbox, range(n // 2, 600))
        second = triggerers.start()
        await async_wait_until(lambda: states(db_path, run_id)["SUCCESS"] == 600, timeout=30)
        # ... and the rest once the second one holds every shard the dead one had.
        await async_wait_until(
            lambda: holding(db_path, second) == (SHARDS, n - 600), what="takeover"
        )
        assert dead not in shard_owners(db_path)
        touch(inbox, range(600, n))
        await async_wait_until(lambda: states(db_path, run_id)["SUCCESS"] == n, timeout=60)
    assert_each_resumed_exactly_once(db_path, run_id, n)
    for r in sql(
        db_path, "SELECT map_index, output FROM task WHERE run_id = ? AND map_index >= 0", run_id
    ):
        assert r["output"] == f'{{"paths": ["{inbox}/{r["map_index"]}.flag"]}}'


async def test_a_restarted_triggerer_fails_no_deferred_task(
    store, db_path, tmp_path, triggerers
) -> None:
    n = 200
    inbox = tmp_path / "in"
    inbox.mkdir()
    dag = waits_dag(inbox, n)
    run_id = await store.runs.create_run(dag, DAY)
    async with worker_serving(store, dag):
        await async_wait_until(lambda: states(db_path, run_id)["DEFERRED"] == n, timeout=30)
        first = triggerers.start()
        await async_wait_until(lambda: holding(db_path, first) == (SHARDS, n), what="all held")
        touch(inbox, range(50))
        await async_wait_until(lambda: states(db_path, run_id)["SUCCESS"] == 50, what="first 50")

        first.send_signal(signal.SIGTERM)
        # Waited for off the loop: the worker serving here must go on meanwhile. Blocking the
        # loop could leave its write transaction open, and the stopping triggerer's last
        # write (its shards handed back) would wait on that lock past the 20 s.
        assert await asyncio.to_thread(first.wait, 20) == 0
        # A clean stop hands its shards back at once and leaves the live list.
        assert shard_owners(db_path) == {}
        assert sql(db_path, "SELECT id FROM triggerer") == []
        assert states(db_path, run_id)["DEFERRED"] == n - 50
        touch(inbox, range(50, 100))  # conditions that hold while no triggerer runs

        second = triggerers.start()
        await async_wait_until(lambda: states(db_path, run_id)["SUCCESS"] == 100, what="backlog")
        await async_wait_until(lambda: holding(db_path, second) == (SHARDS, n - 100), what="held")
        touch(inbox, range(100, n))
        await async_wait_until(lambda: states(db_path, run_id)["SUCCESS"] == n, timeout=30)
    assert_each_resumed_exactly_once(db_path, run_id, n)


async def test_two_triggerers_split_the_shards_and_rebalance(
    store, db_path, tmp_path, triggerers
) -> None:
    n = 300
    inbox = tmp_path / "in"
    inbox.mkdir()
    # Every condition is waited on by three tasks: duplicates must stay on one triggerer.
    dag = waits_dag(inbox, n, name_of=lambda i: f"{i % (n // 3)}.flag")
    run_id = await store.runs.create_run(dag, DAY)
    async with worker_serving(store, dag):
        await async_wait_until(lambda: states(db_path, run_id)["DEFERRED"] == n, timeout=30)
        a = triggerers.start()
        await async_wait_until(lambda: holding(db_path, a) == (SHARDS, n), what="A holds all")
        b = triggerers.start()

        def split() -> bool:
            (a_shards, a_subs), (b_shards, b_subs) = holding(db_path, a), holding(db_path, b)
            return a_shards == b_shards == SHARDS // 2 and a_subs + b_subs == n

        await async_wait_until(split, timeout=30, what="an even split")
        (a_subs, b_subs) = holding(db_path, a)[1], holding(db_path, b)[1]
        assert a_subs > 0 and b_subs > 0
        assert a_subs % 3 == 0 and b_subs % 3 == 0  # duplicates never split across the two
        owners = {
            r["shard"]: r["owner"] for r in sql(db_path, "SELECT shard, owner FROM shard_lease")
        }
        assert set(owners.values()) == {triggerer_id(db_path, a), triggerer_id(db_path, b)}

        touch(inbox, range(n // 3))  # each triggerer fires the waits of its own shards
        await async_wait_until(lambda: states(db_path, run_id)["SUCCESS"] == n, timeout=30)

        b.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(b.wait, 20) == 0  # off the loop: the worker goes on
        await async_wait_until(
            lambda: holding(db_path, a)[0] == SHARDS, timeout=30, what="rebalance"
        )
        assert shard_owners(db_path) == {triggerer_id(db_path, a): SHARDS}
    assert_each_resumed_exactly_once(db_path, run_id, n)


def test_slotless_run_serves_a_deferrable_sensor_in_process(tmp_path, db_url, db_path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    dag_file = tmp_path / "cli_sensor.py"
    dag_file.write_text(
        "import os\n"
        "from pathlib import Path\n"
        "from executor import DAG\n"
        "from triggers.files import FileTrigger\n"
        "INBOX = Path(os.environ['INBOX'])\n"
        "dag = DAG('cli_sensor')\n"
        "wait = dag.sensor('wait', FileTrigger(path=f'{INBOX}/{{{{ ds }}}}.csv',"
        " poke_interval=0.1), mode='deferrable', timeout=60)\n"
        "@dag.task(parents=[wait])\n"
        "def after(ctx):\n"
        "    return ctx.inputs['wait']\n"
        "@dag.task\n"
        "def drop(ctx):\n"
        "    (INBOX / f'{ctx.ds}.csv').write_text('x')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
        "INBOX": str(inbox),
    }
    env.pop("SLOTLESS_DB", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slotless",
            "run",
            str(dag_file),
            "--db",
            db_url,
            "--json",
            "--logical-date",
            "2026-04-25",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["state"] == "SUCCESS"
    assert result["tasks"] == {"wait": "SUCCESS", "after": "SUCCESS", "drop": "SUCCESS"}
    (sensor,) = sql(db_path, "SELECT id FROM task WHERE task_id = 'wait'")
    moves = sql(
        db_path,
        "SELECT from_state, to_state FROM task_event WHERE task_row = ? AND kind = 'transition'",
        sensor["id"],
    )
    assert [(m["from_state"], m["to_state"]) for m in moves][-1] == ("DEFERRED", "SUCCESS")
    # The in-process triggerer left cleanly: no shard stays leased after the command.
    assert shard_owners(db_path) == {}
