"""A task mapped with expand_kwargs over a list of dicts (docs/migrating-from-airflow.md).

``plan_copies`` returns one dict of keyword arguments per table; ``copy_table`` runs once
per dict, called as ``copy_table(ctx, **fixed, **that_dict)``: ``partial()`` gives the
arguments every instance shares. ``notify`` maps over a literal list, a cross product of
two arguments, with no upstream task at all. ``summary`` reads every instance's output,
in index order.

    slotless run examples/expand_kwargs.py
"""

from executor import DAG

dag = DAG("expand_kwargs", description="expand_kwargs over a list of dicts; partial; expand")


@dag.task
def plan_copies(ctx):
    # Built at run time: one dict per instance, the keys being copy_table's parameters.
    return [
        {"table": "orders", "since": ctx.ds},
        {"table": "customers", "since": "2026-01-01"},
        {"table": "refunds", "since": ctx.ds},
    ]


@dag.task(retries=2, retry_delay="5s")
def copy_table(ctx, table, since, target):
    ctx.log(f"copying {table} since {since} into {target} (instance {ctx.index} of {ctx.total})")
    return {"table": f"{target}.{table}", "rows": len(table) * 100}


copy_table.partial(target="warehouse").expand_kwargs(plan_copies)


@dag.task(parents=[copy_table])
def summary(ctx):
    copied = ctx.inputs["copy_table"]  # every instance's output, in index order
    return {"tables": [c["table"] for c in copied], "rows": sum(c["rows"] for c in copied)}


@dag.task(parents=[summary])
def notify(ctx, channel, team):
    return f"#{channel}: {team}, {ctx.inputs['summary']['rows']} rows copied"


# A cross product over two literal lists: 2 x 2 = 4 instances.
notify.expand(channel=["data", "ops"], team=["eu", "us"])
