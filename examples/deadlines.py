"""Deadlines and failure policies: a settlement run that must end by 06:00, may take 3 h,
expects its bank file by 05:30, and stops everything at the first failed merchant.

    SLOTLESS_ALERTS=mailto://localhost:2525?to=ops@example.com&mode=insecure \
        slotless up examples/deadlines.py

The deadline, the timeout and the sensor's expected_by are time triggers the triggerer
holds (no loop of its own); "late" and "deadline_missed" go to the DAG's notify= URL,
once each. With on_task_failure="pause" instead, the run would wait at the first failure
for `slotless resume RUN`.
"""

from __future__ import annotations

import os
import tempfile

from executor import DAG
from triggers.files import FileTrigger

ALERTS = os.environ.get("SLOTLESS_ALERTS", "json://127.0.0.1:8080/alerts")
INBOX = os.environ.get("SETTLEMENT_INBOX", os.path.join(tempfile.gettempdir(), "npci"))

dag = DAG(
    "deadlines",
    timezone="Asia/Kolkata",
    deadline="06:00",  # a run not ended by 06:00 on its day: "deadline_missed", once
    dagrun_timeout="3h",  # still going 3 h after it started: cancelled, saying why
    on_task_failure="fail_fast",  # the first failed merchant stops the rest
    notify=ALERTS,
)

wait = dag.sensor(
    "wait_for_npci_file",
    FileTrigger(path=f"{INBOX}/{{{{ ds }}}}.csv", poke_interval=5),
    timeout="14h",
    expected_by="05:30",  # not there by 05:30: "late", once; it keeps waiting
)


@dag.task(parents=[wait])
def merchants(ctx):
    return [f"m{i}" for i in range(10)]


@dag.task(expand=merchants)
def settle(ctx):
    return {"merchant": ctx.item, "amount": 100}


@dag.task(parents=[settle])
def total(ctx):
    return sum(s["amount"] for s in ctx.inputs["settle"])
