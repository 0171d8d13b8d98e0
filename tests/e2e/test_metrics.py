"""The Prometheus endpoints of `slotless worker` and `slotless triggerer`, scraped and parsed
while a DAG with deferred sensors runs; and a metrics port already taken."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.helpers import cli, free_port, start_cli, stop_process
from support.ops import (
    create_ops_run,
    poll,
    present,
    sample,
    scrape,
    wait_for_http,
    write_ops_dag,
)

from executor.store import open_store

pytestmark = pytest.mark.slow


async def test_metrics_while_deferred_sensors_wait_and_fire(tmp_path: Path, db_url: str):
    dag_path, inbox = write_ops_dag(tmp_path)
    store = await open_store(db_url)
    try:
        run_id = await create_ops_run(store, dag_path)
    finally:
        await store.close()

    wport, tport = free_port(), free_port()
    wlog, tlog = tmp_path / "worker.log", tmp_path / "triggerer.log"
    worker = start_cli(
        "worker", "--db", db_url, "--slots", "4", "--poll-interval", "0.05",
        "--metrics-port", str(wport), log=wlog,
    )  # fmt: skip
    triggerer = start_cli(
        "triggerer",
        "--db",
        db_url,
        "--lease-ttl",
        "3",
        "--push",
        "--metrics-port",
        str(tport),
        log=tlog,
    )
    wurl = f"http://127.0.0.1:{wport}/metrics"
    turl = f"http://127.0.0.1:{tport}/metrics"
    try:
        wait_for_http(wurl, worker, wlog)
        wait_for_http(turl, triggerer, tlog)

        # Both sensors wait on one file: two waits, one distinct check, held by the triggerer.
        def triggerer_holds_both():
            s, _ = scrape(turl)
            expect(s, slotless_triggerer_triggers=2, slotless_triggerer_distinct_checks=1)
            assert (sample(s, "slotless_triggerer_checks_total") or 0) >= 1, "no check yet"
            lag = sample(s, "slotless_triggerer_loop_lag_seconds_count") or 0
            assert lag > 0, "no loop-lag sample yet"
            return s

        ts = poll(triggerer_holds_both, 60, "the triggerer to hold and check both waits")
        _, ttypes = scrape(turl)
        assert sample(ts, "slotless_triggerer_shards") == 64
        assert sample(ts, "slotless_triggerer_subscribers_per_check_bucket", le="1") == 0
        assert sample(ts, "slotless_triggerer_subscribers_per_check_bucket", le="2") == 1
        assert sample(ts, "slotless_triggerer_events_fired_total") == 0
        assert sample(ts, "slotless_triggerer_checks_failed_total") == 0
        assert ttypes["slotless_triggerer_loop_lag_seconds"] == "histogram"
        assert ttypes["slotless_triggerer_check_duration_seconds"] == "histogram"
        assert present(ts, "slotless_triggerer_loop_lag_seconds_count") > 0
        cls = "triggers.files.FileTrigger"
        count = present(ts, "slotless_triggerer_check_duration_seconds_count", trigger_class=cls)
        assert count >= 1
        assert present(ts, "slotless_triggerer_check_duration_seconds_bucket", le="+Inf",
                      trigger_class=cls) >= 1  # fmt: skip
        assert ttypes["slotless_triggerer_blocked"] == "counter"
        (tid,) = [k[1][0][1] for k in ts if k[0] == "slotless_triggerer_info"]
        assert tid

        # The file both wait on is pushed by one inotify watch on its directory.
        def one_live_source():
            s, _ = scrape(turl)
            assert sample(s, "slotless_triggerer_push_sources", state="live") == 1
            assert sample(s, "slotless_triggerer_push_sources", state="polled") == 0
            return s

        poll(one_live_source, 30, "the directory's watch to be live")

        # The worker: its own counters, and the store-wide gauges.
        def worker_settled():
            s, _ = scrape(wurl)
            settled = (("DEFERRED", 2), ("RETRYING", 1), ("SENSING", 1), ("FAILED", 1),
                       ("UPSTREAM_FAILED", 1), ("SUCCESS", 4), ("RUNNING", 0))  # fmt: skip
            for state, n in settled:
                got = sample(s, "slotless_tasks", state=state) or 0
                assert got == n, f"slotless_tasks{{state={state}}} is {got}, not {n}"
            expect(s, slotless_shards_unowned=0)
            return s

        ws = poll(worker_settled, 60, "the run to settle in the worker's metrics")
        _, wtypes = scrape(wurl)
        assert sample(ws, "slotless_worker_slots") == 4
        assert 0 <= present(ws, "slotless_worker_slots_busy") <= 4
        assert wtypes["slotless_worker_slots_busy"] == "gauge"
        assert wtypes["slotless_slot_seconds"] == "counter"
        assert present(ws, "slotless_worker_claims_total") >= 9
        assert sample(ws, "slotless_worker_attempts_total", outcome="defer") == 2
        assert sample(ws, "slotless_worker_attempts_total", outcome="reschedule") == 1
        assert sample(ws, "slotless_worker_attempts_total", outcome="error") == 2
        assert present(ws, "slotless_slot_seconds_total", kind="execute") > 0
        assert sample(ws, "slotless_slot_seconds_total", kind="poke") == 0
        assert sample(ws, "slotless_runs", state="RUNNING") == 1
        assert sample(ws, "slotless_tasks", state="FAILED") == 1
        assert sample(ws, "slotless_tasks", state="UPSTREAM_FAILED") == 1
        assert sample(ws, "slotless_tasks", state="SUCCESS") == 4
        assert present(ws, "slotless_task_waiting_oldest_seconds", state="DEFERRED") > 0
        assert present(ws, "slotless_task_waiting_oldest_seconds", state="RETRYING") > 0
        assert 0 < present(ws, "slotless_task_wait_timeout_ratio_max", state="DEFERRED") < 0.05
        assert sample(ws, "slotless_triggerers_live") == 1
        assert sample(ws, "slotless_store_up") == 1
        (wid,) = [k[1][0][1] for k in ws if k[0] == "slotless_worker_info"]
        assert wid

        # The file lands: one check fires once for both waits; the downstream task runs.
        (inbox / "ready.flag").write_text("ok")

        def fired():
            t, _ = scrape(turl)
            w, _ = scrape(wurl)
            expect(t, slotless_triggerer_events_fired_total=1, slotless_triggerer_triggers=0)
            tasks = {st: sample(w, "slotless_tasks", state=st) for st in ("DEFERRED", "PENDING")}
            assert tasks == {"DEFERRED": 0, "PENDING": 0}, tasks
            done = sample(w, "slotless_worker_attempts_total", outcome="success")
            assert done == 5, f"{done} successful attempts, not 5"
            return t, w

        t, w = poll(fired, 60, "the sensors to fire and `load` to run")
        assert sample(t, "slotless_triggerer_distinct_checks") == 0
        assert sample(w, "slotless_tasks", state="SUCCESS") == 7
        assert sample(w, "slotless_task_waiting_oldest_seconds", state="DEFERRED") == 0
        assert run_id
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- worker log:\n{wlog.read_text()}\n--- triggerer log:\n{tlog.read_text()}"
        ) from None
    finally:
        wcode = stop_process(worker)
        tcode = stop_process(triggerer)
    assert wcode == 0, wlog.read_text()
    assert tcode == 0, tlog.read_text()


def expect(samples, **values: float) -> None:
    for name, value in values.items():
        assert sample(samples, name) == value, f"{name} is {sample(samples, name)}, not {value}"


@pytest.mark.parametrize("command", ["worker", "triggerer"])
def test_a_metrics_port_already_taken_fails_the_start_naming_it(command: str, db_url: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(command, "--db", db_url, "--metrics-port", str(port), timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"slotless: error: metrics port {port} is already in use on 127.0.0.1 "
        "(another process listens there; pick another --metrics-port)"
    ], done.stderr
