"""A DAG's run policy as declared: times of day and durations read or refused naming the
field, and the moments they make on the DAG's clock (DST included)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from zoneinfo import ZoneInfo

import pytest

from executor import DAG
from executor.dag import DagError
from executor.runpolicy import OnTaskFailure, RunPolicy, anchor, moment
from executor.store.runs import RunShape
from triggers.temporal import DateTimeTrigger

NY = ZoneInfo("America/New_York")


def sensor_dag(**kw: object) -> DAG:
    dag = DAG("d")
    dag.sensor("s", DateTimeTrigger(moment=datetime(2100, 1, 1, tzinfo=UTC)), **kw)  # type: ignore[arg-type]
    return dag


def test_policy_is_read_and_kept_with_the_shape() -> None:
    dag = DAG(
        "d", timezone="Asia/Kolkata", deadline="6:00", dagrun_timeout="3h", on_task_failure="pause"
    )
    assert dag.policy == RunPolicy(OnTaskFailure.PAUSE, "06:00:00", 10800.0, "Asia/Kolkata")
    dag.sensor("s", DateTimeTrigger(moment=datetime(2100, 1, 1, tzinfo=UTC)), expected_by="05:30")
    shape = RunShape.of(dag)
    again = RunShape.from_json("d", shape.to_json())
    assert again == shape and again.tasks[0].expected_by == "05:30:00"
    # A DAG without a policy stores the shape as before (a list), read as the default.
    plain = DAG("p")
    plain.task(lambda ctx: None, task_id="t")
    assert RunShape.from_json("p", RunShape.of(plain).to_json()).policy == RunPolicy()
    assert DAG("t", deadline=time(5, 45)).policy.deadline == "05:45:00"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"deadline": "25:00"}, "DAG 'd': deadline '25:00' is not a time of day"),
        ({"deadline": "6am"}, "DAG 'd': deadline '6am' is not a time of day"),
        ({"dagrun_timeout": "3 hours"}, "DAG 'd': dagrun_timeout: cannot read '3 hours'"),
        ({"dagrun_timeout": 0}, "DAG 'd': dagrun_timeout must be longer than 0 s"),
        ({"on_task_failure": "stop"}, "DAG 'd': unknown on_task_failure 'stop' (known: continue"),
    ],
)
def test_bad_dag_options_are_refused_naming_them(kwargs: dict, named: str) -> None:
    with pytest.raises(DagError) as err:
        DAG("d", **kwargs)
    assert named in str(err.value)


def test_a_bad_expected_by_is_refused_naming_the_sensor() -> None:
    with pytest.raises(DagError, match="DAG 'd': sensor 's': expected_by '5:61'"):
        sensor_dag(expected_by="5:61")


def test_times_of_day_count_from_the_runs_anchor_on_its_clock() -> None:
    # A run started by hand for a date: from that day's midnight.
    start = anchor(date(2026, 11, 20), None, NY)
    assert moment("06:00:00", start) == datetime(2026, 11, 20, 6, tzinfo=NY).timestamp()
    # A scheduled run: from when it became due (its interval's end), the first 06:00 after.
    due = datetime(2026, 11, 21, 5, 0, tzinfo=UTC)  # 00:00 in New York
    start = anchor(date(2026, 11, 20), due, NY)
    assert moment("06:00:00", start) == datetime(2026, 11, 21, 6, tzinfo=NY).timestamp()
    assert moment("00:00:00", start) == due.timestamp()  # at the anchor itself: that moment
    # 02:30 does not exist on 2026-03-08 in New York: taken an hour later (03:30 EDT).
    start = anchor(date(2026, 3, 8), None, NY)
    assert moment("02:30:00", start) == datetime(2026, 3, 8, 7, 30, tzinfo=UTC).timestamp()
    # 01:30 happens twice on 2026-11-01: the first (EDT).
    start = anchor(date(2026, 11, 1), None, NY)
    assert moment("01:30:00", start) == datetime(2026, 11, 1, 5, 30, tzinfo=UTC).timestamp()


def test_the_example_declares_a_policy_and_a_late_sensor() -> None:
    from pathlib import Path

    from executor.loader import load_dag

    path = Path(__file__).resolve().parents[2] / "examples" / "deadlines.py"
    dag = load_dag(str(path), "deadlines")
    dag.validate()
    assert dag.policy.on_task_failure is OnTaskFailure.FAIL_FAST
    assert RunShape.of(dag).has_times
