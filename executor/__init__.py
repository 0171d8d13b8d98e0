"""slotless executor: DAGs, the task state machine, the store and the sync workers."""

from .assets import Asset
from .context import TaskContext
from .dag import DAG, DagError, TaskGroup, TaskSpec
from .rules import TriggerRule
from .states import State

__all__ = [
    "DAG",
    "Asset",
    "DagError",
    "State",
    "TaskContext",
    "TaskGroup",
    "TaskSpec",
    "TriggerRule",
]
