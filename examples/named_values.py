"""Two named values passed downstream, inside a setup/teardown pair (Airflow's XCom keys
and ``as_teardown``): docs/migrating-from-airflow.md, "A task that passes two named
values downstream".

    make_scratch (setup) -> extract -> load -> remove_scratch (teardown of make_scratch)

``extract`` writes the day's rows to a scratch folder, returns the file's path and
publishes two named values beside it, the row count and a checksum; ``load`` reads the
file and checks it against both. ``remove_scratch`` deletes the folder however ``extract``
and ``load`` ended (it is skipped only if the folder was never made), and its own failure
would not fail the run. ``NAMED_VALUES_BREAK=1`` makes ``load`` fail, to see the teardown
clean up after a failure:

    slotless run examples/named_values.py
    NAMED_VALUES_BREAK=1 slotless run examples/named_values.py   # FAILED, folder removed
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

from executor import DAG
from executor.context import TaskContext

DATA = Path(os.environ.get("SLOTLESS_DEMO_DIR", "demo-data")).resolve() / "named_values"

dag = DAG("named_values", description="named values (XCom keys) and a setup/teardown pair")


@dag.task(setup=True)
def make_scratch(ctx: TaskContext) -> str:
    scratch = DATA / "scratch" / ctx.ds
    scratch.mkdir(parents=True, exist_ok=True)
    ctx.push("scratch", str(scratch))
    return str(scratch)


@dag.task(parents=[make_scratch])
def extract(ctx: TaskContext) -> str:
    scratch = Path(ctx.pull("make_scratch", "scratch"))
    rows = [{"merchant": f"m{i:02d}", "amount": 10 * i} for i in range(1, 13)]
    text = json.dumps(rows)
    path = scratch / "rows.json"
    path.write_text(text)
    ctx.push("rows", len(rows))
    ctx.push("checksum", hashlib.sha256(text.encode()).hexdigest())
    return str(path)


@dag.task(parents=[extract])
def load(ctx: TaskContext) -> dict[str, int]:
    text = Path(ctx.pull("extract")).read_text()  # its return value: the file's path
    if hashlib.sha256(text.encode()).hexdigest() != ctx.pull("extract", "checksum"):
        raise ValueError("the rows file changed since extract wrote it")
    rows = json.loads(text)
    if len(rows) != ctx.pull("extract", "rows"):
        raise ValueError(f"{len(rows)} rows, extract wrote {ctx.pull('extract', 'rows')}")
    if os.environ.get("NAMED_VALUES_BREAK"):
        raise RuntimeError("the warehouse refused the load (NAMED_VALUES_BREAK)")
    total = sum(r["amount"] for r in rows)
    out = DATA / f"{ctx.ds}-total.json"
    out.write_text(json.dumps({"rows": len(rows), "total": total}))
    return {"rows": len(rows), "total": total}


@dag.task(parents=[load], teardown_of=[make_scratch])
def remove_scratch(ctx: TaskContext) -> str:
    scratch = ctx.pull("make_scratch", "scratch")
    shutil.rmtree(scratch, ignore_errors=True)
    return f"removed {scratch}"
