"""``ctx.pull``'s reader for one attempt: what the task's ancestors published.

A task pulls from its ancestors only (a parent, or a parent's ancestor): those have
ended when it runs, so what it reads is there and stays so while it runs (only a clear
changes it, and a clear of an ancestor clears this task too, downstream). Airflow lets a
task pull from any task of the run, which races with that task still running.

In a thread slot the read is made when ``pull`` is called, on the worker's loop (the
slot thread waits for it), so a task that pulls nothing costs nothing; a forked child
cannot reach the worker's loop, so in process isolation every ancestor's values are read
before the fork, once per attempt of a task that has parents.
"""

from __future__ import annotations

import asyncio
from functools import cache

from .context import NamedValueError, Published, Reader
from .dag import TaskSpec
from .store.values import Values

# How long a slot thread waits for its pull's read (the worker's loop and its database).
PULL_TIMEOUT = 60.0


def ancestors(spec: TaskSpec) -> set[str]:
    """Every task upstream of ``spec`` in its DAG (walked when needed, not kept: kept for
    every task of a chain of 10,000 it would be 50 million names)."""
    tasks = spec.dag.tasks
    seen: set[str] = set()
    todo = list(spec.parents)
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            found = tasks.get(t)
            todo.extend(found.parents if found is not None else ())
    return seen


async def reader(spec: TaskSpec, run_id: str, values: Values, *, in_process: bool) -> Reader:
    """The reader of an attempt of ``spec`` in run ``run_id`` (see the module)."""
    preloaded: dict[str, Published] = {}
    if in_process and spec.parents:
        preloaded = await values.published(run_id, sorted(ancestors(spec)))
    loop = asyncio.get_running_loop()
    upstream = cache(lambda: ancestors(spec))  # a thread slot's: at its first pull

    def read(task_id: str) -> Published:
        if task_id not in upstream():
            if task_id not in spec.dag.tasks:
                why = f"DAG {spec.dag.dag_id!r} has no task {task_id!r}"
            else:
                why = (f"{task_id} is not upstream of {spec.task_id}: a task pulls from its "
                       "ancestors only, which have ended when it runs")  # fmt: skip
            raise NamedValueError(f"ctx.pull({task_id!r}): {why}")
        if in_process:
            return preloaded[task_id]
        future = asyncio.run_coroutine_threadsafe(values.published(run_id, [task_id]), loop)
        return future.result(timeout=PULL_TIMEOUT)[task_id]

    return read
