"""What a trigger row waits for, as a key: rows with equal keys are one check.

Any class: its (classpath, kwargs), the kwargs written canonically (sorted keys, datetimes
as ISO text), so two task instances deferred with equal kwargs share one ``run()``.
Natively recognised classes get a key of what they check, so more rows share:

- the standard provider's ``FileTrigger``: ``("file", filepath, recursive)``; its
  ``poke_interval`` is left out of the key, and the shared check runs at the shortest
  interval among the rows that wait on it;
- its ``DateTimeTrigger`` (what ``TimeDeltaTrigger`` serializes as) with a ``moment``:
  ``("time", moment, end_from_trigger)``. One with a ``target_time`` (rendered from a
  template at the triggerer, ``start_from_trigger``) runs through the adapter;
- the Amazon provider's ``S3KeyTrigger``: ``("s3", aws_conn_id, region_name, verify,
  bucket, key, wildcard_match)`` (:func:`.native_s3.s3_key`), ``poke_interval`` left out as
  for a file;
- the SFTP provider's ``SFTPTrigger``: ``("sftp", sftp_conn_id, path, file_pattern,
  newer_than)`` (:func:`.native_sftp.sftp_key`), ``poke_interval`` left out as for a file.
- the standard provider's ``DagStateTrigger`` with a non-empty ``run_ids`` list:
  ``("dagstate", dag_id, run_ids, states, execution_dates, poll_interval)``, all of them
  (its event echoes its kwargs); its ``WorkflowTrigger`` without ``external_task_group_id``:
  ``("workflow", external_dag_id, run_ids, logical_dates, external_task_ids, failed_states,
  skipped_states, allowed_states)``, ``poke_interval`` and ``soft_fail`` left out
  (:func:`.native_external.external_key`).

A row whose kwargs carry anything else than those the native check understands runs
through the adapter: another provider version's extra kwarg must not be ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from .native_external import DAGSTATE, WORKFLOW, external_key
from .native_s3 import S3KEY, s3_key
from .native_sftp import SFTP, sftp_key

FILE = "airflow.providers.standard.triggers.file.FileTrigger"
DATETIME = "airflow.providers.standard.triggers.temporal.DateTimeTrigger"
TIMEDELTA = "airflow.providers.standard.triggers.temporal.TimeDeltaTrigger"

NATIVE = (FILE, DATETIME, TIMEDELTA, S3KEY, SFTP, DAGSTATE, WORKFLOW)

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Plan:
    kind: str  # "file", "time", "s3", "sftp", "external" or "adapter"
    key: Key


def plan(classpath: str, kwargs: dict[str, Any]) -> Plan:
    """How a row with this class and these (decoded) kwargs is checked, and its key."""
    if classpath == FILE and set(kwargs) <= {"filepath", "recursive", "poke_interval"}:
        path = kwargs.get("filepath")
        if isinstance(path, str) and path and _number(kwargs.get("poke_interval", 5.0)):
            return Plan("file", ("file", path, bool(kwargs.get("recursive", False))))
    if classpath in (DATETIME, TIMEDELTA) and set(kwargs) <= {"moment", "end_from_trigger"}:
        moment = kwargs.get("moment")
        if isinstance(moment, datetime) and moment.tzinfo is not None:
            end = bool(kwargs.get("end_from_trigger", False))
            return Plan("time", ("time", moment.timestamp(), end))
    if classpath == S3KEY and (key := s3_key(kwargs)) is not None:
        return Plan("s3", key)
    if classpath == SFTP and (key := sftp_key(kwargs)) is not None:
        return Plan("sftp", key)
    if classpath in (DAGSTATE, WORKFLOW) and (key := external_key(classpath, kwargs)) is not None:
        return Plan("external", key)
    try:
        text = canonical(kwargs)
    except (TypeError, ValueError):
        # Keys JSON cannot sort (ints beside strings): compared as printed instead.
        text = repr(_loose(kwargs))
    return Plan("adapter", ("adapter", classpath, text))


def poke_interval(kwargs: dict[str, Any]) -> float:
    """A FileTrigger's, S3KeyTrigger's or SFTPTrigger's row's own interval (Airflow's
    default, 5 s, when absent)."""
    value = kwargs.get("poke_interval", 5.0)
    return float(value) if _number(value) and float(value) > 0 else 5.0


def canonical(kwargs: dict[str, Any]) -> str:
    """The kwargs as one string, equal for equal kwargs whatever their order."""
    return json.dumps(kwargs, sort_keys=True, separators=(",", ":"), default=_text)


def _loose(value: Any) -> Any:
    """``value`` with every dict's items in an order that does not depend on insertion."""
    if isinstance(value, dict):
        return sorted(((repr(k), _loose(v)) for k, v in value.items()), key=lambda kv: kv[0])
    if isinstance(value, (list, tuple)):
        return [_loose(v) for v in value]
    return value


def _text(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return {"__dt": value.isoformat()}
    if isinstance(value, timedelta):
        return {"__td": value.total_seconds()}
    if isinstance(value, (set, frozenset)):
        return {"__set": sorted(map(repr, value))}
    if isinstance(value, tuple):
        return {"__tuple": list(value)}
    # Anything else: its repr, so two rows are one check only if they print the same.
    return {"__repr": f"{type(value).__module__}.{type(value).__qualname__}:{value!r}"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
