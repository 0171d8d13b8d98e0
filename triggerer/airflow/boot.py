"""Starting ``slotless airflow-triggerer``: is this Airflow one it serves, and is its database
migrated? Each refusal is one line (the caller prints it and exits non-zero)."""

from __future__ import annotations

import importlib.util
import re

# The Airflow releases this triggerer is tested with: it calls Airflow's own triggerer
# interfaces (and two of its private helpers), whose signatures move between minor releases.
SUPPORTED_MIN = (3, 3)
SUPPORTED_BELOW = (3, 4)
SUPPORTED = "Apache Airflow 3.3.x (tested with 3.3.2)"

INSTALL_HINT = (
    "slotless airflow-triggerer needs Apache Airflow in this environment: install "
    "'slotless[airflow]' into the Airflow deployment's environment "
    "(pip install 'slotless[airflow]')"
)


class Refused(Exception):
    """A reason not to start, said in one line."""


def version_refusal(version: str) -> str | None:
    """The line refusing Airflow ``version``, or None when it is supported."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        return f"cannot tell the Apache Airflow version from {version!r}; supported: {SUPPORTED}"
    found = (int(m.group(1)), int(m.group(2)))
    if SUPPORTED_MIN <= found < SUPPORTED_BELOW:
        return None
    return (
        f"Apache Airflow {version} is not supported by slotless airflow-triggerer; "
        f"supported: {SUPPORTED}. Run `airflow triggerer` with this version"
    )


def import_airflow() -> str:
    """Import Airflow (it reads its own configuration: AIRFLOW_HOME, airflow.cfg, the
    AIRFLOW__* variables) and return its version; :class:`Refused` when it is missing or
    not a supported version."""
    if importlib.util.find_spec("airflow") is None:
        raise Refused(INSTALL_HINT)
    import airflow

    version = str(getattr(airflow, "__version__", "unknown"))
    line = version_refusal(version)
    if line is not None:
        raise Refused(line)
    return version


def check_database() -> None:
    """:class:`Refused` unless Airflow's metadata database answers and is at the migration
    this Airflow's code expects (what ``airflow db check-migrations`` compares)."""
    from airflow import settings
    from airflow.utils import db

    where = _redacted(str(settings.SQL_ALCHEMY_CONN or ""))
    try:
        with db._configured_alembic_environment() as env:
            want = set(env.script.get_heads())
            have = set(env.get_context().get_current_heads())
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise Refused(
            f"cannot read Airflow's metadata database at {where} ({type(exc).__name__}: "
            f"{first}); check AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
        ) from None
    if want != have:
        raise Refused(
            f"Airflow's metadata database at {where} is at migration "
            f"{', '.join(sorted(have)) or 'none'}, this Airflow expects "
            f"{', '.join(sorted(want))}: run `airflow db migrate` with this Airflow first"
        )


def check_queues_enabled() -> None:
    """``--queues`` is refused unless Airflow writes queues on trigger rows at all (as
    ``airflow triggerer --queues`` refuses)."""
    from airflow.configuration import conf

    if not conf.getboolean("triggerer", "queues_enabled", fallback=False):
        raise Refused(
            "--queues may only be used when Airflow's [triggerer] queues_enabled is True "
            "(AIRFLOW__TRIGGERER__QUEUES_ENABLED=True), as for `airflow triggerer --queues`"
        )


# PostgreSQL binds at most this many parameters in one statement; Airflow's
# assign_unassigned binds one per row it takes in a cycle.
MOST_SELECTED = 65_535


def check_select_limit() -> None:
    """Refuse ``[triggerer] max_trigger_to_select_per_loop`` above what one statement can
    bind: every cycle's assignment would fail, and no row would ever be taken."""
    from airflow.configuration import conf

    limit = conf.getint("triggerer", "max_trigger_to_select_per_loop", fallback=50)
    if not 1 <= limit <= MOST_SELECTED:
        raise Refused(
            f"Airflow's [triggerer] max_trigger_to_select_per_loop is {limit}: Airflow takes "
            f"that many rows in one statement, which binds at most {MOST_SELECTED:,} "
            "parameters; set it from 1 to 65535 "
            "(AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP)"
        )


def _redacted(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
