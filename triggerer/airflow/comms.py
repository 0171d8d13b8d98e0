"""Answering the Task SDK's calls to Airflow's triggerer supervisor, in this process.

Airflow's triggerer runs the triggers in a subprocess whose Task SDK calls
(``RuntimeTaskInstance.get_dr_count``, ``get_dagrun_state``, ``get_ti_count``,
``get_task_states``; connections, Variables and XComs) are messages on
``task_runner.SUPERVISOR_COMMS`` to its supervisor, which answers them with Airflow's own
request handlers and an in-process Execution API client (``TriggerRunnerSupervisor.
_handle_request``). Here both are one process: :class:`SupervisorAnswers` is put where the
SDK looks for ``SUPERVISOR_COMMS`` and answers with the same handlers and the same client.

Connections and Variables are the exception: their Execution API routes look them up
through ``airflow.models``, which, seeing ``SUPERVISOR_COMMS`` set in this process, would
ask the SDK again, which would ask us. They are answered from Airflow's server-side secrets
backends directly (its ``AIRFLOW_CONN_*`` variables, its configured backend, its tables):
what the API route ends up doing in Airflow's own supervisor.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import threading
from typing import Any

from triggers.context import to_thread


class SupervisorAnswers:
    """What Airflow's triggerer supervisor answers, answered here; one call at a time."""

    def __init__(self) -> None:
        # Reentrant: an answer that asked the SDK again would fail, not hang the thread.
        self._lock = threading.RLock()
        self._client: Any = None
        self._decoder: Any = None

    def send(self, msg: Any) -> Any:
        """The answer to ``msg``. Called from a thread (``sync_to_async``, as the providers'
        triggers call the SDK) it blocks that thread. Called on the event loop (a trigger
        calling the SDK synchronously in its ``run()``), it is answered in a thread while
        the loop goes on, through the trigger task's greenback portal, as Airflow's runner
        does; without a portal it would block the loop for the lookup."""
        if _on_loop():
            # greenback comes with Airflow (its triggerer uses it), not with slotless.
            greenback = importlib.import_module("greenback")
            if greenback.has_portal():
                return greenback.await_(self.asend(msg))
        with self._lock:
            answer = self._answer(msg)
        if answer is None:
            return None
        resp, dump = answer
        # As it would arrive over Airflow's socket: dumped, then read back as the runner's
        # message type (the SDK checks isinstance against those).
        return self.decoder.validate_json(resp.model_dump_json(**dump))

    async def asend(self, msg: Any) -> Any:
        return await to_thread(self.send, msg)

    @property
    def decoder(self) -> Any:
        if self._decoder is None:
            from airflow.jobs.triggerer_job_runner import ToTriggerRunner
            from pydantic import TypeAdapter

            self._decoder = TypeAdapter(ToTriggerRunner)
        return self._decoder

    @property
    def client(self) -> Any:
        """The Execution API client Airflow's triggerer supervisor makes (in-process)."""
        if self._client is None:
            from airflow.jobs.triggerer_job_runner import in_process_api_server
            from airflow.sdk.api.client import Client

            client = Client(
                base_url=None, token="", dry_run=True, transport=in_process_api_server().transport
            )
            client.base_url = "http://in-process.invalid./"
            self._client = client
        return self._client

    def _answer(self, msg: Any) -> tuple[Any, dict[str, bool]] | None:
        from airflow.sdk.execution_time import comms as c
        from airflow.sdk.execution_time import request_handlers as h

        if isinstance(msg, c.MaskSecret):
            # Masked already: the SDK adds the mask in this process before it tells us.
            return None
        if isinstance(msg, c.GetConnection):
            return _connection(msg.conn_id)
        if isinstance(msg, c.GetVariable):
            return _variable(msg.key)
        handlers: list[tuple[type, Any]] = [
            (c.GetDRCount, h.handle_get_dr_count),
            (c.GetDagRunState, h.handle_get_dag_run_state),
            (c.GetTICount, h.handle_get_ti_count),
            (c.GetTaskStates, h.handle_get_task_states),
            (c.GetPreviousTI, h.handle_get_previous_ti),
            (c.GetXCom, h.handle_get_xcom),
            (c.SetXCom, h.handle_set_xcom),
            (c.DeleteXCom, h.handle_delete_xcom),
        ]
        for kind, handler in handlers:
            if isinstance(msg, kind):
                resp, dump = handler(self.client, msg)
                return None if resp is None else (resp, dump)
        raise RuntimeError(
            f"slotless airflow-triggerer does not answer the Task SDK's {type(msg).__name__} "
            "yet (Airflow's triggerer supervisor does): serve this task's trigger with "
            "`airflow triggerer --queues` (docs/airflow-triggerer.md)"
        )


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def portal() -> None:
    """Give the calling task a greenback portal (Airflow's runner gives every trigger one,
    unless AIRFLOW_DISABLE_GREENBACK_PORTAL is true), so that its synchronous SDK calls
    are answered without blocking the loop."""
    if os.environ.get("AIRFLOW_DISABLE_GREENBACK_PORTAL", "").lower() == "true":
        return
    try:
        greenback = importlib.import_module("greenback")
    except ImportError:
        return
    await greenback.ensure_portal()


def _connection(conn_id: str) -> tuple[Any, dict[str, bool]]:
    from airflow.configuration import ensure_secrets_loaded
    from airflow.sdk.api.datamodels._generated import ConnectionResponse
    from airflow.sdk.exceptions import ErrorType
    from airflow.sdk.execution_time.comms import ConnectionResult, ErrorResponse

    for backend in ensure_secrets_loaded():
        conn = backend.get_connection(conn_id=conn_id)
        if conn is not None:
            extra = conn.extra
            response = ConnectionResponse(
                conn_id=conn.conn_id,
                conn_type=conn.conn_type,
                host=conn.host,
                schema=conn.schema,
                login=conn.login,
                password=conn.password,
                port=conn.port,
                extra=extra if extra is None or isinstance(extra, str) else json.dumps(extra),
            )
            return ConnectionResult.from_conn_response(response), {
                "exclude_unset": True,
                "by_alias": True,
            }
    return ErrorResponse(error=ErrorType.CONNECTION_NOT_FOUND, detail={"conn_id": conn_id}), {}


def _variable(key: str) -> tuple[Any, dict[str, bool]]:
    from airflow.configuration import ensure_secrets_loaded
    from airflow.sdk.exceptions import ErrorType
    from airflow.sdk.execution_time.comms import ErrorResponse, VariableResult

    for backend in ensure_secrets_loaded():
        value = backend.get_variable(key=key)
        if value is not None:
            return VariableResult(key=key, value=value), {"exclude_unset": True}
    return ErrorResponse(error=ErrorType.VARIABLE_NOT_FOUND, detail={"key": key}), {}


def install() -> SupervisorAnswers:
    """Put the answers where the Task SDK looks for its supervisor."""
    from airflow.sdk.execution_time import task_runner

    answers = SupervisorAnswers()
    # Both are slow to make (the in-process Execution API server, ~0.8 s here): made here,
    # before the engine runs. Made at a trigger's first SDK call, in that call's thread,
    # it was seen to stop the event loop for as long (the GIL held through the imports and
    # the API app's building), and the instance to miss a beat of its liveness.
    answers.decoder  # noqa: B018
    answers.client  # noqa: B018
    task_runner.SUPERVISOR_COMMS = answers
    return answers
