"""The Amazon provider's ``S3KeyTrigger`` checked natively by ``slotless airflow-triggerer``,
against a real Airflow 3.3 metadata database and moto's S3 server.

Task instances are deferred through Airflow's own ORM as its worker and execution API defer
them (tests/support/airflow_deferred.py), each with the trigger the provider's
``S3KeySensor(deferrable=True)`` makes, serialized by the provider itself. Their AWS
connection is a row of Airflow's connection table whose extra points at moto
(``endpoint_url``); moto runs in this process and counts every request it receives.

Shown: 30 task instances on 10 keys under one prefix, plus a wildcard under it, are 11
checks answered by ONE ListObjectsV2 per interval (counted by moto, and equal to the
process's own count on /metrics), with no HEAD; when the objects are put each task
instance leaves DEFERRED with the provider's payload ``{"status": "success"}``; a row on a
bucket that does not exist fails its task instance alone, in one line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.airflow_deployment import slotless_metrics
from support.airflow_home import AirflowHome
from support.helpers import free_port, stop_process, wait_until
from support.pg import fetch
from support.servers import MotoS3Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

S3KEY = "airflow.providers.amazon.aws.triggers.s3.S3KeyTrigger"
BUCKET = "native-lake"
KEYS = [f"in/k{i}.csv" for i in range(10)]
# Three task instances per key, at three poke_intervals: one check, at the shortest.
INTERVALS = (0.5, 1.0, 5.0)
WAITS = {f"k{i}_{n}": (key, s) for i, key in enumerate(KEYS) for n, s in enumerate(INTERVALS)}
TASKS = [*WAITS, "pattern", "nobucket"]
CHECKS = len(KEYS) + 1  # the ten keys and the pattern

DAG = f"""
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("s3waits", schedule=None, start_date=datetime(2026, 1, 1)):
    for name in {TASKS!r}:
        EmptyOperator(task_id=name)
"""

STATES = "SELECT task_id, state FROM task_instance WHERE dag_id = 's3waits' AND run_id = $1"


class Airflow(AirflowHome):
    """An Airflow home and metadata database, and the commands run against them."""

    def __init__(self, python: Path, tmp: Path, url: str, pg_url: str) -> None:
        # boto3's own chain must not find credentials elsewhere: the connection's only.
        no_aws = {
            "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
        }
        super().__init__(python, tmp, url, pg_url, {"s3waits.py": DAG}, no_aws)

    def deferred(self, run_id: str) -> set[str]:
        """The task instances still DEFERRED: one query, not a Python with Airflow."""
        rows = asyncio.run(fetch(self.pg_url, STATES, run_id))
        return {r["task_id"] for r in rows if r["state"] == "deferred"}


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3Server]:
    server = MotoS3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airflow]:
    with Airflow.migrated(tmp_path_factory, "slotless_airflow_s3") as af:
        yield af


def _trigger(task_id: str, bucket: str, key: str, interval: float, **more: Any) -> dict[str, Any]:
    # What S3KeySensor(deferrable=True)._defer() builds, serialized by the provider.
    args = {
        "bucket_name": bucket,
        "bucket_key": key,
        "aws_conn_id": "lake",
        "poke_interval": interval,
        "should_check_fn": False,
        **more,
    }
    return {"task_id": task_id, "classpath": S3KEY, "args": args}


def test_s3_key_waits_are_one_listing_per_interval(
    airflow: Airflow, moto: MotoS3Server, tmp_path: Path
) -> None:
    moto.make_bucket(BUCKET, ["in/unrelated.txt", "elsewhere/a.csv"])
    tasks = [_trigger(name, BUCKET, key, interval) for name, (key, interval) in WAITS.items()]
    tasks.append(_trigger("pattern", BUCKET, "in/*/late.csv", 0.5, wildcard_match=True))
    tasks.append(_trigger("nobucket", "no-such-lake", "in/k0.csv", 0.5))
    extra = f"endpoint_url={quote(moto.endpoint, safe='')}&region_name=us-east-1"
    spec = {
        "dag_id": "s3waits",
        "run_id": "r1",
        "tasks": tasks,
        "connections": {"lake": f"aws://testing:testing@/?{extra}"},
    }
    assert set(airflow.helper("defer", spec)) == set(TASKS)
    assert airflow.deferred("r1") == set(TASKS)

    port = free_port()
    log = tmp_path / "triggerer.log"
    proc = airflow.start_triggerer(log, "--metrics-port", str(port))

    def metrics() -> dict[str, float]:
        assert proc.poll() is None, log.read_text()[-3000:]
        return slotless_metrics(port)

    try:
        # The missing bucket fails its task instance alone; the others are held.
        wait_until(
            lambda: "nobucket" not in airflow.deferred("r1"),
            timeout=60,
            interval=0.3,
            what="the row on a missing bucket to fail",
        )
        wait_until(
            lambda: metrics().get('slotless_airflow_checks{kind="s3"}') == CHECKS,
            timeout=30,
            what=f"{len(TASKS) - 1} rows held as {CHECKS} native S3 checks",
        )
        m = metrics()
        assert m["slotless_airflow_triggers"] == len(TASKS) - 1
        assert m['slotless_airflow_checks{kind="adapter"}'] == 0

        # Four listings as moto counts them, while the 11 checks go on: each listing must
        # have answered all 11 (a listing per check would be 11 per round; a check twice
        # per interval, 22 checks per listing). A round read mid-way is one off each end.
        checks = 'slotless_airflow_native_checks_total{kind="s3"}'
        listings = "slotless_airflow_s3_listings_total"
        first, lists, made = m[checks], moto.count("ListObjectsV2"), m[listings]
        wait_until(
            lambda: moto.count("ListObjectsV2") >= lists + 4,
            timeout=30,
            interval=0.05,
            what="four more listings",
        )
        listed = moto.count("ListObjectsV2") - lists
        m = metrics()
        checked = m[checks] - first
        assert CHECKS * (listed - 2) <= checked <= CHECKS * (listed + 2), (listed, checked)
        # The process counts the requests moto saw (read moments apart: a round off).
        assert listed - 1 <= m[listings] - made <= listed + 2, (listed, m[listings] - made)
        assert moto.count("HeadObject") == 0
        assert airflow.deferred("r1") == set(TASKS) - {"nobucket"}

        for key in KEYS:
            moto.put(BUCKET, key)
        moto.put(BUCKET, "in/deep/late.csv")
        wait_until(
            lambda: not airflow.deferred("r1"),
            timeout=60,
            interval=0.3,
            what="every task instance to resume",
        )
        states = airflow.helper("states", {"dag_id": "s3waits", "run_id": "r1"})
        for name in [*WAITS, "pattern"]:
            s = states[name]
            assert s["state"] == "scheduled" and s["trigger_id"] is None, (name, s)
            assert s["next_method"] == "execute_complete", (name, s)
            assert s["next_kwargs"] == {"asked": name, "event": {"status": "success"}}, s
        failed = states["nobucket"]
        assert failed["next_method"] == "__fail__"
        said = failed["next_kwargs"]["traceback"]
        assert len(said) == 1 and said[0].count("\n") == 1, said  # one line
        assert "S3 bucket 'no-such-lake' does not exist (connection 'lake')" in said[0]
        m = metrics()
        assert m['slotless_airflow_submitted_total{outcome="event"}'] == len(TASKS) - 1
        assert m['slotless_airflow_submitted_total{outcome="failure"}'] == 1
    finally:
        code = stop_process(proc)
    assert code == 0, log.read_text()[-3000:]
