"""Callbacks and notifications: tell someone when a task retries or fails, and when the
run ends. Run it with a webhook receiver of your own, e.g.:

    SLOTLESS_ALERTS=json://127.0.0.1:8080/alerts slotless run examples/alerts.py

(``mailto://``, ``slack://`` and the other apprise URLs work the same way.) Callbacks and
notifications run in worker slots after the change is committed; a failing one is
retried and then logged in the task's log, and never changes the task's outcome.
"""

from __future__ import annotations

import os
import random

from executor import DAG
from executor.notifications import CallbackContext

ALERTS = os.environ.get("SLOTLESS_ALERTS", "json://127.0.0.1:8080/alerts")


def page_on_call(ctx: CallbackContext) -> None:
    # Any Python: open an incident, write a ticket. ctx has the run, task, attempt,
    # the error and the last lines of the task's log.
    print(f"{ctx.dag_id}.{ctx.task_id} failed after attempt {ctx.attempt}: {ctx.error}")
    print("\n".join(ctx.log_tail[-5:]))


dag = DAG(
    "alerts",
    on_failure=page_on_call,  # the default for every task
    notify=ALERTS,  # failures, sensor timeouts, the run's failure, late and missed deadlines
    callback_timeout="20s",
)


@dag.task(retries=2, retry_delay="1s", notify={"on_retry": ALERTS, "on_failure": ALERTS})
def flaky_extract(ctx):
    ctx.log(f"attempt {ctx.attempt}")
    if random.random() < 0.7:
        raise ConnectionError("the source hung up")
    return {"rows": 1200}


@dag.task(parents=[flaky_extract], on_success=lambda ctx: print("loaded", ctx.run_id))
def load(ctx):
    return ctx.inputs["flaky_extract"]["rows"]
