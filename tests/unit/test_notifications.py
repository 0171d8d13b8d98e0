"""Declaring callbacks and notify= URLs: checked when the DAG is declared, resolved per
event (a task's own before the DAG's), and what logs may show of a URL."""

from __future__ import annotations

from typing import Any

import pytest
from support.helpers import cli, write_dag

from executor import DAG
from executor.dag import DagError
from executor.notifications import (
    ALERT_EVENTS,
    HOOK_BITS,
    handlers_for,
    redact,
    run_mask,
    task_mask,
)

HOOK_URL = "json://127.0.0.1:9/hook"


def cb(ctx: Any) -> None:
    return None


def other(ctx: Any) -> None:
    return None


@pytest.mark.parametrize(
    "declare",
    [
        lambda: DAG("d", notify="notaurl://nowhere"),
        lambda: DAG("d", notify=["json://127.0.0.1/x", "notaurl://nowhere"]),
        lambda: DAG("d").task(cb, notify={"on_failure": "notaurl://nowhere"}),
    ],
)
def test_an_invalid_notification_url_is_refused_naming_it(declare: Any) -> None:
    with pytest.raises(DagError, match=r"invalid notification URL 'notaurl://nowhere'"):
        declare()


def test_slack_json_and_mail_urls_are_accepted_and_a_slack_url_without_tokens_is_not() -> None:
    DAG(
        "d",
        notify=[
            "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ/#alerts",
            "slack://xoxb-1234-1234-abc123/#alerts",
            "json://hooks.internal:8080/alerts",
            "mailto://smtp.example.com:587?user=me&pass=pw&to=ops@example.com",
        ],
    )
    with pytest.raises(DagError, match=r"task 'a': invalid notification URL 'slack://T1/B1'"):
        DAG("d").task(cb, task_id="a", notify="slack://T1/B1")


def test_a_callback_must_be_callable_and_notify_keys_events() -> None:
    with pytest.raises(DagError, match=r"task 'a': on_failure must be a callable"):
        DAG("d").task(cb, task_id="a", on_failure="page someone")  # type: ignore[arg-type]
    with pytest.raises(DagError, match=r"DAG 'd': on_run_failure must be a callable"):
        DAG("d", on_run_failure=42)  # type: ignore[arg-type]
    with pytest.raises(DagError, match=r"notify= keys are event names"):
        DAG("d", notify={1: HOOK_URL})  # type: ignore[dict-item]
    with pytest.raises(DagError, match=r"callback_retries must be >= 0"):
        DAG("d", callback_retries=-1)


def test_a_tasks_own_handlers_come_before_the_dags() -> None:
    dag = DAG("d", on_failure=cb, on_retry=cb, notify=HOOK_URL)
    a = dag.task(cb, task_id="a", on_failure=other, notify={"on_success": "json://h/ok"})
    b = dag.task(cb, task_id="b")
    [fn] = handlers_for("on_failure", a.hooks, dag.hooks)[:1]
    assert fn.fn is other
    # a's notify= names only on_success: for on_failure the DAG's URL applies
    assert [h.url for h in handlers_for("on_failure", a.hooks, dag.hooks)] == [None, HOOK_URL]
    assert [h.url for h in handlers_for("on_success", a.hooks, dag.hooks)] == ["json://h/ok"]
    assert [h.fn for h in handlers_for("on_retry", b.hooks, dag.hooks)] == [cb]
    assert handlers_for("on_success", b.hooks, dag.hooks) == []
    # a bare URL is for what someone must be told about, including other features' events
    assert {e for e in ALERT_EVENTS if handlers_for(e, None, dag.hooks)} == ALERT_EVENTS
    assert handlers_for("late", b.hooks, dag.hooks)[0].url == HOOK_URL
    keys = [h.key for h in handlers_for("on_failure", a.hooks, dag.hooks)]
    assert keys[0] == "callback" and keys[1].startswith("notify:") and HOOK_URL not in keys[1]


def test_masks_say_which_transitions_write_a_row() -> None:
    dag = DAG("d", on_run_success=cb)
    a = dag.task(cb, task_id="a", on_retry=cb)
    b = dag.task(cb, task_id="b", notify=HOOK_URL)
    c = dag.task(cb, task_id="c")
    assert task_mask(a.hooks, dag.hooks) == HOOK_BITS["on_retry"]
    assert (
        task_mask(b.hooks, dag.hooks) == HOOK_BITS["on_failure"] | (HOOK_BITS["on_sensor_timeout"])
    )
    assert task_mask(c.hooks, dag.hooks) == 0
    assert run_mask(dag.hooks) == HOOK_BITS["on_run_success"]


def test_logs_never_show_a_urls_credentials() -> None:
    assert redact("mailto://user:secret@smtp.example.com?to=a@b.c") == (
        "mailto://smtp.example.com/..."
    )
    assert redact("slack://T1/B2/C3secret") == "slack://..."
    assert redact("json://127.0.0.1:8080/hook?token=x") == "json://127.0.0.1:8080/..."


def test_slotless_run_refuses_a_bad_url_in_one_line(tmp_path: Any) -> None:
    dag_file = write_dag(
        tmp_path,
        "from executor import DAG\n"
        "dag = DAG('bad', notify='notaurl://nowhere')\n"
        "@dag.task\n"
        "def a(ctx):\n"
        "    return 1\n",
    )
    proc = cli("run", str(dag_file), "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid notification URL 'notaurl://nowhere'" in lines[0]
    assert not (tmp_path / "x.db").exists() or "bad" not in proc.stdout


async def test_the_catalogue_shows_a_file_with_a_bad_url_as_broken_naming_it(
    tmp_path: Any,
) -> None:
    from executor.catalogue import parse_file

    dag_file = write_dag(
        tmp_path,
        "from executor import DAG\n"
        "dag = DAG('bad')\n"
        "@dag.task(notify={'on_failure': 'notaurl://nowhere'})\n"
        "def a(ctx):\n"
        "    return 1\n",
    )
    parsed = await parse_file(str(dag_file))
    assert parsed.error is not None and "invalid notification URL 'notaurl://nowhere'" in (
        parsed.error
    )
    assert "task 'a'" in parsed.error
