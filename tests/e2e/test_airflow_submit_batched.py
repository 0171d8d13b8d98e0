"""Outcomes written for a whole batch of trigger ids at once (triggerer/airflow/submitting.py)
leave the rows Airflow's own ``Trigger.submit_event`` / ``submit_failure``, called once per
trigger id, would leave, on a real Airflow 3.3 metadata database on PostgreSQL.

Two runs of one DAG are deferred alike (tests/support/airflow_deferred.py, through Airflow's
ORM); the same outcomes are written to one run's trigger ids through ``AirflowRows.submit``
with Airflow's per-id methods and to the other's with the batched write
(tests/support/airflow_submitting.py); their task instances, XComs, callback requests, and
the asset events and triggerer callbacks the outcomes reach, must be the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.airflow_home import AirflowHome

# The first test may build .venv-airflow (a minute on a quiet machine, several on a busy one).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STD = "airflow.providers.standard.triggers"
TASKS = ["e1", "e2", "ok", "fail_text", "fail_raised", "gone", "twice"]
MANY = 1_010  # the timing DAG's tasks: 1,000 timed, 10 to warm up

DAG = f"""
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.triggers.file import FileDeleteTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

with DAG("pairs", schedule=None, start_date=datetime(2026, 1, 1)):
    for name in {TASKS!r}:
        EmptyOperator(task_id=name)

with DAG("many", schedule=None, start_date=datetime(2026, 1, 1)):
    for n in range({MANY}):
        EmptyOperator(task_id=f"t{{n}}")

# An asset watcher: a trigger row with no task instance, whose events become asset events.
watcher = AssetWatcher(
    name="landed_file", trigger=FileDeleteTrigger(filepath="/nowhere/landed", poke_interval=9)
)
with DAG("watched", schedule=[Asset("landed", watchers=[watcher])],
         start_date=datetime(2026, 1, 1)):
    EmptyOperator(task_id="go")
"""


class Home(AirflowHome):
    def __init__(self, python: Path, tmp: Path, url: str, pg_url: str) -> None:
        # Airflow makes an asset's watchers' trigger rows for unpaused DAGs only.
        paused = {"AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"}
        super().__init__(python, tmp, url, pg_url, {"pairs.py": DAG}, paused)

    def defer(self, dag_id: str, run_id: str, names: list[str]) -> dict[str, int]:
        tasks = [
            {
                "task_id": name,
                "classpath": f"{STD}.file.FileTrigger",
                "args": {"filepath": f"/nowhere/{name}"},
            }
            for name in names
        ]
        return self.helper("defer", {"dag_id": dag_id, "run_id": run_id, "tasks": tasks})

    def submitting(self, command: str, spec: Any) -> Any:
        done = self.run(
            str(self.python),
            "-m",
            "support.airflow_submitting",
            command,
            stdin=json.dumps(spec),
            timeout=600,
        )
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line.removeprefix("RESULT "))
        raise AssertionError(f"airflow_submitting {command}:\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    with Home.migrated(tmp_path_factory, "slotless_submit") as h:
        yield h


def _outcomes(ids: dict[str, int], watcher: int, callback: int) -> list[dict[str, Any]]:
    """One batch of every kind of outcome, on one run's trigger ids."""
    return [
        {"ids": [ids["e1"], ids["e2"]], "kind": "event", "payload": {"status": "success"}},
        {"ids": [ids["ok"]], "kind": "success", "xcoms": {"found": "/nowhere/ok"}},
        {"ids": [ids["fail_text"]], "kind": "failure", "error": "the source said no"},
        {"ids": [ids["fail_raised"]], "kind": "raised", "error": "it broke"},
        # Its task instance is no longer DEFERRED: nothing is written to it.
        {"ids": [ids["gone"]], "kind": "event", "payload": "late"},
        # One trigger id twice in a batch: the first event resumes its task instance.
        {"ids": [ids["twice"]], "kind": "event", "payload": "first"},
        {"ids": [ids["twice"]], "kind": "event", "payload": "second"},
        # An asset watcher's trigger (no task instance): each event is an asset event.
        {"ids": [watcher], "kind": "event", "payload": {"path": "/nowhere/landed", "n": 1}},
        {"ids": [watcher], "kind": "event", "payload": {"path": "/nowhere/landed", "n": 2}},
        # A triggerer callback's trigger: running, then done (its trigger let go).
        {"ids": [callback], "kind": "event", "payload": {"state": "running"}},
        {"ids": [callback], "kind": "event", "payload": {"state": "success", "body": "ok"}},
    ]


def _watcher(home: Home) -> int:
    import asyncio

    from support.pg import fetch

    rows = asyncio.run(fetch(home.pg_url, "SELECT trigger_id FROM asset_watcher"))
    [row] = rows
    return int(row["trigger_id"])


def _written(home: Home, run_id: str, mode: str, callback: dict[str, Any]) -> dict[str, Any]:
    ids = home.defer("pairs", run_id, TASKS)
    home.helper("set_states", {"dag_id": "pairs", "run_id": run_id, "tasks": {"gone": "success"}})
    before = home.submitting("rows", {"dag_id": "pairs", "run_id": run_id})
    done = home.submitting(
        "submit", {"mode": mode, "outcomes": _outcomes(ids, _watcher(home), callback["trigger_id"])}
    )
    # Every id counted as written, the one whose task instance had left DEFERRED too.
    assert done["written"] == [2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] and done["skipped"] == 0
    after = home.submitting("rows", {"dag_id": "pairs", "run_id": run_id})
    named = {tid: name for name, tid in ids.items()}
    for ti in after["tis"].values():  # a trigger kept is named by its task (ids differ by run)
        ti["trigger_id"] = named.get(ti["trigger_id"], ti["trigger_id"])
    new_events = after["asset_events"][len(before["asset_events"]) :]
    had = {c["id"] for c in before["callbacks"]} - {callback["id"]}
    new_callbacks = [_same_part(c) for c in after["callbacks"] if c["id"] not in had]
    # The run's own name appears in its callback requests: the same text either way.
    text = json.dumps(
        {"tis": after["tis"], "asset_events": new_events, "callbacks": new_callbacks}
    ).replace(run_id, "RUN")
    return dict(json.loads(text))


def _same_part(callback: dict[str, Any]) -> dict[str, Any]:
    """A callback as comparable between runs: without its own id, and a callback request's
    task instance without its id and trace context (which differ from run to run)."""
    out = {k: v for k, v in callback.items() if k != "id"}
    if "req_data" in out["data"]:
        request = json.loads(out["data"]["req_data"])
        request["ti"] = {
            k: v for k, v in request["ti"].items() if k not in ("id", "context_carrier")
        }
        out["data"] = {**out["data"], "req_data": request}
    return out


def test_a_batch_leaves_the_rows_airflows_per_id_methods_leave(home: Home) -> None:
    cb_per_id, cb_batched, cb_flush_each = home.submitting("callbacks", {"n": 3})
    theirs = _written(home, "per_id", "per_id", cb_per_id)
    ours = _written(home, "batched", "batched", cb_batched)
    flushed = _written(home, "flush_each", "flush_each", cb_flush_each)

    tis = ours["tis"]
    # The rows are what they should be (not merely equal to another run's).
    for name in ["e1", "e2", "twice"]:
        assert tis[name]["state"] == "scheduled" and tis[name]["trigger_id"] is None
        assert tis[name]["scheduled"] and tis[name]["next_method"] == "execute_complete"
    assert "status" in json.dumps(tis["e1"]["next_kwargs"])
    assert "first" in json.dumps(tis["twice"]["next_kwargs"])
    assert "second" not in json.dumps(tis["twice"]["next_kwargs"])
    assert tis["ok"]["state"] == "success" and tis["ok"]["ended"]
    # Pushed by Airflow's handler (stored as JSON text).
    assert {k: json.loads(v) for k, v in tis["ok"]["xcoms"].items()} == {"found": "/nowhere/ok"}
    for name, said in [("fail_text", "the source said no"), ("fail_raised", "it broke")]:
        assert tis[name]["state"] == "scheduled" and tis[name]["next_method"] == "__fail__"
        assert said in json.dumps(tis[name]["next_kwargs"])
    assert "RuntimeError" in json.dumps(tis["fail_raised"]["next_kwargs"])
    assert tis["gone"]["state"] == "success" and tis["gone"]["next_method"] == "execute_complete"
    assert [e["extra"]["payload"]["n"] for e in ours["asset_events"]] == [1, 2]
    assert all(e["extra"]["from_trigger"] for e in ours["asset_events"])
    states = [(c["type"], c["state"], c["has_trigger"]) for c in ours["callbacks"]]
    assert ("triggerer", "success", False) in states
    assert any(c["type"] == "dag_processor" for c in ours["callbacks"])  # the ok task's

    # And identical to what Airflow's own methods, per id, left.
    for same in (ours, flushed):
        for name in TASKS:
            assert same["tis"][name] == theirs["tis"][name], name
        assert same == theirs


def test_a_batch_costs_a_fraction_of_the_per_id_writes(home: Home) -> None:
    """``AirflowRows.submit`` of N trigger ids, one file event each (a burst of files):
    Airflow's methods per id, the batched write with Airflow's flush per task instance,
    and the batched write. Run with ``-s`` to see the figures."""
    warm = 10
    took: dict[tuple[str, int], float] = {}
    for n in (100, 1_000):
        for mode in ("per_id", "flush_each", "batched"):
            run_id = f"{mode}_{n}"
            ids = home.defer("many", run_id, [f"t{i}" for i in range(n + warm)])
            outcomes = [{"ids": [tid], "kind": "event", "payload": True} for tid in ids.values()]
            done = home.submitting("submit", {"mode": mode, "outcomes": outcomes, "warm": warm})
            assert sum(done["written"]) == n
            took[mode, n] = done["seconds"]
            left = home.submitting("rows", {"dag_id": "many", "run_id": run_id})["tis"]
            assert sum(ti["state"] == "scheduled" for ti in left.values()) == n + warm
    # 1,000 ids as the engine writes them: transactions of at most SUBMIT_IDS ids each.
    for most in (100, 250):
        run_id = f"in_{most}s"
        ids = home.defer("many", run_id, [f"t{i}" for i in range(1_000 + warm)])
        outcomes = [{"ids": [tid], "kind": "event", "payload": True} for tid in ids.values()]
        spec = {"mode": "batched", "outcomes": outcomes, "warm": warm, "most": most}
        took[f"batched in {most}s", 1_000] = home.submitting("submit", spec)["seconds"]
    for (mode, n), s in took.items():
        print(f"{mode:>16} {n:>5} ids: {s:7.3f} s, {1000 * s / n:6.2f} ms per id")
    # Well under half the per-id cost (measured here: about a fifth).
    assert took["batched", 1_000] < took["per_id", 1_000] / 2
