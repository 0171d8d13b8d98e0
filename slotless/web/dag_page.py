"""``GET /dags/{dag_id}``: one DAG's page, as Airflow 3's grid view shows a DAG.

What it shows: the DAG's schedule and next run (as the DAGs list says them,
:mod:`slotless.schedule_shown`), its file, whether it is paused (with pause, unpause and
trigger forms for a signed-in operator), its params; then **the grid**, its runs as
columns (oldest on the left) and its tasks as rows (in topological order when the
catalogue knows its shape), each cell a square coloured by state that opens the task's
page, a mapped task one cell with its instances counted (a row that expands into one row
per map index); **durations**, a small bar chart per task over the runs shown
(``_durations.html``: inline SVG, no script); and **a calendar** of the last year, a
square per day coloured by that day's runs (by logical date).

The URL holds what is shown: ``?runs=N`` (default 25, at most 100), ``?before=<created_at>,
<run_id>`` (the page of runs created before that one: older and newer links page through
all of the DAG's history by keyset), ``?expand=TASK`` (repeatable). A bad value is a 400
with one line. The grid and the durations are ``live_*`` blocks: while a run shown has not
ended, the page's poll renders them again. Everything is read in one read transaction
(:meth:`executor.store.grid.Grids.dag_page`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, NamedTuple

from aiohttp import web
from markupsafe import Markup, escape
from pydantic import BaseModel

from executor.loader import DagImportError
from executor.runnames import logical_shown
from executor.store.grid import (
    INSTANCES_SHOWN,
    MAX_EXPANDED,
    MAX_RUNS,
    RUNS_SHOWN,
    BadRunKey,
    Calendar,
    Grid,
    GridCell,
    GridRun,
    RunKey,
)
from executor.store.viewrows import DagRow
from executor.taskgroups import group_tree, tree_from_ids
from triggers.limits import storable_text

from ..schedule_shown import ScheduleShown, schedule_shown
from ..status import human_seconds
from ..trigger import import_dag
from .charts import FILLS, Bar, Chart, bar_chart
from .graph import STATE_ORDER
from .keys import AUTH, LIVE, SETTINGS, STORE
from .render import MARKS, View, dag_href, run_href, task_href, with_query
from .respond import polled, respond

MAX_FOLDED = 50  # groups folded at once (?fold=), as a URL can hold
log = logging.getLogger("slotless.web")

# A square's fill per state (a mapped cell mixes them by count); the CSS's square colours.
# How a mapped cell counts its instances: "5 ok / 1 failed".
WORD = {"SUCCESS": "ok", "UPSTREAM_FAILED": "upstream failed"}
# Reading the DAG file for its params takes at most this long (the catalogue's own
# parse limit, --parse-timeout, when it is shorter): a page must not hang on a file.
PARAMS_TIMEOUT = 10.0


class BadQuery(ValueError):
    """A query value the page cannot use: one line, answered as a 400; ``field`` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Query:
    """What the URL asks the page to show."""

    runs: int = RUNS_SHOWN
    before: RunKey | None = None
    expand: tuple[str, ...] = ()
    fold: tuple[str, ...] = ()  # task groups drawn as one row

    def href(self, dag_id: str, **change: Any) -> str:
        """This page's URL with ``change`` (runs, before, expand, fold), defaults left out."""
        runs = change.get("runs", self.runs)
        before = change.get("before", self.before)
        expand = change.get("expand", self.expand)
        fold = change.get("fold", self.fold)
        return with_query(
            dag_href(dag_id),
            {
                "runs": None if runs == RUNS_SHOWN else runs,
                "before": None if before is None else before.text(),
                "expand": list(expand),
                "fold": list(fold),
            },
        )


def parse_query(query: Any) -> Query:
    """``runs``, ``before`` and ``expand`` from a request's query; :class:`BadQuery` for a
    value the page cannot use. ``runs`` over :data:`MAX_RUNS` is read as MAX_RUNS."""
    runs = RUNS_SHOWN
    text = query.get("runs")
    if text is not None:
        try:
            runs = int(text)
        except ValueError:
            raise BadQuery(f"runs must be a whole number from 1 to {MAX_RUNS}", "runs") from None
        if runs < 1:
            raise BadQuery(f"runs must be a whole number from 1 to {MAX_RUNS}", "runs")
        runs = min(runs, MAX_RUNS)
    before = None
    text = query.get("before")
    if text:
        try:
            before = RunKey.parse(text)
        except BadRunKey as exc:
            raise BadQuery(str(exc), "before") from None
        if not storable_text(before.run_id):
            raise BadQuery("before: a run id without NUL or lone surrogates", "before")
    expand = tuple(dict.fromkeys(e for e in query.getall("expand", []) if e))
    if len(expand) > MAX_EXPANDED:
        raise BadQuery(f"expand: at most {MAX_EXPANDED} tasks at once", "expand")
    if not all(storable_text(e) for e in expand):
        raise BadQuery("expand: a task id without NUL or lone surrogates", "expand")
    fold = tuple(dict.fromkeys(f for f in query.getall("fold", []) if f))
    if len(fold) > MAX_FOLDED:
        raise BadQuery(f"fold: at most {MAX_FOLDED} groups at once", "fold")
    if not all(storable_text(f) for f in fold):
        raise BadQuery("fold: a group id without NUL or lone surrogates", "fold")
    return Query(runs, before, expand, fold)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/dags/{dag_id}", dag_page)
    app.router.add_get(LIVE + "/dags/{dag_id}", dag_page)  # its live blocks, as JSON


async def dag_page(request: web.Request) -> web.Response:
    dag_id = request.match_info["dag_id"]
    try:
        q = parse_query(request.query)
    except BadQuery as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    store = request.app[STORE]
    poll = polled(request)
    view = (
        await store.grids.dag_page(dag_id, q.runs, q.before, q.expand, calendar=not poll)
        if storable_text(dag_id)
        else None
    )
    if view is None:
        what = f"There is no DAG {dag_id!r}: it is not in the catalogue and never ran."
        return respond(request, View("not_found.html", "not found", {"what": what}), status=404)
    grid = view.grid
    ctx: dict[str, Any] = {
        "dag_id": dag_id,
        "grid_view": grid_shown(grid, q),
        "durations": durations_shown(grid),
        "paging": paging(grid, q),
    }
    if not poll:  # what only the whole page draws: the poll renders the live blocks alone
        w = request.app[AUTH].writes(request)
        kept = w.session.form if w.session is not None else {}
        again = kept.get("dag_id") == dag_id and kept.get("action") == "trigger"
        timeout = min(PARAMS_TIMEOUT, request.app[SETTINGS]["parse_timeout"])
        ctx |= {
            "dag": grid.dag,
            "shown": None if grid.dag is None else _schedule(grid.dag),
            "max_active_runs": grid.max_active_runs,
            "params": await params_shown(grid.dag, grid.file_mtime, timeout),
            "calendar": None if view.calendar is None else calendar_shown(view.calendar),
            "conf_kept": kept.get("conf", "") if again else None,
        }
    return respond(request, View("dag.html", dag_id, ctx, live=grid.live))


def _schedule(dag: DagRow) -> ScheduleShown | None:
    try:
        return schedule_shown(dag)
    except Exception:  # a stored schedule this code cannot read: the rest of the page shows
        log.exception("reading the schedule of %s", dag.dag_id)
        return None


# -- the grid ----------------------------------------------------------------------------


class CellShown(NamedTuple):
    """A square of the grid: what it says (``state``, ``href``, ``title``: text) and
    ``html``, its ``<td>`` as the page writes it."""

    state: str
    href: str
    title: str
    style: str  # a mapped cell's mix of its instances' states ("": one colour)
    mixed: bool
    html: str  # markup: every text in it escaped


@dataclass(frozen=True, slots=True)
class RowShown:
    task_id: str
    label: str  # the task id, or "[3]" for a map index of an expanded task
    cells: list[CellShown | None]  # one per run shown; None: the run has no such task
    mapped: bool = False
    expanded: bool = False
    toggle: str = ""  # a mapped task's expand / collapse link; a group's fold / unfold
    instance: bool = False  # a map index's row under its expanded task
    group: bool = False  # a task group's row: its tasks' states together, per run
    depth: int = 0  # how many groups it is in (its indent)
    # Its cells' <td>s as one string, made here: 5,000 cells drawn by a template loop (a
    # dozen attributes escaped per cell) cost a quarter of the page's time.
    html: Markup = field(init=False)

    def __post_init__(self) -> None:
        tds = "".join(NO_CELL if c is None else c.html for c in self.cells)
        object.__setattr__(self, "html", Markup(tds))


@dataclass(frozen=True, slots=True)
class ColumnShown:
    run_id: str
    href: str
    state: str
    logical_date: str
    title: str


@dataclass(frozen=True, slots=True)
class GridShown:
    columns: list[ColumnShown]
    rows: list[RowShown]
    instances_shown: int


@dataclass(frozen=True, slots=True)
class RunParts:
    """A run's parts of its cells' links and titles (and its durations' labels), worked
    out and escaped once per page rather than once per cell."""

    run_id: str
    shown: str  # its logical time for people
    href: str  # its page
    shown_html: str  # the same, escaped
    href_html: str
    id_html: str

    @classmethod
    def of(cls, run: GridRun) -> RunParts:
        shown, href, run_id = logical_shown(run), run_href(run.run_id), run.run_id
        return cls(run_id, shown, href, str(escape(shown)), str(escape(href)), str(escape(run_id)))


def run_parts(grid: Grid) -> list[RunParts]:
    return [RunParts.of(r) for r in grid.runs]


NO_CELL = '<td><span class="cell none" title="not in this run"></span></td>'


@functools.cache
def _state_html(state: str) -> tuple[str, str]:
    """A state and its mark, escaped: a handful of names, escaped once each."""
    return str(escape(state)), str(escape(MARKS.get(state, "")))


def _td(state: str, href_html: str, title_html: str, style: str, mixed: bool) -> str:
    """A cell's <td>; ``href_html`` and ``title_html`` are escaped already."""
    st, mark = _state_html(state)
    cls = " mixed" if mixed else ""
    css = f' style="{escape(style)}"' if style else ""
    return (
        f'<td><a class="cell st-{st}{cls}" href="{href_html}" title="{title_html}" '
        f'data-state="{st}"{css}>{mark}</a></td>'
    )


def counts_text(counts: dict[str, int]) -> str:
    """A mapped task's instances in words: ``5 ok / 1 failed`` (no instance: ``none yet``)."""
    parts = [
        f"{counts[s]} {WORD.get(s, s.lower())}"
        for s in (*STATE_ORDER, *sorted(set(counts) - set(STATE_ORDER)))
        if counts.get(s)
    ]
    return " / ".join(parts) or "no instances yet"


def mix_style(counts: dict[str, int]) -> str:
    """A mapped cell's background: its instances' states stacked by count, bottom up."""
    total = sum(counts.values())
    if not total:
        return ""
    stops, at = [], 0.0
    for s in (*STATE_ORDER, *sorted(set(counts) - set(STATE_ORDER))):
        if counts.get(s):
            end = at + 100 * counts[s] / total
            fill = FILLS.get(s, "#9e9e9e")
            stops.append(f"{fill} {at:.1f}% {end:.1f}%")
            at = end
    return f"background: linear-gradient(to top, {', '.join(stops)})"


class TaskParts(NamedTuple):
    """A row's parts of its cells' titles and links, made and escaped once per row."""

    name: str  # the task id, and a map index as "[3]"
    name_html: str
    path: str  # the cell's href after its run's page: /tasks/<id>[/<index>]
    path_html: str

    @classmethod
    def of(cls, task_id: str, map_index: int = -1) -> TaskParts:
        name = task_id if map_index < 0 else f"{task_id}[{map_index}]"
        path = task_href("", task_id, map_index).removeprefix(run_href(""))
        return cls(name, str(escape(name)), path, str(escape(path)))


def _cell(c: GridCell, run: RunParts, task: TaskParts, now: float) -> CellShown:
    """``c`` as its square, in ``run``'s column and ``task``'s row."""
    seconds = c.seconds(now)
    # human_seconds writes digits, letters, dots and spaces, attempts are numbers: nothing
    # in them to escape, so the title's escaped form is its escaped parts put together.
    took = "" if seconds is None else f" \u00b7 {human_seconds(seconds)}"
    href, href_html = run.href + task.path, run.href_html + task.path_html
    head = f"{task.name} \u00b7 {run.shown} \u00b7 "
    head_html = f"{task.name_html} \u00b7 {run.shown_html} \u00b7 "
    if c.counts is not None:
        counted = f"{c.state}: {counts_text(c.counts)}{took}"
        style, mixed = mix_style(c.counts), len(c.counts) > 1
        td = _td(c.state, href_html, head_html + str(escape(counted)), style, mixed)
        return CellShown(c.state, href, head + counted, style, mixed, td)
    tries = f" \u00b7 attempt {c.attempt} of {c.max_attempts}" if c.max_attempts > 1 else ""
    st, _ = _state_html(c.state)
    td = _td(c.state, href_html, f"{head_html}{st}{took}{tries}", "", False)
    return CellShown(c.state, href, f"{head}{c.state}{took}{tries}", "", False, td)


def grid_shown(grid: Grid, q: Query) -> GridShown:
    """The grid as the template draws it: a column per run, a row per task (and per map
    index of an expanded task), each cell with its colour, link and hover text."""
    parts = run_parts(grid)
    shown = {p.run_id: p.shown for p in parts}
    columns = [
        ColumnShown(
            r.run_id, p.href, r.state, p.shown,
            f"{r.run_id} \u00b7 {p.shown} \u00b7 {r.state}"
            + (f" \u00b7 {human_seconds(r.ended_at - r.created_at)}" if r.ended_at else ""),
        )
        for r, p in zip(grid.runs, parts, strict=True)
    ]  # fmt: skip
    rows: list[RowShown] = []
    chains = group_chains(grid)
    opened: set[str] = set()
    now, cells_of = grid.now, grid.cells.get
    for task_id in grouped_order(grid.tasks, chains):
        chain = chains.get(task_id, ())
        folded = next((g for g in chain if g in q.fold), None)
        for depth, g in enumerate(chain):
            if g not in opened:
                opened.add(g)
                if folded is None or chain.index(folded) >= depth:
                    rows.append(_group_row(grid, q, g, depth, chains, shown))
        if folded is not None:
            continue  # drawn by its group's row
        task = TaskParts.of(task_id)
        cells: list[CellShown | None] = []
        for p in parts:
            c = cells_of((p.run_id, task_id))
            cells.append(None if c is None else _cell(c, p, task, now))
        mapped = grid.mapped(task_id)
        expanded = task_id in grid.instances
        toggle = ""
        if mapped:
            others = tuple(e for e in q.expand if e != task_id)
            toggle = q.href(grid.dag_id, expand=others if expanded else (*q.expand, task_id))
        rows.append(RowShown(task_id, task_id, cells, mapped, expanded, toggle, depth=len(chain)))
        if expanded:
            got = grid.instances[task_id]
            for i in grid.map_indexes[task_id]:
                instance = TaskParts.of(task_id, i)
                row: list[CellShown | None] = []
                for p in parts:
                    ic = got.get((p.run_id, i))
                    row.append(None if ic is None else _cell(ic, p, instance, now))
                rows.append(RowShown(task_id, f"[{i}]", row, instance=True, depth=len(chain)))
    return GridShown(columns, rows, INSTANCES_SHOWN)


# A group's cell takes the state that most needs a look among its tasks' (its title lists
# them all): trouble first, then what still goes, then how it ended.
GROUP_STATE = ("FAILED", "UPSTREAM_FAILED", "RETRYING", "RUNNING", "SENSING", "DEFERRED",
               "QUEUED", "PENDING", "SKIPPED", "SUCCESS")  # fmt: skip


def group_chains(grid: Grid) -> dict[str, tuple[str, ...]]:
    """Each grouped task's groups, outermost first: from the catalogued shape, or guessed
    from the dots in the task ids for a DAG the catalogue does not hold."""
    tree = group_tree(grid.shape) if grid.shape else tree_from_ids(grid.tasks)
    chains: dict[str, tuple[str, ...]] = {}
    for _, node in tree.walk():
        parts = node.group_id.split(".")
        chain = tuple(".".join(parts[: i + 1]) for i in range(len(parts)))
        chains.update(dict.fromkeys(node.tasks, chain))
    return chains


def grouped_order(tasks: Sequence[str], chains: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The rows' order: topological, but each group's tasks together, where its first task
    is (so that a group's row stands above all of its tasks)."""
    first: dict[str, int] = {}
    for i, t in enumerate(tasks):
        for g in chains.get(t, ()):
            first.setdefault(g, i)

    def key(item: tuple[int, str]) -> tuple[int, ...]:
        i, t = item
        return (*(first[g] for g in chains.get(t, ())), i)

    return [t for _, t in sorted(enumerate(tasks), key=key)]


def _group_row(
    grid: Grid,
    q: Query,
    group_id: str,
    depth: int,
    chains: Mapping[str, tuple[str, ...]],
    shown: Mapping[str, str],
) -> RowShown:
    """A group's row: per run, its tasks' states together (the one needing a look most),
    and the link that folds it to this one row or opens it again."""
    members = [t for t in grid.tasks if group_id in chains.get(t, ())]
    folded = group_id in q.fold
    others = tuple(f for f in q.fold if f != group_id)
    toggle = q.href(grid.dag_id, fold=others if folded else (*q.fold, group_id))
    cells: list[CellShown | None] = []
    for r in grid.runs:
        counts: dict[str, int] = {}
        for t in members:
            c = grid.cells.get((r.run_id, t))
            if c is not None:
                counts[c.state] = counts.get(c.state, 0) + 1
        if not counts:
            cells.append(None)
            continue
        state = next((s for s in GROUP_STATE if s in counts), next(iter(counts)))
        title = f"{group_id} \u00b7 {shown[r.run_id]} \u00b7 {len(members)} tasks: "
        text = title + counts_text(counts)
        href, style, mixed = run_href(r.run_id), mix_style(counts), len(counts) > 1
        td = _td(state, str(escape(href)), str(escape(text)), style, mixed)
        cells.append(CellShown(state, href, text, style, mixed, td))
    label = group_id.rpartition(".")[2]
    return RowShown(
        group_id, label, cells, expanded=not folded, toggle=toggle, group=True, depth=depth
    )


def paging(grid: Grid, q: Query) -> dict[str, str]:
    """The links to the older runs, the newer ones and the newest ("": no such page)."""
    out = {"older": "", "newer": "", "newest": ""}
    if grid.older is not None:
        out["older"] = q.href(grid.dag_id, before=grid.older)
    if not grid.at_newest:
        out["newer"] = q.href(grid.dag_id, before=grid.newer)
        if grid.newer is not None:
            out["newest"] = q.href(grid.dag_id, before=None)
    return out


# -- durations ---------------------------------------------------------------------------


def durations_shown(grid: Grid) -> list[tuple[str, Chart]]:
    """Per task, a chart of its durations over the runs shown, oldest on the left (a run it
    is not in, or did not run in, a grey tick)."""
    parts = run_parts(grid)
    now, cells_of = grid.now, grid.cells.get
    out = []
    for task_id in grid.tasks:
        task = TaskParts.of(task_id)
        bars: list[Bar] = []
        for p in parts:
            c = cells_of((p.run_id, task_id))
            # HTML already (bar_chart(escaped=True)): each run's and task's parts escaped
            # once, not 5,000 labels.
            label = f"{task.name_html} \u00b7 {p.shown_html} \u00b7 {p.id_html}"
            if c is None:
                bars.append((label, None, "NONE", p.href_html))
            else:
                bars.append((label, c.seconds(now), c.state, p.href_html + task.path_html))
        # links off: the grid's cells above link each run's task already
        out.append((task_id, bar_chart(bars, links=False, escaped=True)))
    return out


# -- the calendar ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DayShown:
    day: str
    status: str  # none, success, failed, running, other
    title: str
    href: str


def calendar_shown(cal: Calendar) -> dict[str, Any]:
    """The calendar as weeks (columns, Monday on top), each day a square; a month's name
    over the week its first day falls in."""
    weeks: list[list[DayShown | None]] = []
    months: list[str] = []
    runs_of = with_query("/", {"dag": cal.dag_id})  # the DAG quoted once, not per day
    for i, d in enumerate(cal.every_day()):
        if i % 7 == 0:
            weeks.append([])
            months.append("")
        n = d.runs
        said = ", ".join(f"{k} {s.lower()}" for s, k in sorted(d.states.items()))
        title = f"{d.day}: {n} run{'s' if n != 1 else ''}" + (f" ({said})" if said else "")
        href = f"{runs_of}&from={d.day}&to={d.day}"  # a date (YYYY-MM-DD): nothing to quote
        weeks[-1].append(DayShown(d.day, d.status, title, href))
        day = date.fromisoformat(d.day)
        # The first week is named for its month unless a new month starts within two weeks
        # (the two names would overlap).
        if day.day == 1 or (i == 0 and day.day + 14 <= _month_days(day)):
            months[-1] = f"{day:%b}"
    while len(weeks[-1]) < 7:
        weeks[-1].append(None)  # after today
    total = sum(d.runs for d in cal.days.values())
    return {
        "weeks": weeks,
        "months": months,
        "start": cal.start.isoformat(),
        "end": cal.end.isoformat(),
        "total": total,
        "active": len(cal.days),
        "week_of": [(cal.start + timedelta(weeks=i)).isoformat() for i in range(len(weeks))],
    }


def _month_days(day: date) -> int:
    first_of_next = (day.replace(day=28) + timedelta(days=4)).replace(day=1)
    return (first_of_next - timedelta(days=1)).day


# -- params ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParamsShown:
    """A DAG's params as its page lists them: (name, type, default) each, or why not."""

    items: list[tuple[str, str, str]]
    model: str = ""  # a pydantic model's name; "": a dict of defaults
    error: str = ""


# file, its mtime as the catalogue last parsed it, dag_id -> what its params are: a file
# is imported once per version of it, not once per view.
_PARAMS: dict[tuple[str, float, str], ParamsShown] = {}


async def params_shown(
    dag: DagRow | None, mtime: float | None, timeout: float
) -> ParamsShown | None:
    """The params of a catalogued DAG whose file parses; None otherwise (nothing to say).

    The catalogue stores no params, so the file is imported as the trigger button imports
    it (:func:`slotless.trigger.import_dag`: in a thread, never on the loop, bounded by
    ``timeout``), once per version of the file."""
    if dag is None or dag.parse_error:
        return None
    key = (dag.file, mtime, dag.dag_id) if mtime is not None else None
    if key is not None and key in _PARAMS:
        return _PARAMS[key]
    try:
        loaded = await import_dag(dag.file, dag.dag_id, timeout)
    except DagImportError as exc:
        shown = ParamsShown([], error=str(exc).splitlines()[0][:300])
    except Exception as exc:
        shown = ParamsShown([], error=f"{type(exc).__name__}: {str(exc)[:300]}")
    else:
        shown = describe_params(loaded.params)
    if key is not None:
        if len(_PARAMS) > 1000:  # files come and go: never an unbounded cache
            _PARAMS.clear()
        _PARAMS[key] = shown
    return shown


def describe_params(params: object) -> ParamsShown:
    if params is None:
        return ParamsShown([])
    if isinstance(params, type) and issubclass(params, BaseModel):
        items = []
        for name, f in params.model_fields.items():
            kind = getattr(f.annotation, "__name__", None) or str(f.annotation)
            default = (
                "required" if f.is_required() else _json(f.get_default(call_default_factory=True))
            )
            items.append((name, kind, default))
        return ParamsShown(items, model=params.__name__)
    if isinstance(params, Mapping):
        return ParamsShown([(str(k), type(v).__name__, _json(v)) for k, v in params.items()])
    return ParamsShown([], error=f"params of an unknown kind: {type(params).__name__}")


def _json(value: object) -> str:
    try:
        return json.dumps(value)[:200]
    except (TypeError, ValueError):
        return repr(value)[:200]
