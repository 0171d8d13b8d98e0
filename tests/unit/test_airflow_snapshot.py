"""What an airflow-triggerer serves on /status and /metrics, from an engine's groups,
without Airflow: grouped by check, bounded at any size, labelled by DAG and class only."""

from __future__ import annotations

from typing import Any

from triggerer.airflow.engine import Engine, Group
from triggerer.airflow.plans import FILE, plan
from triggerer.airflow.rows import Row
from triggerer.airflow.service import EngineCollector
from triggerer.airflow.status import bounded, snapshot

CUSTOM = "my.triggers.Custom"


def _engine(rows: list[Row]) -> Engine:
    engine = Engine(rows=None, interval=1.0)  # type: ignore[arg-type]  # never cycles here
    engine.job_id = 7
    engine.live = [7]
    for row in rows:
        p = plan(row.classpath, row.kwargs)
        group = engine.groups.get(p.key)
        if group is None:
            group = engine.groups[p.key] = Group(p, row.classpath, row.kwargs)
        group.rows[row.id] = row
        engine.member[row.id] = group
    return engine


def _row(tid: int, classpath: str, kwargs: dict[str, Any], dag: str, task: str) -> Row:
    return Row(tid, classpath, kwargs, True, f"{dag}/r/{task}", dag, task, "r", -1, 1, 100.0 + tid)


def test_snapshot_groups_by_check_most_waited_first_and_bounded() -> None:
    rows = [
        _row(i, FILE, {"filepath": "/in/a", "poke_interval": 2.0 + i}, "etl", f"a{i}")
        for i in range(4)
    ]
    rows.append(_row(10, FILE, {"filepath": "/in/b", "poke_interval": 1.0}, "other", "b"))
    rows.append(_row(11, CUSTOM, {"x": 1}, "etl", "c"))
    engine = _engine(rows)

    full = snapshot(engine)
    assert full["slotless"] == "airflow-triggerer" and full["job_id"] == 7
    assert full["triggers"] == 6 and full["check_count"] == 3
    first = full["checks"][0]
    assert first["waiting"] == 4 and first["dags"] == {"etl": 4}
    assert first["interval"] == 2.0  # the shortest poke_interval among its rows
    assert first["since"] == 100.0 and first["checked_by"] == 7
    assert [t["task_id"] for t in first["tasks"]] == ["a0", "a1", "a2", "a3"]
    assert sorted(c["kind"] for c in full["checks"]) == ["adapter", "file", "file"]

    small = snapshot(engine, checks=1, tasks=2)
    assert small["check_count"] == 3 and len(small["checks"]) == 1
    assert len(small["checks"][0]["tasks"]) == 2 and small["checks"][0]["waiting"] == 4


def test_bounded_counts() -> None:
    assert bounded(None, 5) == 5 and bounded("", 5) == 5
    assert bounded("-3", 5) == 0 and bounded("99999999", 5) == 10_000
    try:
        bounded("many", 5)
    except ValueError:
        pass
    else:
        raise AssertionError("a count that is not a number must be refused")


def test_metrics_are_labelled_by_dag_and_class_only() -> None:
    rows = [_row(i, FILE, {"filepath": f"/in/{i}"}, "etl", f"t{i}") for i in range(50)]
    rows.append(_row(99, CUSTOM, {}, "etl", "c"))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in EngineCollector(_engine(rows)).collect()
        for s in m.samples
    }
    by_class = {k: v for k, v in samples.items() if k[0] == "slotless_airflow_waiting_by_class"}
    assert by_class == {
        ("slotless_airflow_waiting_by_class", (("classpath", FILE), ("dag_id", "etl"))): 50,
        ("slotless_airflow_waiting_by_class", (("classpath", CUSTOM), ("dag_id", "etl"))): 1,
    }
    assert samples[("slotless_airflow_checks_by_class", (("classpath", FILE),))] == 50
    assert samples[("slotless_airflow_oldest_wait_seconds", (("dag_id", "etl"),))] > 0
    labels = {name for (_, pairs) in samples for name, _ in pairs}
    assert labels <= {"dag_id", "classpath", "kind", "outcome", "what"}, labels
