"""`slotless status --airflow --url URL...`: what running `slotless airflow-triggerer`
processes hold, grouped by check, read from each one's ``GET /status`` (on its
``--metrics-port``).

Each check is listed once per instance that checks it (one, except for a moment while
ownership moves between instances): its class and key, how many task instances wait on it
and of which DAGs, the first few of them (``dag_id.task_id run_id map_index``), since
when, its interval, its last check and result, and the TriggererJob that checks it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any

import aiohttp
from rich.console import Console

MARK = "airflow-triggerer"
TIMEOUT_S = 5.0


class Unreadable(Exception):
    """A --url that is not a running slotless airflow-triggerer's status endpoint."""


def add_options(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "--airflow",
        action="store_true",
        help="what running `slotless airflow-triggerer` processes hold, by check (with --url)",
    )
    status.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="URL",
        help="with --airflow: an airflow-triggerer's metrics address, http://host:port "
        "(its --metrics-port); repeat it for each instance",
    )
    status.add_argument(
        "--tasks",
        type=int,
        default=5,
        help="with --airflow: task instances named per check (default 5)",
    )


async def airflow_command(args: argparse.Namespace) -> int:
    if not args.url:
        return _refuse(
            "--airflow needs --url http://host:port for each slotless airflow-triggerer "
            "(the address of its --metrics-port)"
        )
    if args.tasks < 0 or args.limit < 0:
        return _refuse("--limit and --tasks must be 0 or more")
    snapshots = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        for url in args.url:
            try:
                snapshots.append(await read(http, url, args.limit, args.tasks))
            except Unreadable as exc:
                return _refuse(str(exc))
    if args.json:
        print(json.dumps({"instances": snapshots}))
    else:
        render(snapshots, Console(), args.limit, args.tasks)
    return 0


def _refuse(line: str) -> int:
    print(f"slotless: error: {line}", file=sys.stderr)
    return 2


def status_url(url: str) -> str:
    """The /status address for what a user gives: http://host:port, with or without a
    path (/metrics, /status)."""
    base = url.strip()
    if "://" not in base:
        base = f"http://{base}"
    head, sep, tail = base.partition("://")
    host = tail.split("/", 1)[0]
    if not host:
        raise Unreadable(f"--url {url!r} is not an address: give http://host:port")
    return f"{head}{sep}{host}/status"


async def read(http: aiohttp.ClientSession, url: str, checks: int, tasks: int) -> dict[str, Any]:
    """One instance's snapshot, or Unreadable saying why in one line."""
    target = status_url(url)
    try:
        async with http.get(target, params={"checks": checks, "tasks": tasks}) as resp:
            body = await resp.read()
            code = resp.status
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        why = str(exc) or type(exc).__name__
        raise Unreadable(
            f"cannot read {target} ({why}); is `slotless airflow-triggerer "
            "--metrics-port` serving there?"
        ) from None
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if code != 200 or not isinstance(data, dict) or data.get("slotless") != MARK:
        raise Unreadable(
            f"{target} is not a slotless airflow-triggerer's status (HTTP {code}); give the "
            "address of its --metrics-port"
        )
    data["url"] = url
    return data


def render(
    snapshots: list[dict[str, Any]], console: Console, limit: int = 20, tasks: int = 5
) -> None:
    now = time.time()
    jobs = ", ".join(f"TriggererJob {s.get('job_id')} ({s['url']})" for s in snapshots)
    live = sorted({j for s in snapshots for j in s.get("live", [])})
    console.print(f"[bold]slotless airflow-triggerer[/bold]: {jobs}", soft_wrap=True)
    console.print(
        f"live instances: {', '.join(map(str, live)) or 'none'}; "
        f"held: {sum(s.get('triggers', 0) for s in snapshots)} trigger rows in "
        f"{sum(s.get('check_count', 0) for s in snapshots)} checks"
    )
    checks = [c for s in snapshots for c in s.get("checks", [])]
    checks.sort(key=lambda c: -int(c.get("waiting", 0)))
    if not checks:
        console.print("no checks held")
    # Lines, not a table: a check's key and its task instances' keys are long, and a
    # table would wrap them into unreadable (and ungreppable) cells.
    for c in checks[:limit]:
        dags = ", ".join(f"{d}: {n}" for d, n in sorted(c.get("dags", {}).items()))
        console.print(f"[bold]{c.get('check')}[/bold]  {c.get('classpath')}", soft_wrap=True)
        console.print(
            f"  {c.get('waiting')} waiting ({dags or 'no task instance'}), since "
            f"{_ago(c.get('since'), now)}; {_interval(c)}; last check {_last(c, now)}; "
            f"checked by TriggererJob {c.get('checked_by')}",
            soft_wrap=True,
        )
        shown = list(c.get("tasks", []))[:tasks]
        for t in shown:
            console.print(f"    {_ti(t)}", soft_wrap=True, highlight=False)
        more = int(c.get("waiting", 0)) - len(shown)
        if more > 0:
            console.print(f"    ... and {more} more", highlight=False)
    total = sum(int(s.get("check_count", 0)) for s in snapshots)
    if 0 < min(len(checks), limit) < total:
        console.print(
            f"({min(len(checks), limit)} of {total} checks shown, the most waited on; --limit N)"
        )
    recent = sorted(
        (r for s in snapshots for r in s.get("recent", [])), key=lambda r: -float(r["at"])
    )
    if recent:
        console.print("[bold]recent outcomes[/bold]")
        for r in recent[:10]:
            at = datetime.fromtimestamp(float(r["at"])).strftime("%H:%M:%S")
            console.print(
                f"  {at} {r.get('said')} ({r.get('trigger_count')} trigger(s))", soft_wrap=True
            )


def _ti(t: dict[str, Any]) -> str:
    return (
        f"{t.get('dag_id')}.{t.get('task_id')} {t.get('run_id')} {t.get('map_index')} "
        f"(trigger {t.get('trigger_id')})"
    )


def _ago(at: Any, now: float) -> str:
    if at is None:
        return "-"
    seconds = max(0.0, now - float(at))
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _interval(c: dict[str, Any]) -> str:
    if c.get("interval") is not None:
        return f"every {float(c['interval']):g}s"
    if c.get("fires_at"):
        return f"timer: {c['fires_at']}"
    return "its run()"


def _last(c: dict[str, Any], now: float) -> str:
    if c.get("last_check") is None:
        return "-" if c.get("kind") != "adapter" else f"running, {c.get('events', 0)} event(s)"
    return f"{_ago(c['last_check'], now)}: {c.get('last_result')}"
