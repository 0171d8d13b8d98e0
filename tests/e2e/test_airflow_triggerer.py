"""``slotless airflow-triggerer`` against a real Airflow 3.3 metadata database on PostgreSQL.

Airflow (from ``.venv-airflow``, benchmarks/airflow_env.py) migrates a private database made
for this module (``airflow db migrate``), dropped after it. Task instances are deferred
through Airflow's own ORM as its worker and execution API defer them
(tests/support/airflow_deferred.py): a DagRun made by Airflow's ``create_dagrun``, each
task instance DEFERRED with a Trigger row, next_method and next_kwargs. Then
``slotless airflow-triggerer`` runs as a process and must put them back as Airflow's own
triggerer would: SCHEDULED, with the event in next_kwargs (or ``__fail__`` and the error).

How equal waits are shown to be one check: the process's /metrics counts its native file
checks, and five task instances on one FileTrigger (poke_interval 0.5 s) must take at least
three intervals for four checks (five checks per interval, one per row, would take none).
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.airflow_deployment import slotless_metrics
from support.airflow_home import AirflowHome, fernet_key
from support.helpers import free_port, stop_process, wait_until
from support.pg import fetch

from triggers.inotify import POLL_FSTYPES_ENV

# The first test may build .venv-airflow (a minute on a quiet machine, several on a busy one).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STD = "airflow.providers.standard.triggers"
HERE = "support.airflow_triggers"
FILES = [f"file{i}" for i in range(5)]
TASKS = [
    *FILES,
    "delta",
    "flag",
    "conn",
    "queued",
    "raises",
    "unknown",
    "badkey",
    "dagstate",
    "sdk",
]

DAG = f"""
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.triggers.file import FileDeleteTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

with DAG("waits", schedule=None, start_date=datetime(2026, 1, 1)):
    for name in {TASKS!r}:
        EmptyOperator(task_id=name)

# An asset watcher: a trigger row with no task instance, kept running after each event.
LANDED = "{{inbox}}/landed"
watcher = AssetWatcher(
    name="landed_file", trigger=FileDeleteTrigger(filepath=LANDED, poke_interval=0.5)
)
with DAG(
    "watched",
    schedule=[Asset("landed", watchers=[watcher])],
    start_date=datetime(2026, 1, 1),
):
    EmptyOperator(task_id="go")
"""


class Deployment(AirflowHome):
    """An Airflow home and metadata database, and the commands run against them."""

    def __init__(self, python: Path, tmp: Path, url: str, pg_url: str) -> None:
        self.inbox = tmp / "inbox"
        self.inbox.mkdir()
        # Airflow makes an asset's watchers' trigger rows for unpaused DAGs only.
        paused = {"AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"}
        dags = {"waits.py": DAG.replace("{inbox}", str(self.inbox))}
        super().__init__(python, tmp, url, pg_url, dags, paused)

    def states(self, run_id: str) -> dict[str, Any]:
        """Each task instance's state, next_method, next_kwargs (decoded by Airflow's own
        serde, in .venv-airflow) and trigger_id."""
        return self.helper("states", {"dag_id": "waits", "run_id": run_id})

    def left_deferred(self, run_id: str, names: list[str]) -> bool:
        """All of ``names`` out of DEFERRED: read with one query, not a Python with Airflow
        started per poll."""
        rows = asyncio.run(fetch(self.pg_url, _STATE_QUERY, run_id))
        states = {r["task_id"]: r["state"] for r in rows}
        return all(states.get(n) not in (None, "deferred") for n in names)


_STATE_QUERY = "SELECT task_id, state FROM task_instance WHERE dag_id = 'waits' AND run_id = $1"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with Deployment.migrated(tmp_path_factory, "slotless_airflow") as dep:
        yield dep


def test_deferred_task_instances_resume_as_airflows_triggerer_would(
    deployment: Deployment, tmp_path: Path
) -> None:
    dep = deployment
    data = str(dep.inbox / "data.csv")
    flag = str(dep.inbox / "flag")
    other_key = fernet_key()
    file_wait = {"classpath": f"{STD}.file.FileTrigger", "args": {"filepath": data}}
    tasks: list[dict[str, Any]] = [
        {**file_wait, "task_id": name, "args": {"filepath": data, "poke_interval": 0.5}}
        for name in FILES
    ]
    tasks += [
        {
            "task_id": "delta",
            "classpath": f"{STD}.temporal.TimeDeltaTrigger",
            "args": {"delta": {"seconds": 1}},
        },
        {"task_id": "flag", "classpath": f"{HERE}.FlagTrigger", "args": {"path": flag}},
        # Its connection is in Airflow's connection table, not in the environment.
        {"task_id": "conn", "classpath": f"{HERE}.ConnTrigger", "args": {"conn_id": "dw"}},
        {
            "task_id": "raises",
            "classpath": f"{HERE}.RaisingTrigger",
            "args": {"message": "the source said no"},
        },
        {"task_id": "unknown", "raw_classpath": "nowhere.triggers.Gone", "raw_kwargs": {}},
        # Checked natively: the count and the state from one read of Airflow's dag_run.
        {
            "task_id": "dagstate",
            "classpath": f"{STD}.external_task.DagStateTrigger",
            "args": {"dag_id": "waits", "states": ["running"], "run_ids": ["r1"]},
        },
        # The same questions from a class run through the adapter: the Task SDK asks the
        # triggerer supervisor (RuntimeTaskInstance.get_dr_count, get_dagrun_state).
        {
            "task_id": "sdk",
            "classpath": f"{HERE}.RunStateTrigger",
            "args": {"dag_id": "waits", "run_id": "r1"},
        },
        # A row in a trigger queue: not this triggerer's (it serves no queue).
        {**file_wait, "task_id": "queued", "queue": "elsewhere"},
        # Kwargs encrypted with a key this deployment does not have.
        {
            **file_wait,
            "task_id": "badkey",
            "args": {"filepath": str(dep.inbox / "never")},
            "fernet_key": other_key,
        },
    ]
    spec = {
        "dag_id": "waits",
        "run_id": "r1",
        "tasks": tasks,
        "connections": {"dw": "postgres://bob:pw@dw.example:6543/dw"},
    }
    ids = dep.helper("defer", spec)
    assert set(ids) == set(TASKS)
    assert all(s["state"] == "deferred" for s in dep.states("r1").values())

    port = free_port()
    log = tmp_path / "triggerer.log"
    proc = dep.start_triggerer(log, "--metrics-port", str(port), "--interval", "0.5")
    try:

        def settled(names: list[str]) -> dict[str, Any] | None:
            assert proc.poll() is None, log.read_text()[-3000:]
            if not dep.left_deferred("r1", names):
                return None
            states = dep.states("r1")
            # Put back as Airflow's triggerer does: SCHEDULED, no trigger.
            assert all(states[n]["state"] == "scheduled" for n in names), states
            assert all(states[n]["trigger_id"] is None for n in names), states
            return states

        states = wait_until(
            lambda: settled(["delta", "conn", "raises", "unknown", "badkey", "dagstate", "sdk"]),
            timeout=90,
            interval=0.5,
            what="the moment, the connection, the DAG state and three failures to resume",
        )
        # The moment: resumed with DateTimeTrigger's own payload, next_kwargs kept.
        delta = states["delta"]
        assert delta["next_method"] == "execute_complete"
        assert delta["next_kwargs"]["asked"] == "delta"
        assert delta["next_kwargs"]["event"].startswith("20")
        assert delta["trigger_id"] is None
        # This run is running: read natively, and answered to the Task SDK's calls.
        dagstate = states["dagstate"]["next_kwargs"]["event"]
        assert dagstate[0] == f"{STD}.external_task.DagStateTrigger"
        assert dagstate[1]["r1"] == "running"
        assert states["sdk"]["next_kwargs"]["event"] == {"count": 1, "state": "running"}
        conn = states["conn"]["next_kwargs"]["event"]
        assert conn == {"host": "dw.example", "login": "bob", "port": 6543}
        # Each failure is its own task instance's, through submit_failure, with its error.
        for name, said in [
            ("raises", "the source said no"),
            ("unknown", "nowhere.triggers.Gone"),
            ("badkey", "fernet_key"),
        ]:
            s = states[name]
            assert s["next_method"] == "__fail__", (name, s)
            assert s["next_kwargs"]["error"] == "Trigger failure"
            assert said in "".join(s["next_kwargs"]["traceback"]), (name, s)
        # The rest still wait, and the process is up.
        assert all(states[n]["state"] == "deferred" for n in [*FILES, "flag", "queued"])
        assert proc.poll() is None

        # Five task instances on one file: one check.
        wait_until(
            lambda: slotless_metrics(port).get("slotless_airflow_triggers") == 7,
            timeout=30,
            what="the six waiting rows and the asset watcher's held",
        )
        m = slotless_metrics(port)
        assert m['slotless_airflow_waiting{dag_id="waits"}'] == 6
        assert m['slotless_airflow_checks{kind="file"}'] == 1
        assert m['slotless_airflow_checks{kind="adapter"}'] == 2
        # Its directory is watched (inotify): the path is looked at when held, then only
        # when a name lands there (or every native_files.SAFETY_S), not at its 0.5 s
        # interval; the interval-polled case is the two-instance test's.
        key = 'slotless_airflow_native_checks_total{kind="file"}'
        first = wait_until(lambda: slotless_metrics(port).get(key), what="the file's first check")
        began = time.monotonic()

        # Airflow sees a healthy triggerer.
        check = dep.run(str(dep.bin / "airflow"), "jobs", "check", "--job-type", "TriggererJob")
        assert check.returncode == 0, check.stdout + check.stderr
        assert time.monotonic() - began > 1.0  # two intervals and more, in which ...
        assert slotless_metrics(port)[key] == first  # ... nothing was looked at again

        Path(data).write_text("a,b\n")
        Path(flag).write_text("go")
        states = wait_until(
            lambda: settled([*FILES, "flag"]),
            timeout=60,
            interval=0.5,
            what="the file's and the flag's task instances to resume",
        )
        for name in FILES:
            assert states[name]["next_method"] == "execute_complete"
            assert states[name]["next_kwargs"] == {"asked": name, "event": True}
        assert states["flag"]["next_kwargs"]["event"] == {"path": flag, "content": "go"}
        m = slotless_metrics(port)
        fired = [*FILES, "delta", "conn", "dagstate", "sdk", "flag"]
        assert m['slotless_airflow_submitted_total{outcome="event"}'] == len(fired)

        # The asset watcher: each file that lands is an asset event, and it keeps watching.
        landed = dep.inbox / "landed"

        def asset_events(want: int) -> bool:
            return len(asyncio.run(fetch(dep.pg_url, "SELECT id FROM asset_event"))) == want

        for n in (1, 2):
            landed.write_text(str(n))
            wait_until(
                functools.partial(asset_events, n),
                timeout=30,
                interval=0.2,
                what=f"asset event {n}",
            )
        events = asyncio.run(fetch(dep.pg_url, "SELECT extra FROM asset_event"))
        expected = {"from_trigger": True, "payload": True}  # FileDeleteTrigger's event: True
        assert all(json.loads(e["extra"]) == expected for e in events)
        assert proc.poll() is None
        assert m['slotless_airflow_submitted_total{outcome="failure"}'] == 3
        # The queued row was never taken.
        assert dep.states("r1")["queued"]["state"] == "deferred"
    finally:
        code = stop_process(proc)
    assert code == 0, log.read_text()[-3000:]
    # The Job ended with the process: Airflow's check no longer finds it alive.
    check = dep.run(str(dep.bin / "airflow"), "jobs", "check", "--job-type", "TriggererJob")
    assert check.returncode != 0


def test_refuses_to_start_in_one_line(deployment: Deployment) -> None:
    dep = deployment
    version = "SELECT version_num FROM alembic_version"
    was = asyncio.run(fetch(dep.pg_url, version))[0]["version_num"]
    # 3.2.0's head: a database Airflow 3.3 has not migrated yet.
    set_to = "UPDATE alembic_version SET version_num = $1"
    asyncio.run(fetch(dep.pg_url, set_to, "1d6611b6ab7c"))
    try:
        done = dep.run(str(dep.bin / "slotless"), "airflow-triggerer", timeout=120)
    finally:
        asyncio.run(fetch(dep.pg_url, set_to, was))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[-1].startswith("slotless: error: Airflow's metadata database at ")
    assert "1d6611b6ab7c" in lines[-1] and "airflow db migrate" in lines[-1]

    # --queues where Airflow writes no queues: refused as `airflow triggerer` refuses it.
    done = dep.run(str(dep.bin / "slotless"), "airflow-triggerer", "--queues", "q1", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "slotless: error: --queues may only be used when Airflow's [triggerer] queues_enabled "
        "is True (AIRFLOW__TRIGGERER__QUEUES_ENABLED=True), as for `airflow triggerer --queues`"
    ]

    # A select limit no statement can bind: every cycle would fail, nothing would be taken.
    done = subprocess.run(
        [str(dep.bin / "slotless"), "airflow-triggerer"],
        env={**dep.env, "AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP": "100000"},
        cwd=dep.tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "max_trigger_to_select_per_loop is 100000" in line and "1 to 65535" in line, line


def test_rollback_to_airflows_triggerer_loses_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Stop slotless airflow-triggerer while it holds a wait, start `airflow triggerer`: the
    wait is taken over and its task instance resumes when its file lands. Both serve the
    trigger queue the row is in (`--queues`, with Airflow's queues enabled)."""
    dep = deployment
    env = {**dep.env, "AIRFLOW__TRIGGERER__QUEUES_ENABLED": "True"}
    data = str(dep.inbox / "rollback.csv")
    task = {
        "task_id": "file0",
        "classpath": f"{STD}.file.FileTrigger",
        "args": {"filepath": data, "poke_interval": 0.5},
        "queue": "q1",
    }
    dep.helper("defer", {"dag_id": "waits", "run_id": "r2", "tasks": [task]})
    port = free_port()
    log = tmp_path / "slotless.log"
    args = ["--metrics-port", str(port), "--interval", "0.5", "--queues", "q1"]
    ours = dep.start_triggerer(log, *args, env=env)
    try:
        wait_until(
            lambda: slotless_metrics(port).get("slotless_airflow_triggers") == 1,
            timeout=60,
            interval=0.2,
            what="slotless airflow-triggerer to hold the wait",
        )
    finally:
        code = stop_process(ours)
    assert code == 0, log.read_text()[-3000:]
    assert dep.states("r2")["file0"]["state"] == "deferred"

    with open(tmp_path / "airflow.log", "w") as out:
        theirs = subprocess.Popen(
            [str(dep.bin / "airflow"), "triggerer", "--skip-serve-logs", "--queues", "q1"],
            env=env,
            cwd=dep.tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        Path(data).write_text("x\n")
        wait_until(
            lambda: dep.left_deferred("r2", ["file0"]),
            timeout=90,
            interval=0.5,
            what="Airflow's triggerer to resume the task instance",
        )
    finally:
        stop_process(theirs, timeout=30)
    state = dep.states("r2")["file0"]
    assert state["state"] == "scheduled"
    assert state["next_method"] == "execute_complete"
    assert state["next_kwargs"] == {"asked": "file0", "event": True}


# -- many instances ------------------------------------------------------------------
#
# Two `slotless airflow-triggerer` processes (or one beside `airflow triggerer`) on the
# same rows. Every change to a waiting task instance is recorded by a PostgreSQL trigger
# on Airflow's task_instance table (the test's, dropped after it), so a second
# submit_event racing the first would show as a second update of the same task instance.

_AUDIT = """
CREATE TABLE IF NOT EXISTS slotless_ti_moves (
    task_id text, run_id text, old_state text, new_state text, next_kwargs text
);
CREATE OR REPLACE FUNCTION slotless_ti_moved() RETURNS trigger AS $$
BEGIN
    IF NEW.run_id LIKE 'many%' THEN
        INSERT INTO slotless_ti_moves VALUES (
            NEW.task_id, NEW.run_id, OLD.state, NEW.state, NEW.next_kwargs::text
        );
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS slotless_ti_moved ON task_instance;
CREATE TRIGGER slotless_ti_moved AFTER UPDATE ON task_instance
    FOR EACH ROW EXECUTE FUNCTION slotless_ti_moved();
"""

_HOLDERS = """
SELECT ti.task_id, t.triggerer_id, j.executor_class
FROM task_instance ti JOIN trigger t ON t.id = ti.trigger_id
LEFT JOIN job j ON j.id = t.triggerer_id
WHERE ti.dag_id = 'waits' AND ti.run_id = $1
"""


def _holders(dep: Deployment, run_id: str) -> dict[str, tuple[int | None, str | None]]:
    """Each waiting task instance's triggerer (Job id, its executor_class)."""
    rows = asyncio.run(fetch(dep.pg_url, _HOLDERS, run_id))
    return {r["task_id"]: (r["triggerer_id"], r["executor_class"]) for r in rows}


def _moved_once(dep: Deployment, run_id: str, names: list[str]) -> None:
    """Each task instance was updated exactly once since deferral: DEFERRED to SCHEDULED
    with the file's event, and never again (a second submit_event would be a second row)."""
    query = "SELECT * FROM slotless_ti_moves WHERE run_id = $1"
    # Not the deferral itself (the test's helper sets each task instance DEFERRED).
    moves = [m for m in asyncio.run(fetch(dep.pg_url, query, run_id)) if m["old_state"]]
    by_task: dict[str, list[Any]] = {}
    for m in moves:
        by_task.setdefault(m["task_id"], []).append(m)
    assert sorted(by_task) == sorted(names), moves
    for name, ms in by_task.items():
        assert len(ms) == 1, (name, ms)
        assert (ms[0]["old_state"], ms[0]["new_state"]) == ("deferred", "scheduled"), ms
    states = dep.states(run_id)
    for name in names:
        assert states[name]["next_method"] == "execute_complete", states[name]
        assert states[name]["next_kwargs"] == {"asked": name, "event": True}, states[name]


def _defer_files(dep: Deployment, run_id: str, path: str, names: list[str]) -> None:
    tasks = [
        {
            "task_id": name,
            "classpath": f"{STD}.file.FileTrigger",
            "args": {"filepath": path, "poke_interval": 0.5},
        }
        for name in names
    ]
    dep.helper("defer", {"dag_id": "waits", "run_id": run_id, "tasks": tasks})


@pytest.fixture
def audited(deployment: Deployment) -> Iterator[Deployment]:
    asyncio.run(_fetch_script(deployment.pg_url, _AUDIT))
    try:
        yield deployment
    finally:
        asyncio.run(
            _fetch_script(
                deployment.pg_url,
                "DROP TRIGGER IF EXISTS slotless_ti_moved ON task_instance;"
                "DROP FUNCTION IF EXISTS slotless_ti_moved();"
                "DROP TABLE IF EXISTS slotless_ti_moves;",
            )
        )


async def _fetch_script(url: str, script: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(script)
    finally:
        await conn.close()


def _job_id(log: Path) -> int:
    """The TriggererJob id an instance said it started as."""
    for line in log.read_text().splitlines():
        if "started as TriggererJob " in line:
            return int(line.rsplit(" ", 1)[-1])
    raise AssertionError(f"no TriggererJob in {log}:\n{log.read_text()[-2000:]}")


WAITERS = [*FILES, "flag"]  # six task instances of the "waits" DAG


def test_two_instances_check_equal_waits_once_and_take_over_a_killed_one(
    audited: Deployment, tmp_path: Path
) -> None:
    """Six task instances on one FileTrigger path, three assigned by Airflow to each of two
    slotless instances: one instance checks the path for all six (one check per interval
    in total). SIGKILLed, the other checks it within 3 s, long before Airflow's health
    threshold (30 s) hands the killed instance's rows on. That one killed too, a new
    instance checks both dead ones' rows at once. The file then resumes each task instance
    exactly once. The path is polled (inotify off, as on a network filesystem), so each
    instance's checks are seen at the interval."""
    dep = audited
    polled = {**dep.env, POLL_FSTYPES_ENV: "*"}
    data = str(dep.inbox / "many.csv")
    _defer_files(dep, "many1", data, WAITERS)
    ports = [free_port(), free_port()]
    procs: list[subprocess.Popen[str]] = []
    try:
        # The first takes three rows (Airflow's assignment takes task instances' rows
        # before the asset watcher's), the second the rest.
        procs.append(
            dep.start_triggerer(
                tmp_path / "a.log",
                *("--metrics-port", str(ports[0]), "--interval", "0.5", "--capacity", "3"),
                env=polled,
            )
        )
        wait_until(
            lambda: slotless_metrics(ports[0]).get("slotless_airflow_assigned") == 3,
            timeout=60,
            interval=0.2,
            what="the first instance to take three rows",
        )
        procs.append(
            dep.start_triggerer(
                tmp_path / "b.log",
                *("--metrics-port", str(ports[1]), "--interval", "0.5"),
                env=polled,
            )
        )
        wait_until(
            lambda: all(slotless_metrics(p).get("slotless_airflow_instances") == 2 for p in ports),
            timeout=60,
            interval=0.2,
            what="both instances to see each other",
        )
        holders = _holders(dep, "many1")
        assert len({job for job, _ in holders.values()}) == 2, holders  # spread over both
        assert all(mark == "slotless airflow-triggerer" for _, mark in holders.values())

        def owner() -> tuple[int] | None:
            """The one instance checking the path (for all six rows); None until settled."""
            ms = [slotless_metrics(p) for p in ports]
            files = [m.get('slotless_airflow_checks{kind="file"}') for m in ms]
            if sorted(files) != [0, 1]:  # type: ignore[type-var]
                return None
            which = files.index(1)
            return (which,) if ms[which].get("slotless_airflow_triggers", 0) >= 6 else None

        (checker,) = wait_until(owner, timeout=30, what="one instance to check the path")
        other = 1 - checker
        killed_job = _job_id(tmp_path / ("a.log", "b.log")[checker])
        key = 'slotless_airflow_native_checks_total{kind="file"}'
        before = [slotless_metrics(p)[key] for p in ports]
        began = time.monotonic()
        wait_until(
            lambda: slotless_metrics(ports[checker])[key] >= before[checker] + 4,
            timeout=30,
            interval=0.05,
            what="four more file checks",
        )
        assert time.monotonic() - began >= 1.2  # one check per 0.5 s interval, not six
        assert slotless_metrics(ports[other])[key] == before[other]  # the other checks nothing

        # SIGKILL the checking instance: the other checks the path within 3 s.
        seen = slotless_metrics(ports[other])[key]
        procs[checker].kill()
        procs[checker].wait(timeout=10)
        killed = time.monotonic()
        wait_until(
            lambda: slotless_metrics(ports[other])[key] > seen,
            timeout=10,
            interval=0.05,
            what="the survivor to check the killed instance's path",
        )
        took = time.monotonic() - killed
        print(f"a SIGKILLed instance's condition checked again after {took:.2f} s")
        assert took < 3.0, f"took over in {took:.2f} s"
        assert slotless_metrics(ports[other])["slotless_airflow_triggers"] >= 6
        # Airflow still counts the killed instance's rows as assigned to it (its threshold
        # is 30 s): they are checked where they stand.
        assert killed_job in {job for job, _ in _holders(dep, "many1").values()}

        # The survivor killed too, and a new instance started: it checks both dead
        # instances' rows at once, where Airflow still has them, without waiting out
        # Airflow's threshold.
        procs[other].kill()
        procs[other].wait(timeout=10)
        port = free_port()
        procs.append(
            dep.start_triggerer(
                tmp_path / "c.log", "--metrics-port", str(port), "--interval", "0.5", env=polled
            )
        )
        wait_until(
            lambda: slotless_metrics(port).get(key, 0) > 0,
            timeout=60,
            interval=0.1,
            what="a new instance to check the dead instances' path",
        )
        assert slotless_metrics(port)["slotless_airflow_triggers"] >= 6
        new_job = _job_id(tmp_path / "c.log")
        assert new_job not in {job for job, _ in _holders(dep, "many1").values()}

        Path(data).write_text("x\n")
        wait_until(
            lambda: dep.left_deferred("many1", WAITERS),
            timeout=30,
            interval=0.2,
            what="the six task instances to resume",
        )
        _moved_once(dep, "many1", WAITERS)
        assert procs[-1].poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                stop_process(p)


def test_a_mixed_deployment_neither_loses_nor_double_fires(
    audited: Deployment, tmp_path: Path
) -> None:
    """`airflow triggerer` and `slotless airflow-triggerer` at once (a migration under way):
    Airflow's assignment gives each some of six rows waiting on one file; each checks only
    the rows Airflow gave it, and every task instance resumes exactly once."""
    dep = audited
    data = str(dep.inbox / "mixed.csv")
    _defer_files(dep, "many2", data, WAITERS)
    env = {**dep.env, "AIRFLOW__TRIGGERER__CAPACITY": "3"}
    with open(tmp_path / "airflow.log", "w") as out:
        theirs = subprocess.Popen(
            [str(dep.bin / "airflow"), "triggerer", "--skip-serve-logs"],
            env=env,
            cwd=dep.tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    port = free_port()
    ours: subprocess.Popen[str] | None = None
    try:
        wait_until(
            lambda: sum(job is not None for job, _ in _holders(dep, "many2").values()) == 3,
            timeout=90,
            interval=0.5,
            what="Airflow's triggerer to take three rows",
        )
        ours = dep.start_triggerer(
            tmp_path / "slotless.log", "--metrics-port", str(port), "--interval", "0.5"
        )
        wait_until(
            lambda: slotless_metrics(port).get('slotless_airflow_waiting{dag_id="waits"}') == 3,
            timeout=60,
            interval=0.2,
            what="slotless to check the other three",
        )
        holders = _holders(dep, "many2")
        marks = sorted(str(mark) for _, mark in holders.values())
        assert marks == ["None"] * 3 + ["slotless airflow-triggerer"] * 3, holders
        assert slotless_metrics(port)['slotless_airflow_checks{kind="file"}'] == 1

        Path(data).write_text("x\n")
        wait_until(
            lambda: dep.left_deferred("many2", WAITERS),
            timeout=60,
            interval=0.2,
            what="the six task instances to resume",
        )
        _moved_once(dep, "many2", WAITERS)
        assert slotless_metrics(port)['slotless_airflow_submitted_total{outcome="event"}'] == 3
        assert ours.poll() is None and theirs.poll() is None
    finally:
        if ours is not None:
            stop_process(ours)
        stop_process(theirs, timeout=30)


def test_an_instance_that_stalls_and_comes_back_fires_nothing_twice(
    audited: Deployment, tmp_path: Path
) -> None:
    """The checking instance stops (SIGSTOP) with its check under way: the other takes its
    condition within 3 s and resumes the task instances when the file lands. The stalled
    one then continues (SIGCONT), finds the same file at once and owns the condition again
    (its rendezvous weight is the higher): what it writes under the trigger rows' lock
    changes nothing, and each task instance was resumed exactly once."""
    dep = audited
    data = str(dep.inbox / "stall.csv")
    names = FILES[:4]
    _defer_files(dep, "many3", data, names)
    ports = [free_port(), free_port()]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [
        dep.start_triggerer(log, "--metrics-port", str(port), "--interval", "0.5")
        for log, port in zip(logs, ports, strict=True)
    ]
    key = 'slotless_airflow_native_checks_total{kind="file"}'
    try:

        def checker() -> tuple[int] | None:
            ms = [slotless_metrics(p) for p in ports]
            if not all(m.get("slotless_airflow_instances") == 2 for m in ms):
                return None
            files = [m.get('slotless_airflow_checks{kind="file"}') for m in ms]
            return (files.index(1),) if sorted(files) == [0, 1] else None  # type: ignore[type-var]

        (stalled,) = wait_until(checker, timeout=90, interval=0.2, what="one checker")
        other = 1 - stalled
        seen = slotless_metrics(ports[other])[key]
        procs[stalled].send_signal(signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            wait_until(
                lambda: slotless_metrics(ports[other])[key] > seen,
                timeout=10,
                interval=0.05,
                what="the other instance to take the stalled one's condition",
            )
            assert time.monotonic() - stopped < 3.0
            Path(data).write_text("x\n")
            wait_until(
                lambda: dep.left_deferred("many3", names),
                timeout=30,
                interval=0.2,
                what="the task instances to resume",
            )
        finally:
            procs[stalled].send_signal(signal.SIGCONT)
        # Back, it beats again, and its check (under way when it stopped) either fires on
        # the file or is dropped once the rows are gone; either way it ends.
        wait_until(
            lambda: slotless_metrics(ports[stalled]).get("slotless_airflow_instances") == 2,
            timeout=30,
            interval=0.2,
            what="the stalled instance to be live again",
        )
        wait_until(
            lambda: (
                slotless_metrics(ports[stalled]).get('slotless_airflow_checks{kind="file"}') == 0
            ),
            timeout=30,
            interval=0.2,
            what="the stalled instance's check to end",
        )
        cycles = slotless_metrics(ports[stalled])["slotless_airflow_cycles_total"]
        wait_until(
            lambda: slotless_metrics(ports[stalled])["slotless_airflow_cycles_total"] >= cycles + 2,
            timeout=30,
            interval=0.2,
            what="two more cycles (what it found is written or dropped by then)",
        )
        _moved_once(dep, "many3", names)
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            stop_process(p)


def test_status_and_metrics_name_airflows_dags_and_the_task_log_shows_the_trigger(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Three task instances on one FileTrigger path: /metrics counts them by DAG and class;
    `slotless status --airflow` lists them under their one check (its task instances, its
    interval, its last check, the TriggererJob checking it), as text and JSON; once the
    file lands, each task instance's log, read through Airflow's own TaskLogReader (what
    the UI shows), has the trigger's lines; an adapted trigger's own line is in its
    task's log too."""
    dep = deployment
    data = dep.inbox / "obs.csv"
    names = FILES[:3]
    tasks = [
        {
            "task_id": name,
            "classpath": f"{STD}.file.FileTrigger",
            "args": {"filepath": str(data), "poke_interval": 0.5},
            "try_number": 1,
        }
        for name in names
    ]
    # An adapted class, whose own log line (its self.log) reaches the task's log too.
    flag = dep.inbox / "obsflag"
    tasks.append(
        {
            "task_id": "flag",
            "classpath": f"{HERE}.FlagTrigger",
            "args": {"path": str(flag)},
            "try_number": 1,
        }
    )
    dep.helper("defer", {"dag_id": "waits", "run_id": "obs1", "tasks": tasks})
    port = free_port()
    log = tmp_path / "triggerer.log"
    proc = dep.start_triggerer(log, "--metrics-port", str(port), "--interval", "0.5")
    url = f"http://127.0.0.1:{port}"
    file_class = f"{STD}.file.FileTrigger"

    def ours() -> dict[str, Any] | None:
        done = dep.run(str(dep.bin / "slotless"), "status", "--airflow", "--url", url, "--json")
        if done.returncode != 0:
            return None
        [instance] = json.loads(done.stdout)["instances"]
        for check in instance["checks"]:
            if "obs.csv" in check["check"] and check["last_result"] is not None:
                return {"instance": instance, "check": check}
        return None

    try:
        wait_until(lambda: ours() is not None, timeout=90, interval=0.5, what="the check in status")
        job = _job_id(log)
        found = ours()
        assert found is not None
        check = found["check"]
        assert found["instance"]["job_id"] == job
        assert check["classpath"] == file_class and check["kind"] == "file"
        assert check["waiting"] == 3 and check["dags"] == {"waits": 3}
        assert check["checked_by"] == job and check["interval"] == 0.5
        assert check["last_result"] == "no match yet" and check["since"] is not None
        assert sorted(t["task_id"] for t in check["tasks"]) == names
        assert {(t["run_id"], t["map_index"]) for t in check["tasks"]} == {("obs1", -1)}

        text = dep.run(str(dep.bin / "slotless"), "status", "--airflow", "--url", url)
        assert text.returncode == 0, text.stderr
        out = " ".join(text.stdout.split())
        assert "obs.csv" in out and f"TriggererJob {job}" in out, text.stdout
        for name in names:
            assert f"waits.{name} obs1 -1" in out, text.stdout

        m = slotless_metrics(port)
        key = f'slotless_airflow_waiting_by_class{{classpath="{file_class}",dag_id="waits"}}'
        assert m[key] >= 3, m
        assert m[f'slotless_airflow_checks_by_class{{classpath="{file_class}"}}'] >= 1, m
        assert m['slotless_airflow_oldest_wait_seconds{dag_id="waits"}'] >= 0, m

        data.write_text("x\n")
        flag.write_text("go")
        wait_until(
            lambda: dep.left_deferred("obs1", [*names, "flag"]),
            timeout=60,
            interval=0.2,
            what="the four task instances to resume",
        )
        wait_until(
            lambda: slotless_metrics(port).get("slotless_airflow_task_log_lines_total", 0) >= 9,
            timeout=10,
            interval=0.2,
            what="the trigger log lines written",
        )
        trigger_log = (
            dep.tmp / "home" / "logs" / "dag_id=waits" / "run_id=obs1" / "task_id=file0"
        ) / f"attempt=1.log.trigger.{job}.log"
        assert trigger_log.exists(), sorted(str(p) for p in (dep.tmp / "home").rglob("*obs1*"))
        events = dep.helper(
            "log", {"dag_id": "waits", "run_id": "obs1", "task_id": "file0", "try_number": 1}
        )["events"]
        said = "\n".join(events)
        assert f"TriggererJob {job}) checks this task's trigger" in said, said
        assert "FileTrigger" in said and "fired: event True" in said, said
        flagged = dep.helper(
            "log", {"dag_id": "waits", "run_id": "obs1", "task_id": "flag", "try_number": 1}
        )["events"]
        said = "\n".join(flagged)
        assert f"waiting for the flag {flag}" in said, said
        assert "FlagTrigger" in said and "fired: event" in said, said
        assert proc.poll() is None
    finally:
        stop_process(proc)
