"""Separate virtual environments with Apache Airflow, built once under the checkout.

Airflow cannot live in the main .venv (its pins would fight ours). The tests use
``.venv-airflow`` (tests/e2e/test_airflow_triggers.py) and benchmarks/vs_airflow.py uses
``.venv-bench-airflow``, both git-ignored: apache-airflow (core, task SDK, the standard
provider, the Amazon provider with aiobotocore, the SFTP provider, psycopg for a
PostgreSQL metadata database) at the versions
``constraints-airflow.txt`` pins, plus this checkout (editable,
with ``[airflow]``). A venv is rebuilt when that file or pyproject.toml changes; building
took 53 s here with a warm pip cache on a quiet machine, several minutes while the machine
was shared (a cold cache downloads ~150 MB). Whoever builds says so on stderr.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-airflow"  # the tests'
BENCH_VENV = REPO / ".venv-bench-airflow"  # benchmarks/vs_airflow.py's
CONSTRAINTS = REPO / "constraints-airflow.txt"


def _fingerprint() -> str:
    h = hashlib.sha256()
    for f in (CONSTRAINTS, REPO / "pyproject.toml"):
        h.update(f.read_bytes())
    return h.hexdigest()


def airflow_python(venv: Path = VENV, *, what: str = "the Airflow test environment") -> Path:
    """The venv's python, building the venv first if it is missing or out of date."""
    python = venv / "bin" / "python"
    stamp = venv / ".built"
    want = _fingerprint()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(str(venv) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two sessions building at once would mix files
        if stamp.exists() and stamp.read_text() == want and python.exists():
            return python
        began = time.monotonic()
        print(
            f"\nbuilding {what} in {venv} (once; about a minute with a warm pip cache, "
            "longer without)",
            file=sys.stderr,
            flush=True,
        )
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run(
            # psycopg: Airflow's metadata database on PostgreSQL (tests/store/airflow_db.py);
            # the Amazon provider: the S3KeySensor of tests/e2e/test_airflow_deployment.py;
            # the SFTP provider: the native SFTPTrigger's (tests/e2e/test_airflow_sftp_native.py)
            [
                *pip,
                "-c",
                str(CONSTRAINTS),
                "-e",
                f"{REPO}[airflow]",
                "psycopg[binary]",
                "apache-airflow-providers-amazon[aiobotocore]",
                "apache-airflow-providers-sftp",
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"building {venv} failed:\n{done.stdout}\n{done.stderr}")
        stamp.write_text(want)
        print(f"built {venv} in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    return python
