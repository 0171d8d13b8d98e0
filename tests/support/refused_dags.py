"""DAG files that `slotless run` and `slotless trigger` refuse, and so must the catalogue:
one whose tasks form a cycle, one whose deferrable sensor's trigger class is not
allow-listed."""

CYCLE = """
from executor import DAG

dag = DAG("loops_back", schedule="@hourly")
a, b, c = (dag.task(lambda ctx: 1, task_id=t) for t in "abc")
a >> b >> c >> a
"""

UNLISTED_SENSOR = """
from executor import DAG
from triggers.files import FileTrigger


class Unlisted(FileTrigger):
    pass


dag = DAG("waits", schedule="@hourly")
dag.sensor("wait", Unlisted(path="/nowhere"))
"""
