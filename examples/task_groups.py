"""A DAG organised in task groups, with a mapped group (docs/migrating-from-airflow.md).

    setup.check_quota -> setup.make_batch
        -> per_file[i]: extract -> checks.row_count, checks.schema -> load   (one per file)
        -> report

Task ids are prefixed by their groups (``per_file.checks.schema``). ``per_file`` is mapped
over ``list_files``' output: each of its tasks runs once per file, ``ctx.item`` being the
file, and instance ``i`` of a task waits only for instance ``i`` of its parents in the
group: ``per_file.load[2]`` may run while ``per_file.extract[0]`` still does. A task sees
the outputs of its parents in the group for its own index in ``ctx.inputs``.

    slotless run examples/task_groups.py
"""

from executor import DAG

dag = DAG("task_groups", description="task groups, nested, and a mapped group")

with dag.group("setup") as setup:

    @dag.task
    def check_quota(ctx):
        return {"free_gb": 120}

    @dag.task(parents=[check_quota])
    def make_batch(ctx):
        return f"batch-{ctx.ds}"


@dag.task
def list_files(ctx):
    return ["orders.csv", "customers.csv", "refunds.csv"]


with dag.group("per_file", expand=list_files) as per_file:

    @dag.task(retries=2, retry_delay="5s")
    def extract(ctx):
        ctx.log(f"extracting {ctx.item} ({ctx.index + 1} of {ctx.total})")
        return {"file": ctx.item, "rows": 10 * len(ctx.item)}

    with dag.group("checks") as checks:

        @dag.task(parents=[extract])
        def row_count(ctx):
            return ctx.inputs["per_file.extract"]["rows"] > 0

        @dag.task(parents=[extract])
        def schema(ctx):
            return ctx.item.endswith(".csv")

    @dag.task(parents=[checks])  # a group in parents: its leaves, here both checks
    def load(ctx):
        extracted = ctx.inputs["per_file.extract"]
        ok = ctx.inputs["per_file.checks.row_count"] and ctx.inputs["per_file.checks.schema"]
        return {"file": ctx.item, "loaded": extracted["rows"] if ok else 0}

    extract >> load  # load reads extract's output too


setup >> per_file  # every leaf of setup before every root of per_file


@dag.task(parents=[per_file])
def report(ctx):
    loads = ctx.inputs["per_file.load"]  # one per file, in index order
    return {"files": len(loads), "rows": sum(x["loaded"] for x in loads)}
