"""Triggers written the Airflow way (Airflow's BaseTrigger, serialize / async run /
TriggerEvent / cleanup), for the tests that run them in the slotless triggerer.

Imported only inside the Airflow test environment (.venv-airflow); the main .venv has no
Airflow. Each is allow-listed by the test through SLOTLESS_ALLOWED_TRIGGERS.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

HERE = "support.airflow_triggers"


class FlagTrigger(BaseTrigger):
    """Fires with the flag file's content once it exists; cleanup() leaves a mark."""

    def __init__(self, path: str, poke_interval: float = 0.2) -> None:
        super().__init__()
        self.path = path
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{HERE}.FlagTrigger", {"path": self.path, "poke_interval": self.poke_interval}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # One line per run() started, so that a test knows which process runs it (a wait
        # held may not have started its run() yet: its class may still be importing).
        with open(self.path + ".runs", "a") as f:
            f.write(f"{os.getpid()}\n")
        # A line of the trigger's own, through Airflow's logger (the task's log shows it).
        self.log.info("waiting for the flag %s", self.path)
        while not os.path.exists(self.path):
            await asyncio.sleep(self.poke_interval)
        yield TriggerEvent({"path": self.path, "content": Path(self.path).read_text()})

    async def cleanup(self) -> None:
        # One line per cleanup, so that the test counts them (the wait ended, or moved).
        with open(self.path + ".cleanups", "a") as f:
            f.write(f"{os.getpid()}\n")


class SilentTrigger(BaseTrigger):
    """Returns without yielding anything: it would never fire."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{HERE}.SilentTrigger", {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        return
        yield  # an async generator all the same


class RaisingTrigger(BaseTrigger):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{HERE}.RaisingTrigger", {"message": self.message}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await asyncio.sleep(0.1)
        raise ValueError(self.message)
        yield


class ErrorTrigger(BaseTrigger):
    """Reports its failure the providers' way (S3KeyTrigger's, when S3 is unreachable):
    an event whose payload's status is "error", with a message."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{HERE}.ErrorTrigger", {"message": self.message}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"status": "error", "message": self.message})


class BlockingTrigger(BaseTrigger):
    """Blocks the event loop (a sync sleep, the classic mistake) until a flag exists."""

    def __init__(self, seconds: float, path: str) -> None:
        super().__init__()
        self.seconds = seconds
        self.path = path

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{HERE}.BlockingTrigger", {"seconds": self.seconds, "path": self.path}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # Again and again until the flag exists: a watchdog starved of CPU on a busy
        # machine may miss one block, not all of them.
        while not os.path.exists(self.path):
            time.sleep(self.seconds)
            await asyncio.sleep(0.5)
        yield TriggerEvent("unblocked")


class RunStateTrigger(BaseTrigger):
    """Asks the Task SDK what DagStateTrigger asks (``get_dr_count``, ``get_dagrun_state``),
    from a class no triggerer recognises: its calls go to the triggerer's supervisor."""

    def __init__(self, dag_id: str, run_id: str) -> None:
        super().__init__()
        self.dag_id = dag_id
        self.run_id = run_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{HERE}.RunStateTrigger", {"dag_id": self.dag_id, "run_id": self.run_id}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        # asgiref comes with Airflow (.venv-airflow), as the providers' triggers use it.
        from asgiref.sync import sync_to_async  # type: ignore[import-not-found]

        count = await sync_to_async(RuntimeTaskInstance.get_dr_count)(
            dag_id=self.dag_id, run_ids=[self.run_id], states=["running"]
        )
        state = await sync_to_async(RuntimeTaskInstance.get_dagrun_state)(
            dag_id=self.dag_id, run_id=self.run_id
        )
        yield TriggerEvent({"count": count, "state": getattr(state, "value", state)})


class ConnTrigger(BaseTrigger):
    """Looks its connection up the Airflow way (BaseHook.get_connection)."""

    def __init__(self, conn_id: str) -> None:
        super().__init__()
        self.conn_id = conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{HERE}.ConnTrigger", {"conn_id": self.conn_id}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(self.conn_id)
        yield TriggerEvent({"host": conn.host, "login": conn.login, "port": conn.port})
