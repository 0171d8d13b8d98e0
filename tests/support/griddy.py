"""A DAG the grid tests (the store's and the page's) both run: six tasks, one of them
mapped, and a ``fail_item`` param naming the item whose instance fails."""

GRIDDY = """
from executor import DAG

dag = DAG("griddy", params={"fail_item": -1})


@dag.task
def extract(ctx):
    return list(range(6))


@dag.task(expand=extract)
def shard(ctx):
    if ctx.item == ctx.params["fail_item"]:
        raise RuntimeError(f"shard {ctx.item} is bad")
    return ctx.item


@dag.task(parents=[shard])
def merge(ctx):
    return 1


@dag.task(parents=[merge])
def load(ctx):
    return 1


@dag.task(parents=[extract])
def audit(ctx):
    return 1


@dag.task(parents=[load, audit], trigger_rule="all_done")
def report(ctx):
    return 1
"""
# Its tasks in topological order, as the grid's rows list them.
TASKS = ["extract", "shard", "merge", "load", "audit", "report"]
