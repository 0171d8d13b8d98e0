"""An Airflow home on a private metadata database, for the tests that drive `slotless
airflow-triggerer` against Airflow's own packages (.venv-airflow): its environment, its
commands, and the in-environment helper (support/airflow_deferred.py) that defers task
instances through Airflow's ORM.

The environment is Airflow's configuration by variables only: the database, a fresh Fernet
key, the DAG folder written from ``dags`` (file name -> source), no examples.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from benchmarks.airflow_env import REPO, airflow_python
from support.pg import private_database


def fernet_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


class AirflowHome:
    """An Airflow home and metadata database, and the commands run against them."""

    def __init__(
        self,
        python: Path,
        tmp: Path,
        url: str,
        pg_url: str,
        dags: dict[str, str],
        env: dict[str, str] | None = None,
    ) -> None:
        self.python = python
        self.bin = python.parent
        self.tmp = tmp
        self.pg_url = pg_url  # the same database, for asyncpg
        (tmp / "dags").mkdir()
        for name, source in dags.items():
            (tmp / "dags" / name).write_text(source)
        self.env = {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "HOME": str(tmp),
            "AIRFLOW_HOME": str(tmp / "home"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(tmp / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": fernet_key(),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url,
            "PYTHONPATH": str(REPO / "tests"),
            **(env or {}),
        }

    @classmethod
    @contextlib.contextmanager
    def migrated(
        cls, tmp_path_factory: pytest.TempPathFactory, name: str, *args: Any
    ) -> Iterator[Self]:
        """A home of this class (built with ``args`` after its database) on a private
        PostgreSQL database ``name``, migrated, its DAGs synced; the database dropped
        after. Builds the Airflow test environment first if it is missing."""
        python = airflow_python()
        with private_database(name) as (pg_url, url):
            home = cls(python, tmp_path_factory.mktemp(name), url, pg_url, *args)
            home.migrate_and_sync()
            yield home

    def start_triggerer(
        self, log: Path, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """``slotless airflow-triggerer ARGS`` on this home, its output into ``log``."""
        with open(log, "w") as out:
            return subprocess.Popen(
                [str(self.bin / "slotless"), "airflow-triggerer", *args],
                env=env or self.env,
                cwd=self.tmp,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def run(self, *args: str, stdin: str | None = None, timeout: float = 180) -> Any:
        return subprocess.run(
            args,
            env=self.env,
            cwd=self.tmp,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def helper(self, command: str, spec: dict[str, Any]) -> Any:
        """support/airflow_deferred.py's ``command`` run in Airflow's environment with
        ``spec``; what it printed after ``RESULT``."""
        done = self.run(
            str(self.python), "-m", "support.airflow_deferred", command, stdin=json.dumps(spec)
        )
        for line in done.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line.removeprefix("RESULT "))
        raise AssertionError(f"airflow_deferred {command} failed:\n{done.stdout}\n{done.stderr}")

    def migrate_and_sync(self) -> None:
        """Airflow's schema, then the DAG folder serialized into it."""
        migrated = self.run(str(self.bin / "airflow"), "db", "migrate")
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        synced = self.run(
            str(self.python), "-m", "support.airflow_deferred", "sync", str(self.tmp / "dags")
        )
        assert synced.returncode == 0, synced.stderr[-3000:]
