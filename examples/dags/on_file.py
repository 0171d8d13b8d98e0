"""A DAG started by a condition: one run per CSV file dropped into demo-data/inbox/.

Drop a file (`mkdir -p demo-data/inbox && echo a,b > demo-data/inbox/x.csv`) while
`slotless up --dags examples/dags` runs: the triggerer sees it (one directory listing
however many DAGs watch the folder), creates a run keyed `file://.../x.csv` once, and the
task reads which file started it from `ctx.start_event`.
"""

from pathlib import Path

from executor import DAG
from triggers.files import FileTrigger

INBOX = Path("demo-data/inbox").resolve()

dag = DAG("on_file", start_when=FileTrigger(path=str(INBOX / "*.csv"), poke_interval=2))


@dag.task
def ingest(ctx):
    path = Path(ctx.start_event["path"])
    rows = path.read_text().splitlines()
    ctx.log(f"{path.name}: {len(rows)} rows")
    return len(rows)
