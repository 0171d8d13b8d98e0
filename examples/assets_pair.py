"""A producer and a consumer joined by an asset (docs/migrating-from-airflow.md).

``orders`` updates ``s3://lake/orders`` when its task succeeds (the event is recorded in
the same transaction as the SUCCESS, with the extra the task attached); ``report`` is
scheduled on that asset, so each update starts one run of it, which sees the event.

    slotless up --dags examples/   # then: slotless trigger orders --dags examples/
    slotless assets send s3://lake/orders --extra '{"rows": 5}'   # an update from outside
"""

from executor import DAG, Asset

orders_table = Asset("s3://lake/orders", name="orders")

orders = DAG("orders")


@orders.task(outlets=[orders_table])
def export(ctx):
    rows = [{"id": 1, "total": 12.5}, {"id": 2, "total": 7.0}]
    ctx.asset_event(orders_table, extra={"rows": len(rows)})
    return len(rows)


report = DAG("report", schedule=[orders_table])


@report.task
def summarize(ctx):
    [event] = ctx.triggering_asset_events["s3://lake/orders"][-1:]
    ctx.log(f"orders updated by {event['source']}: {event['extra']}")
    return event["extra"]["rows"]
