"""The daily settlement pipeline (seed 000): wait for the bank's file, settle every
merchant in parallel, total the day.

The wait is a deferrable sensor: it holds no worker slot while the file is missing. So
that the demo runs anywhere, a stand-in for the bank (`bank_drop`) writes the file after
a couple of seconds; in production that task would not exist.
"""

import csv
import os
import random
import time
from pathlib import Path

from executor import DAG
from triggers.files import FileTrigger

INBOX = Path(os.environ.get("SLOTLESS_DEMO_DIR", "demo-data")).resolve() / "settlements"
MERCHANTS = 1247

dag = DAG("settlements", description="NPCI daily settlement file -> per-merchant settlement")


@dag.task
def bank_drop(ctx):
    """Stand-in for the bank: the file lands a little after the pipeline starts."""
    time.sleep(2)
    INBOX.mkdir(parents=True, exist_ok=True)
    rng = random.Random(ctx.ds)
    path = INBOX / f"{ctx.ds}.csv"
    tmp = path.with_suffix(".part")
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["merchant", "amount_paise"])
        for m in range(MERCHANTS):
            writer.writerow([f"M{m:05d}", rng.randint(10_000, 5_000_000)])
    tmp.rename(path)  # atomic: the sensor never sees half a file
    return str(path)


wait_for_file = dag.sensor(
    "wait_for_npci_file",
    FileTrigger(path=f"{INBOX}/{{{{ ds }}}}.csv", poke_interval=1),
    mode="deferrable",
    timeout="14h",  # the file is known to be late; seed 000 uses 14 h for it
)


@dag.task(parents=[wait_for_file])
def list_merchants(ctx):
    path = ctx.inputs["wait_for_npci_file"]["paths"][0]
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    ctx.log(f"{len(rows)} merchants in {path}")
    return [{"merchant": r["merchant"], "amount_paise": int(r["amount_paise"])} for r in rows]


@dag.task(expand=list_merchants, retries=5, retry_delay=0.5)
def settle(ctx):
    row = ctx.item
    fee = row["amount_paise"] * 18 // 10_000  # 0.18 % MDR
    return {"merchant": row["merchant"], "net_paise": row["amount_paise"] - fee, "fee": fee}


@dag.task(parents=[settle], trigger_rule="all_done")
def daily_total(ctx):
    settled = [s for s in ctx.inputs["settle"] if s is not None]
    total = sum(s["net_paise"] for s in settled)
    ctx.log(f"settled {len(settled)} of {MERCHANTS} merchants, net {total / 100:,.2f} INR")
    return {"merchants": len(settled), "net_paise": total}
