"""A sensor templated as in Airflow: each run waits for the file of the day before its
``ds`` (``{{ macros.ds_add(ds, -1) }}``), then a task reads it and writes a report to a
templated path (``templates=`` -> ``ctx.templates``). docs/templates.md lists every name
and macro; docs/migrating-from-airflow.md shows the Airflow DAG beside this one.

So that the demo runs anywhere (``slotless run examples/templated_sensor.py``), a stand-in
for the bank (``bank_drop``) writes yesterday's file a second after the run starts; in
production that task would not exist.
"""

import json
import os
import time
from pathlib import Path

from executor import DAG
from triggers.files import FileTrigger

ROOT = Path(os.environ.get("SLOTLESS_DEMO_DIR", "demo-data")).resolve() / "templated"
# Rendered per run: the run of 2026-11-26 waits for .../landing/2026-11-25/settlement.csv
YESTERDAYS_FILE = f"{ROOT}/landing/{{{{ macros.ds_add(ds, -1) }}}}/settlement.csv"

dag = DAG(
    "templated_sensor",
    description="yesterday's settlement file -> today's report",
    params={"region": "south"},
)


@dag.task(templates={"path": YESTERDAYS_FILE})
def bank_drop(ctx):
    """Stand-in for the bank: yesterday's file lands a little after the run starts."""
    time.sleep(1)
    path = Path(ctx.templates["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text("merchant,amount_paise\nM00001,125000\nM00002,98000\n")
    tmp.rename(path)  # atomic: the sensor never sees half a file
    return str(path)


landed = dag.sensor(
    "wait_for_yesterdays_file",
    FileTrigger(path=YESTERDAYS_FILE, poke_interval=1),
    timeout="14h",
)


@dag.task(
    parents=[landed],
    templates={
        "report": f"{ROOT}/reports/{{{{ params.region }}}}/{{{{ ds_nodash }}}}.json",
        "title": "Settlements of "
        "{{ macros.ds_format(macros.ds_add(ds, -1), '%Y-%m-%d', '%d %b %Y') }}",
    },
)
def report(ctx):
    [path] = ctx.inputs["wait_for_yesterdays_file"]["paths"]
    rows = Path(path).read_text().splitlines()[1:]
    total = sum(int(line.split(",")[1]) for line in rows)
    out = Path(ctx.templates["report"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"title": ctx.templates["title"], "total_paise": total}))
    return {"report": str(out), "title": ctx.templates["title"], "total_paise": total}
