"""Events end to end, on SQLite and PostgreSQL: real ``slotless worker``, ``triggerer`` and
``ui`` processes, events sent over real HTTP and by the CLI.

* 1,000 waits on 10 distinct (name, match) pairs: one event per pair wakes exactly its
  100 waits, each once, nothing else, with the triggerer SIGKILLed before the events
  (waits keep working without one) and a new triggerer started after (it fires nothing
  again);
* an event sent 2 s before its sensor defers wakes it (lookback); one sent after wakes it;
  one that matches nothing wakes nothing and is pruned after its retention;
* bad input: a bad name, bad JSON, an oversized payload, a missing or wrong token: exit 2
  or a 4xx naming the field, nothing stored;
* POST /api/v1/dags/{dag}/runs starts a run with a conf; a bad conf is a 400 naming it.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from support import pg
from support.helpers import (
    async_wait_until,
    cli,
    free_port,
    start_cli,
    stop_process,
    wait_until,
    write_dag,
)
from support.ops import wait_for_http

from executor.loader import load_dag
from executor.store import Store, open_store

pg_server, pg_url, db_url = pg.pg_server, pg.pg_url, pg.db_url  # fixtures
TOKEN = "s3cret-token"
DAY = date(2026, 11, 24)

PAIRS, PER_PAIR = 10, 100

MANY = f"""
from executor import DAG
from triggers.events import EventTrigger

dag = DAG("many")
for i in range({PAIRS * PER_PAIR}):
    dag.sensor(f"w{{i}}", EventTrigger(name="batch.ready", match={{"batch": i % {PAIRS}}}),
               timeout="1h")
"""

LOOKBACK = """
import time
from pathlib import Path

from executor import DAG
from triggers.events import EventTrigger

FLAG = Path({flag!r})
dag = DAG("callbacks")


@dag.task
def gate(ctx):
    deadline = time.time() + 120
    while not FLAG.exists() and time.time() < deadline:
        time.sleep(0.05)
    return FLAG.exists()


dag.sensor("early", EventTrigger(name="partner.callback", match={{"partner": "acme",
           "date": "{{{{ ds }}}}"}}), parents=[gate], timeout="1h")
dag.sensor("late", EventTrigger(name="partner.late", match={{"partner": "acme"}}),
           timeout="1h")
dag.sensor("too_early", EventTrigger(name="partner.callback", match={{"partner": "acme"}},
           lookback=0), parents=[gate], timeout="1h")
"""

RUNS = """
from pydantic import BaseModel
from executor import DAG


class Params(BaseModel):
    region: str
    limit: int = 10


dag = DAG("started", params=Params)


@dag.task
def show(ctx):
    return ctx.params.region
"""


class Services:
    """The processes of one test, stopped at its end whatever happened."""

    def __init__(self, db: str, tmp: Path) -> None:
        self.db, self.tmp = db, tmp
        self.procs: dict[str, Any] = {}
        self.port = 0

    def start(self, name: str, *args: str) -> Any:
        log = self.tmp / f"{name}.log"
        self.procs[name] = proc = start_cli(*args, "--db", self.db, log=log)
        return proc

    def ui(self, *extra: str) -> str:
        """The page and API; it opens an existing database only, so a SQLite file the
        worker started just now must be there first (the worker creates it)."""
        if self.db.startswith("sqlite:///"):
            path = Path(self.db.removeprefix("sqlite:///"))
            wait_until(path.exists, what=f"{path} created by the services")
        self.port = free_port()
        proc = self.start("ui", "ui", "--port", str(self.port), *extra)
        base = f"http://127.0.0.1:{self.port}"
        wait_for_http(base + "/api/v1/openapi.json", proc, self.tmp / "ui.log")
        return base

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.tmp.glob("*.log"))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_process(proc)


@pytest.fixture
def services(db_url: str, tmp_path: Path) -> Iterator[Services]:
    s = Services(db_url, tmp_path)
    try:
        yield s
    finally:
        s.stop()


def post(
    url: str, body: Any, token: str | None = TOKEN, raw: bytes | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def make_db(db: str) -> None:
    """Create (and migrate) the database, as a worker would: the page opens only an existing one."""
    store = await open_store(db)
    await store.close()


async def start_run(db: str, path: Path, dag_id: str) -> tuple[Store, str]:
    store = await open_store(db)
    run_id = await store.runs.create_run(load_dag(str(path), dag_id), DAY, dag_file=str(path))
    return store, run_id


async def states(store: Store, run_id: str) -> dict[str, str]:
    return {t["task_id"]: t["state"] for t in await store.views.run_tasks(run_id)}


async def transitions_to(store: Store, run_id: str, state: str) -> dict[str, int]:
    """task id -> how many transitions into ``state`` its log holds."""
    counts: dict[str, int] = {}
    tasks = await store.views.run_tasks(run_id)  # before the read: its lock is not reentrant
    async with store.db.read() as tx:
        for t in tasks:
            events = await tx.fetch("task_events", task_row=t["id"])
            counts[t["task_id"]] = sum(1 for e in events if e["to_state"] == state)
    return counts


# ------------------------------------------------------------------- 1,000 waits, 10 keys


async def test_one_event_per_pair_wakes_exactly_its_hundred_waits_without_a_triggerer(
    services: Services, tmp_path: Path
) -> None:
    path = write_dag(tmp_path, MANY, "many.py")
    services.start("worker", "worker", "--slots", "8", "--poll-interval", "0.1")
    triggerer = services.start("triggerer1", "triggerer", "--lease-ttl", "3")
    base = services.ui("--token", f"partner:{TOKEN}")
    store, run_id = await start_run(services.db, path, "many")
    try:
        n = PAIRS * PER_PAIR

        async def all_deferred() -> bool:
            return list((await states(store, run_id)).values()).count("DEFERRED") == n

        await async_wait_until(all_deferred, timeout=180, what=f"{n} waits DEFERRED")
        # The triggerer dies with every wait registered: the events need none.
        triggerer.send_signal(signal.SIGKILL)
        triggerer.wait(10)

        status, body = post(
            base + "/api/v1/events", {"name": "batch.ready", "payload": {"batch": 99}}
        )
        assert status == 201 and body["events"][0]["woke"] == []
        for b in range(PAIRS):
            status, body = post(
                base + "/api/v1/events", {"name": "batch.ready", "payload": {"batch": b, "n": b}}
            )
            assert status == 201, body
            woke = sorted(w["task_id"] for w in body["events"][0]["woke"])
            assert woke == sorted(f"w{i}" for i in range(b, n, PAIRS)), (b, woke)
            got = await states(store, run_id)
            assert all(
                got[f"w{i}"] == ("SUCCESS" if i % PAIRS <= b else "DEFERRED") for i in range(n)
            ), services.logs()
        # Each output is its own pair's payload.
        outputs = {t["task_id"]: t["output"] for t in await store.views.run_tasks(run_id)}
        assert all(json.loads(outputs[f"w{i}"])["batch"] == i % PAIRS for i in range(n))
        # A new triggerer takes over every shard and fires nothing again.
        services.start("triggerer2", "triggerer", "--lease-ttl", "3")

        async def taken_over() -> bool:
            return any(t.shards == 64 for t in await store.views.list_triggerers())

        await async_wait_until(taken_over, timeout=60, what="the new triggerer holding 64 shards")
        assert set((await transitions_to(store, run_id, "SUCCESS")).values()) == {1}
        info = await store.views.run_info(run_id)
        assert info is not None and info["state"] == "SUCCESS"
        listed = cli(
            "events", "list", "batch.ready", "--json", "--limit", "20", "--db", services.db
        )
        assert listed.returncode == 0, listed.stderr
        woke = sorted(len(e["woke"]) for e in json.loads(listed.stdout))
        assert woke == [0] + [PER_PAIR] * PAIRS
    finally:
        await store.close()


# ------------------------------------------------------------- before, after, no match


async def test_an_event_before_the_wait_after_it_and_one_matching_nothing(
    services: Services, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    path = write_dag(tmp_path, LOOKBACK.format(flag=str(flag)), "callbacks.py")
    services.start("worker", "worker", "--slots", "4", "--poll-interval", "0.1")
    services.start("triggerer", "triggerer", "--event-retention", "3s", "--cleanup-every", "0.5")
    base = services.ui("--token", TOKEN)
    store, run_id = await start_run(services.db, path, "callbacks")
    try:
        await async_wait_until(
            lambda: _state_is(store, run_id, "late", "DEFERRED"), timeout=60, what="late deferred"
        )
        # Sent while `early` has not begun (its gate holds): by the CLI.
        sent = cli("events", "send", "partner.callback", "--payload",
                   json.dumps({"partner": "acme", "date": DAY.isoformat(), "url": "s3://x/1"}),
                   "--db", services.db)  # fmt: skip
        assert sent.returncode == 0 and "woke no wait" in sent.stdout, sent.stdout + sent.stderr
        sent_at = time.time()
        await async_wait_until(lambda: time.time() >= sent_at + 2, timeout=10, what="2 s")
        flag.touch()  # the gate ends: `early` defers 2 s after its event, and sees it
        await async_wait_until(
            lambda: _state_is(store, run_id, "early", "SUCCESS"), timeout=60,
            what="early woken by the event sent before it",
        )  # fmt: skip

        async def too_early_settled() -> bool:
            return (await states(store, run_id))["too_early"] not in ("PENDING", "RUNNING")

        await async_wait_until(too_early_settled, timeout=60, what="too_early deferred")
        tasks = {t["task_id"]: t for t in await store.views.run_tasks(run_id)}
        assert json.loads(tasks["early"]["output"])["url"] == "s3://x/1"
        assert tasks["too_early"]["state"] == "DEFERRED"  # lookback=0: not for it
        log = cli("logs", run_id, "early", "--db", services.db)
        assert "before the wait began" in log.stdout, log.stdout
        # After its wait began: over HTTP.
        status, body = post(
            base + "/api/v1/events", {"name": "partner.late", "payload": {"partner": "acme"}}
        )
        assert status == 201 and [w["task_id"] for w in body["events"][0]["woke"]] == ["late"]
        assert (await states(store, run_id))["late"] == "SUCCESS"
        # Matching nothing: wakes nothing, and goes after its retention (3 s here).
        status, body = post(
            base + "/api/v1/events", {"name": "partner.late", "payload": {"partner": "zzz"}}
        )
        assert status == 201 and body["events"][0]["woke"] == []
        gone = body["events"][0]["id"]

        async def pruned() -> bool:
            return all(e.id != gone for e in await store.events.list_events(limit=1000))

        await async_wait_until(pruned, timeout=60, what="the unmatched event pruned")
        assert (await states(store, run_id))["too_early"] == "DEFERRED"
    finally:
        await store.close()


async def _state_is(store: Store, run_id: str, task_id: str, state: str) -> bool:
    return (await states(store, run_id)).get(task_id) == state


# ------------------------------------------------------------------------------ bad input


async def test_bad_events_are_refused_naming_the_field_and_nothing_is_stored(
    services: Services,
) -> None:
    await make_db(services.db)
    base = services.ui("--token", f"partner:{TOKEN}")
    url = base + "/api/v1/events"
    cases = [
        (post(url, {"name": "bad name", "payload": {}}), 400, "name"),
        (post(url, None, raw=b"{not json"), 400, "body"),
        (post(url, {"name": "ok", "payload": "x" * 70_000}), 413, "payload"),
        (post(url, {"events": [{"name": "ok"}, {"name": "ok", "payload": "x" * 70_000}]}), 413,
         "events[1].payload"),
        (post(url, {"name": "ok", "extra": 1}), 400, "extra"),
        (post(url, {"name": "ok"}, token=None), 401, "Authorization"),
        (post(url, {"name": "ok"}, token="wrong"), 401, "Authorization"),
    ]  # fmt: skip
    for (status, body), want, field in cases:
        assert (status, body["field"]) == (want, field), body
        assert body["error"]
    for args in (
        ["bad name"],
        ["ok", "--payload", "{nope"],
        ["ok", "--payload", json.dumps("x" * 70_000)],
    ):
        done = cli("events", "send", *args, "--db", services.db)
        assert done.returncode == 2 and done.stderr.startswith("slotless: error:"), done.stderr
    unknown = cli("events", "list", "never.sent", "--db", services.db)
    assert unknown.returncode == 2 and "never.sent" in unknown.stderr
    store = await open_store(services.db)
    try:
        assert await store.events.list_events() == []
    finally:
        await store.close()


async def test_the_api_is_read_only_without_a_token(services: Services) -> None:
    await make_db(services.db)
    base = services.ui()
    status, body = post(base + "/api/v1/events", {"name": "ok"})
    assert (status, body["field"]) == (403, "Authorization")
    with urllib.request.urlopen(base + "/api/v1/events", timeout=10) as resp:
        assert json.loads(resp.read()) == {"events": []}


# --------------------------------------------------------------------------- runs by API


async def test_start_a_run_with_a_conf_over_the_api(services: Services, tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    write_dag(dags, RUNS, "started.py")
    listed = cli("dags", "list", "--dags", str(dags), "--db", services.db)
    assert listed.returncode == 0, listed.stderr
    base = services.ui("--token", f"ci:{TOKEN}")
    url = base + "/api/v1/dags/started/runs"
    status, body = post(url, {"conf": {"region": "eu"}, "run_key": "k1"})
    assert status == 201 and body["created"] and body["state"] == "RUNNING", body
    again = post(url, {"conf": {"region": "eu"}, "run_key": "k1"})
    assert again[0] == 200 and again[1]["run_id"] == body["run_id"] and not again[1]["created"]
    bad = post(url, {"conf": {"limit": "many"}})
    assert bad[0] == 400 and bad[1]["field"] == "conf" and "region" in bad[1]["error"], bad
    assert post(base + "/api/v1/dags/nope/runs", {})[0] == 404
    assert post(url, {}, token=None)[0] == 401
    with urllib.request.urlopen(f"{base}/api/v1/runs/{body['run_id']}", timeout=10) as resp:
        run = json.loads(resp.read())
    assert run["dag_id"] == "started" and [t["task_id"] for t in run["tasks"]] == ["show"]
    with urllib.request.urlopen(base + "/api/v1/openapi.json", timeout=10) as resp:
        doc = json.loads(resp.read())
    assert {"/api/v1/events", "/api/v1/dags/{dag_id}/runs"} <= set(doc["paths"])
    assert "EventIn" in doc["components"]["schemas"]
