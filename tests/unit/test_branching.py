"""Conditional routing end to end: a branch task chooses which children run; the others and
everything below them that can no longer run end SKIPPED; joins run after whichever branch
ran; a bad choice fails the branch with a message naming it. And examples/raster.py, the
tiled-raster workflow of seed 003, through the CLI."""

from __future__ import annotations

import json
import threading
from datetime import date
from pathlib import Path

import pytest
from support.helpers import REPO, cli, cli_env, events, run_to_end, sql, task_states

from executor import DAG, DagError
from executor.store import Store

DAY = date(2026, 4, 25)


def transition_messages(db_path, run_id: str, task_id: str) -> list[str]:
    return [e["message"] for e in events(db_path, run_id, task_id) if e["kind"] == "transition"]


def routed_dag(choice, ran: list[str]) -> DAG:
    """validate -> route (branch) -> heavy -> heavy_2 -> heavy_3 ----> join_*
                                  -> light ---------------------->
    with a cleanup (all_done) under heavy and a strict child of both sides."""
    dag = DAG("routed")
    lock = threading.Lock()

    def record(ctx) -> str:
        with lock:
            ran.append(ctx.task_id)
        return ctx.task_id

    dag.task(record, task_id="validate")

    @dag.task(parents=["validate"], branch=True)
    def route(ctx):
        ran.append("route")
        return choice

    dag.task(record, task_id="heavy", parents=[route])
    dag.task(record, task_id="heavy_2", parents=["heavy"])
    dag.task(record, task_id="heavy_3", parents=["heavy_2"])
    dag.task(record, task_id="light", parents=[route])
    # below the skipped side but runnable: all_done does not care how its parent ended
    dag.task(record, task_id="heavy_cleanup", parents=["heavy"], trigger_rule="all_done")
    # needs both sides: can no longer run once one side is skipped
    dag.task(record, task_id="both", parents=["heavy_3", "light"])
    dag.task(
        record,
        task_id="join_nfmos",
        parents=["heavy_3", "light"],
        trigger_rule="none_failed_min_one_success",
    )
    dag.task(record, task_id="join_any", parents=["heavy_3", "light"], trigger_rule="any_of")
    dag.task(record, task_id="after_join", parents=["join_nfmos", "join_any"])
    return dag


@pytest.mark.parametrize(
    ("choice", "taken", "skipped"),
    [
        ("light", ["light"], ["heavy", "heavy_2", "heavy_3"]),
        ("heavy", ["heavy", "heavy_2", "heavy_3"], ["light"]),
        (["light"], ["light"], ["heavy", "heavy_2", "heavy_3"]),
    ],
)
async def test_a_branch_follows_its_choice_and_skips_what_can_no_longer_run(
    store: Store, db_path, choice, taken: list[str], skipped: list[str]
) -> None:
    ran: list[str] = []
    dag = routed_dag(choice, ran)
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag}, slots=4)
    states = task_states(db_path, run_id)
    for t in taken:
        assert states[t] == "SUCCESS", t
    for t in skipped:
        assert states[t] == "SKIPPED", t
        assert t not in ran
    assert states["both"] == "SKIPPED" and "both" not in ran
    assert states["join_nfmos"] == states["join_any"] == states["after_join"] == "SUCCESS"
    assert states["heavy_cleanup"] == "SUCCESS"  # all_done: its parent ended (skipped)
    assert info["state"] == "SUCCESS"
    # the branch's direct children not chosen say why; the rest say which rule decided
    direct = next(t for t in ("heavy", "light") if t in skipped)
    assert transition_messages(db_path, run_id, direct) == ["branch not taken"]
    if "heavy_2" in skipped:
        assert transition_messages(db_path, run_id, "heavy_2") == [
            "trigger rule all_success: of 1 parents, 1 skipped"
        ]
    # the branch's output is its choice
    (route,) = sql(
        db_path, "SELECT output FROM task WHERE run_id = ? AND task_id = 'route'", run_id
    )
    assert json.loads(route["output"]) == choice


async def test_a_branch_may_choose_several_children(store: Store, db_path) -> None:
    dag = DAG("several")

    @dag.task(branch=True)
    def pick(ctx):
        return ["a", "c"]

    for t in "abc":
        dag.task(lambda ctx: ctx.task_id, task_id=t, parents=[pick])

    @dag.task(parents=["a", "b", "c"], trigger_rule="none_failed_min_one_success")
    def join(ctx):
        return sorted(k for k, v in ctx.inputs.items() if v is not None)

    run_id = await store.runs.create_run(dag, DAY)
    await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert task_states(db_path, run_id) == {
        "pick": "SUCCESS",
        "a": "SUCCESS",
        "b": "SKIPPED",
        "c": "SUCCESS",
        "join": "SUCCESS",
    }
    (row,) = sql(db_path, "SELECT output FROM task WHERE run_id = ? AND task_id = 'join'", run_id)
    assert json.loads(row["output"]) == ["a", "c"]


async def test_a_branch_choosing_nothing_skips_every_child(store: Store, db_path) -> None:
    dag = DAG("none_chosen")

    @dag.task(branch=True)
    def pick(ctx):
        return []

    dag.task(lambda ctx: 1, task_id="a", parents=[pick])
    dag.task(lambda ctx: 1, task_id="b", parents=[pick])
    dag.task(lambda ctx: 1, task_id="join", parents=["a", "b"], trigger_rule="any_of")
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert task_states(db_path, run_id) == {
        "pick": "SUCCESS",
        "a": "SKIPPED",
        "b": "SKIPPED",
        "join": "SKIPPED",  # any_of over parents that were all skipped
    }
    assert info["state"] == "SUCCESS"


async def test_joins_after_a_chosen_branch_that_failed(store: Store, db_path) -> None:
    dag = DAG("chosen_fails")

    @dag.task(branch=True)
    def pick(ctx):
        return "bad"

    @dag.task(parents=[pick])
    def bad(ctx):
        raise RuntimeError("the branch taken failed")

    dag.task(lambda ctx: 1, task_id="other", parents=[pick])
    for rule in ("none_failed_min_one_success", "any_of", "all_done", "one_failed"):
        dag.task(lambda ctx: 1, task_id=f"join_{rule}", parents=["bad", "other"], trigger_rule=rule)
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag})
    states = task_states(db_path, run_id)
    assert (states["bad"], states["other"]) == ("FAILED", "SKIPPED")
    assert states["join_none_failed_min_one_success"] == "UPSTREAM_FAILED"
    assert states["join_any_of"] == "UPSTREAM_FAILED"
    assert states["join_all_done"] == "SUCCESS"
    assert states["join_one_failed"] == "SUCCESS"
    assert info["state"] == "FAILED"


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (
            "nope",
            "branch pick chose nope, which is not one of its children (left, right, on_failure)",
        ),
        (["left", "ghost"], "branch pick chose ghost, which is not one of its children"),
        # a task of the DAG, but not a child of the branch
        ("elsewhere", "branch pick chose elsewhere, which is not one of its children"),
        (7, "branch pick must return a child id or a list of them, not 7"),
        ({"left": True}, "branch pick must return a child id or a list of them"),
    ],
)
async def test_a_bad_choice_fails_the_branch_naming_it_and_the_run_goes_on(
    store: Store, db_path, returned, expected: str
) -> None:
    dag = DAG("bad_choice")

    @dag.task(branch=True)
    def pick(ctx):
        return returned

    dag.task(lambda ctx: 1, task_id="left", parents=[pick])
    dag.task(lambda ctx: 1, task_id="right", parents=[pick])
    dag.task(lambda ctx: 1, task_id="elsewhere")
    dag.task(lambda ctx: 1, task_id="on_failure", parents=[pick], trigger_rule="one_failed")
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert task_states(db_path, run_id) == {
        "pick": "FAILED",
        "left": "UPSTREAM_FAILED",
        "right": "UPSTREAM_FAILED",
        "elsewhere": "SUCCESS",
        "on_failure": "SUCCESS",
    }
    assert info["state"] == "FAILED"
    (failed,) = [e for e in events(db_path, run_id, "pick") if e["to_state"] == "FAILED"]
    assert expected in failed["message"]


async def test_a_bad_choice_is_retried_like_any_failure(store: Store, db_path) -> None:
    """A branch that chooses from data may choose well on its next attempt."""
    dag = DAG("retry_choice")

    @dag.task(branch=True, retries=1, retry_delay=0)
    def pick(ctx):
        return "nope" if ctx.attempt == 1 else "left"

    dag.task(lambda ctx: 1, task_id="left", parents=[pick])
    dag.task(lambda ctx: 1, task_id="right", parents=[pick])
    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert task_states(db_path, run_id) == {
        "pick": "SUCCESS",
        "left": "SUCCESS",
        "right": "SKIPPED",
    }
    assert info["state"] == "SUCCESS"


async def test_a_branch_into_a_fan_out(store: Store, db_path) -> None:
    """The chosen side expands; the skipped side's mapped task never expands."""
    dag = DAG("branch_map")

    @dag.task(branch=True)
    def route(ctx):
        return "split"

    @dag.task(parents=[route])
    def split(ctx):
        return [1, 2, 3]

    @dag.task(parents=[route])
    def other_split(ctx):
        return [4, 5]

    @dag.task(expand=split)
    def double(ctx):
        return 2 * ctx.item

    @dag.task(expand=other_split)
    def never(ctx):
        raise AssertionError("skipped side")

    @dag.task(parents=[double, never], trigger_rule="none_failed_min_one_success")
    def merge(ctx):
        return ctx.inputs

    run_id = await store.runs.create_run(dag, DAY)
    info = await run_to_end(store, run_id, dags={dag.dag_id: dag})
    assert info["state"] == "SUCCESS"
    states = task_states(db_path, run_id)
    assert (states["double"], states["never"], states["merge"]) == ("SUCCESS", "SKIPPED", "SUCCESS")
    (row,) = sql(db_path, "SELECT output FROM task WHERE run_id = ? AND task_id = 'merge'", run_id)
    assert json.loads(row["output"]) == {"double": [2, 4, 6], "never": []}


def test_a_mapped_task_cannot_be_a_branch() -> None:
    """Each instance would skip the children it did not choose, even those another chose."""
    dag = DAG("mapped_branch")
    dag.task(lambda ctx: ["a", "b"], task_id="src")
    with pytest.raises(DagError, match="task 'pick': a mapped task cannot be a branch"):
        dag.task(lambda ctx: ctx.item, task_id="pick", expand="src", branch=True)


# ------------------------------------------------------------------ examples/raster.py


@pytest.mark.parametrize(
    ("size", "taken", "not_taken"),
    [
        (None, "generate_tiles", "process_direct"),  # the default raster is large: tiles
        ("48", "process_direct", "generate_tiles"),
    ],
)
def test_the_raster_example_runs_end_to_end_through_the_cli(
    tmp_path: Path, size: str | None, taken: str, not_taken: str
) -> None:
    env = cli_env(SLOTLESS_DEMO_DIR=str(tmp_path / "data"))
    if size:
        env["RASTER_SIZE"] = size
    db = tmp_path / "raster.db"
    proc = cli(
        "run",
        str(REPO / "examples" / "raster.py"),
        "--db",
        f"sqlite:///{db}",
        "--logical-date",
        "2026-04-25",
        "--json",
        env=env,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["dag_id"] == "raster"
    assert result["state"] == "SUCCESS"
    tasks = result["tasks"]
    assert tasks["validate"] == tasks["route_by_size"] == tasks["finalize"] == "SUCCESS"
    assert tasks[taken] == "SUCCESS"
    assert tasks[not_taken] == "SKIPPED"
    tiled = taken == "generate_tiles"
    for t in ("process_tile", "merge_tiles"):
        assert tasks[t] == ("SUCCESS" if tiled else "SKIPPED")

    item = json.loads(
        sql(
            db,
            "SELECT output FROM task WHERE run_id = ? AND task_id = 'finalize'",
            result["run_id"],
        )[0]["output"]
    )
    assert item["properties"]["route"] == ("tiled" if tiled else "direct")
    cog = Path(item["assets"]["data"]["href"])
    assert cog.is_file()
    header = cog.read_bytes()[:20].split(b"\n")
    assert header[0] == b"P5"
    if tiled:
        (row,) = sql(
            db,
            "SELECT map_total FROM task WHERE run_id = ? AND task_id = 'process_tile'"
            " AND map_index = -1",
            result["run_id"],
        )
        assert row["map_total"] == item["properties"]["tiles"] > 1
