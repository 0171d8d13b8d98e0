"""The smallest DAG: extract, transform, load."""

from executor import DAG

dag = DAG("hello")


@dag.task
def extract(ctx):
    return [1, 2, 3]


@dag.task(parents=[extract])
def transform(ctx):
    return [x * 10 for x in ctx.inputs["extract"]]


@dag.task(parents=[transform])
def load(ctx):
    ctx.log(f"loading {len(ctx.inputs['transform'])} rows")
    return sum(ctx.inputs["transform"])
