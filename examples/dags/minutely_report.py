"""A scheduled DAG: every minute, a report over the minute that just ended.

`slotless up --dags examples/dags` runs it: the triggerer holds the schedule as a wait and
creates one run per minute (run key: the interval's start), the worker runs it.
"""

from datetime import datetime

from executor import DAG

dag = DAG(
    "minutely_report",
    schedule="* * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,  # from the latest minute on, not every minute since 1 January
    max_active_runs=2,
)


@dag.task
def measure(ctx):
    start, end = ctx.data_interval_start, ctx.data_interval_end
    ctx.log(f"measuring [{start:%H:%M}, {end:%H:%M}) UTC")
    return {"from": start.isoformat(), "to": end.isoformat()}


@dag.task(parents=[measure])
def publish(ctx):
    return f"report for {ctx.inputs['measure']['from']}"
