"""Declaring DAGs in Python: tasks, their parents, retries, trigger rules, fan-out, branches,
task groups."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from triggers.base import BaseTrigger
from triggers.people import NEEDS_ANSWER, PersonWait
from triggers.registry import TriggerLoadError, is_allowed

from .assets import Asset, Condition, assets_of, check_declaration
from .context import TaskContext
from .durations import Duration, seconds
from .errors import DagError as DagError  # authors import it from here too
from .mapping import MapSpec, Source
from .notifications import (
    ALERT_EVENTS,
    BACKOFF_BASE,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    BadHook,
    Callback,
    Hooks,
    NotifySpec,
)
from .params import Params, check_declared
from .pools import PoolError, check_name
from .rules import TriggerRule
from .runpolicy import RunPolicy, failure_policy, time_of_day, timeout_seconds
from .schedules import Schedule
from .templating import (
    START_NAMES,
    TASK_NAMES,
    Scope,
    check_fields,
    declared_templates,
    render_trigger,
)

DEFAULT_MAP_CAP = 50_000
DEFAULT_SENSOR_TIMEOUT = 12 * 3600.0  # seed 000: 12 h by default, 14 h for files known to be late
SensorMode = Literal["poke", "reschedule", "deferrable"]

# Rules under which RUN implies every parent is done: a mapped task expands once, so it
# must not start before all of its parents ended.
_MAPPABLE_RULES = frozenset(
    {
        TriggerRule.ALL_SUCCESS,
        TriggerRule.ALL_DONE,
        TriggerRule.NONE_FAILED,
        TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
        TriggerRule.NONE_SKIPPED,
    }
)

# A task is called as fn(ctx), with keyword arguments when it has partial() or maps over them.
TaskFn = Callable[..., Any]


@dataclass(frozen=True)
class SensorSpec:
    """How a sensor waits for its trigger's condition.

    ``poke`` holds a worker slot and sleeps between checks; ``reschedule`` frees the slot
    between checks (state SENSING); ``deferrable`` hands the wait to the triggerer
    (state DEFERRED). All three run the same trigger code.
    """

    trigger: BaseTrigger
    mode: SensorMode = "deferrable"
    timeout: float = DEFAULT_SENSOR_TIMEOUT
    soft_fail: bool = False
    poke_interval: float | None = None
    # A time of day (HH:MM:SS, the DAG's clock) by which the condition should have held:
    # past it a "late" notice goes out once and the sensor keeps waiting (runpolicy.py).
    expected_by: str | None = None

    @property
    def interval(self) -> float:
        return self.poke_interval or self.trigger.poke_interval


def deployment_map_cap() -> int:
    return int(os.environ.get("SLOTLESS_MAX_MAP", DEFAULT_MAP_CAP))


@dataclass(eq=False)
class TaskSpec:
    """One task of a DAG, built with :meth:`DAG.task`; ``a >> b`` makes ``a`` a parent of ``b``."""

    dag: DAG
    task_id: str
    fn: TaskFn | None
    parents: list[str] = field(default_factory=list)
    retries: int = 0
    retry_delay: float = 1.0
    retry_backoff: float = 2.0
    max_retry_delay: float = 3600.0
    retry_jitter: float = 0.1
    execution_timeout: float | None = None
    trigger_rule: TriggerRule = TriggerRule.ALL_SUCCESS
    priority: int = 0
    # What it maps over (executor/mapping.py); a member of a mapped group maps over the
    # group's list (DAG.map_spec adds the group's wiring).
    mapping: MapSpec | None = None
    map_cap: int | None = None
    # partial(x=1): keyword arguments every call gets; expand(...) / expand_kwargs(...)
    # add each instance's own.
    fixed: dict[str, Any] = field(default_factory=dict)
    group: TaskGroup | None = None
    branch: bool = False
    sensor: SensorSpec | None = None
    methods: dict[str, Callable[..., Any]] = field(default_factory=dict)
    # The pool (executor/pools.py) whose slots it holds while RUNNING, and the
    # queue of the workers that may run it.
    pool: str = "default"
    pool_slots: int = 1
    queue: str = "default"
    # on_failure / on_retry / on_success / on_sensor_timeout and notify= (the DAG's are
    # the defaults): executor/notifications.py
    hooks: Hooks = field(default_factory=Hooks)
    # Setup and teardown (Airflow 3's): a teardown runs once its parents ended whatever
    # happened, provided one of its setups succeeded (rules.ALL_DONE_SETUP_SUCCESS); its
    # failure fails the run only with on_failure_fail_run (rules.leaf_kinds).
    setup: bool = False
    teardown: bool = False
    on_failure_fail_run: bool = False
    # templates= as declared: rendered per attempt into ctx.templates (executor/templating.py)
    templates: dict[str, Any] = field(default_factory=dict)
    # The assets its SUCCESS updates: an asset event each, in the same transaction.
    outlets: tuple[Asset, ...] = ()

    def method(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn`` as a resume point for ``ctx.defer(..., method=fn.__name__)``."""
        self.methods[fn.__name__] = functools.partial(_resume, self, fn)
        return fn

    def __rshift__(self, other: Downstream) -> Any:
        for child in _tasks_of(other, "roots"):
            if self.task_id not in child.parents:
                child.parents.append(self.task_id)
        return other

    def __rrshift__(self, others: Sequence[TaskSpec | TaskGroup]) -> TaskSpec:
        for parent in others:
            parent >> self
        return self

    def __call__(self, ctx: TaskContext) -> Any:
        if self.fn is None:
            raise TypeError(f"{self.task_id} is a sensor; it has no callable")
        return self.fn(ctx, **self.arguments(ctx))

    def arguments(self, ctx: TaskContext) -> dict[str, Any]:
        """The keyword arguments of this call: ``partial``'s, and a mapped instance's own
        under ``expand(a=..., b=...)`` or ``expand_kwargs`` (a member of a mapped group
        sees its group's item and its parents' outputs for its index first)."""
        if self.group is not None and self.group.mapped is not None and ctx.map_index >= 0:
            _group_view(ctx)
        if self.mapping is None or self.mapping.kind == "items" or ctx.map_index < 0:
            return self.fixed
        if not isinstance(ctx.item, dict):
            raise TypeError(f"{self.task_id}: mapped item {ctx.item!r} is not a dict of arguments")
        return {**self.fixed, **ctx.item}

    def partial(self, **fixed: Any) -> TaskSpec:
        """Keyword arguments every call of the task gets (``fn(ctx, **fixed)``), mapped or
        not: ``load.partial(table="t").expand(path=list_files)``."""
        self.fixed.update(fixed)
        return self

    def expand(self, **lists: TaskSpec | Sequence[Any]) -> TaskSpec:
        """Map the task over the cross product of the named lists (each a literal list or an
        upstream task whose output is a list): one instance per combination, called as
        ``fn(ctx, **partial, name=element, ...)``; ``ctx.item`` is that dict."""
        if not lists:
            raise DagError(f"task {self.task_id!r}: expand() needs at least one list")
        over = tuple(
            (name, _source(self.task_id, f"expand({name}=...)", v)) for name, v in lists.items()
        )
        return self._mapped(MapSpec("product", over))

    def expand_kwargs(self, dicts: TaskSpec | Sequence[dict[str, Any]]) -> TaskSpec:
        """Map the task over a list of dicts (literal, or an upstream task's output): one
        instance per dict, called as ``fn(ctx, **partial, **the_dict)``."""
        source = _source(self.task_id, "expand_kwargs", dicts)
        for i, d in enumerate(source.values or ()):
            if not isinstance(d, dict) or not all(isinstance(k, str) for k in d):
                raise DagError(
                    f"task {self.task_id!r}: expand_kwargs item {i} is not a dict of "
                    f"keyword arguments: {d!r}"
                )
        return self._mapped(MapSpec("kwargs", (("", source),)))

    def _mapped(self, spec: MapSpec) -> TaskSpec:
        if self.mapping is not None:
            raise DagError(f"task {self.task_id!r} is mapped already")
        if self.setup or self.teardown:
            role = "setup" if self.setup else "teardown"
            raise DagError(f"task {self.task_id!r}: a {role} task cannot be mapped")
        _check_mappable(self.task_id, self.trigger_rule, self.branch, self.group)
        for task in spec.tasks:
            if task not in self.parents:
                self.parents.append(task)
        self.mapping = spec
        return self

    @property
    def map_source(self) -> str | None:
        """The upstream task a mapped instance's item is cut from when it is a single list's
        element (its ``ctx.inputs`` leave that list out), else None."""
        if self.mapping is None or not self.mapping.legacy:
            return None
        return self.mapping.over[0][1].task

    def effective_map_cap(self) -> int | None:
        if self.mapping is None:
            return None
        if self.map_cap is not None:
            return self.map_cap
        mapped = self.group.mapped if self.group is not None else None
        if mapped is not None and mapped.map_cap is not None:
            return mapped.map_cap
        return deployment_map_cap()

    def retry_delay_for(self, attempt: int, rand: float) -> float:
        """Delay before the attempt after ``attempt``: exponential backoff with jitter.

        ``rand`` is uniform in [0, 1); the delay is scaled by a factor in
        [1 - jitter, 1 + jitter] so that retries of many tasks do not arrive together.
        """
        base = min(self.max_retry_delay, self.retry_delay * self.retry_backoff ** (attempt - 1))
        return max(0.0, base * (1 + self.retry_jitter * (2 * rand - 1)))


class TaskGroup:
    """Tasks declared under ``with dag.group("extract"):``, their ids prefixed
    (``extract.load``); groups nest (``extract.s3.load``).

    ``g1 >> g2`` puts every leaf of ``g1`` (a task of it no task of it depends on) before
    every root of ``g2`` (a task of it depending on no task of it); ``task >> g`` and
    ``g >> task`` likewise, and ``parents=[g]`` names its leaves. Given ``expand=`` (a list,
    or an upstream task whose output is one) the group is mapped: each of its tasks runs
    once per item, ``ctx.item`` being the item, and instance ``i`` of a task waits for
    instance ``i`` of its parents in the group (whose outputs it sees in ``ctx.inputs``).
    """

    def __init__(
        self,
        dag: DAG,
        group_id: str,
        parent: TaskGroup | None,
        over: Source | None,
        map_cap: int | None,
    ) -> None:
        self.dag = dag
        self.group_id = group_id
        self.parent = parent
        self.over = over
        self.map_cap = map_cap
        self.members: list[str] = []  # its own tasks' ids, in declaration order
        self.children: list[TaskGroup] = []

    @property
    def mapped(self) -> TaskGroup | None:
        """The mapped group this group is, or is inside of (None: not mapped)."""
        group: TaskGroup | None = self
        while group is not None and group.over is None:
            group = group.parent
        return group

    def task_ids(self) -> list[str]:
        """Every task in it, its subgroups' included."""
        inside = {*self.members, *(t for g in self.children for t in g.task_ids())}
        return [t for t in self.dag.tasks if t in inside]  # in declaration order

    def roots(self) -> list[TaskSpec]:
        inside = set(self.task_ids())
        tasks = [self.dag.tasks[t] for t in self.task_ids()]
        return [t for t in tasks if not inside.intersection(t.parents)]

    def leaves(self) -> list[TaskSpec]:
        inside = set(self.task_ids())
        has_child = {p for t in inside for p in self.dag.tasks[t].parents if p in inside}
        return [self.dag.tasks[t] for t in self.task_ids() if t not in has_child]

    def __enter__(self) -> TaskGroup:
        self.dag._groups_open.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.dag._groups_open.pop()

    def __rshift__(self, other: Downstream) -> Any:
        for leaf in self.leaves():
            leaf >> other
        return other

    def __rrshift__(self, others: Sequence[TaskSpec | TaskGroup]) -> TaskGroup:
        for parent in others:
            parent >> self
        return self

    def __repr__(self) -> str:
        return f"TaskGroup({self.group_id!r})"


ParentRef = str | TaskSpec | TaskGroup
Downstream = TaskSpec | TaskGroup | Sequence[TaskSpec | TaskGroup]


class DAG:
    """A named set of tasks and the edges between them.

    >>> dag = DAG("example")
    >>> @dag.task
    ... def extract(ctx): return [1, 2, 3]
    >>> @dag.task(parents=[extract])
    ... def load(ctx): return sum(ctx.inputs["extract"])
    """

    def __init__(
        self,
        dag_id: str,
        *,
        description: str = "",
        schedule: str | timedelta | Condition | Sequence[Asset] | None = None,
        start_date: datetime | date | None = None,
        end_date: datetime | date | None = None,
        timezone: str = "UTC",
        catchup: bool = False,
        max_active_runs: int = 16,
        params: Params = None,
        start_when: BaseTrigger | None = None,
        deadline: str | time | None = None,
        dagrun_timeout: Duration | None = None,
        on_task_failure: str = "continue",
        on_failure: Callback | None = None,
        on_retry: Callback | None = None,
        on_success: Callback | None = None,
        on_sensor_timeout: Callback | None = None,
        on_run_failure: Callback | None = None,
        on_run_success: Callback | None = None,
        notify: NotifySpec = None,
        callback_timeout: Duration = DEFAULT_TIMEOUT,
        callback_retries: int = DEFAULT_RETRIES,
        callback_retry_delay: Duration = BACKOFF_BASE,
    ) -> None:
        if not dag_id or not dag_id.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise DagError(f"invalid DAG id {dag_id!r}: use letters, digits, _ - .")
        self.dag_id = dag_id
        self.description = description
        # Defaults (a dict) or a pydantic model class; ctx.params is these with the run's conf.
        try:
            check_declared(params)
        except TypeError as exc:
            raise DagError(f"DAG {dag_id!r}: {exc}") from None
        self.params: Params = params
        # Assets as a schedule (executor/assets.py): runs start when the condition holds,
        # in the transaction of the event that completes it (executor/store/assets.py).
        self.asset_schedule: Condition | None = check_declaration(f"DAG {dag_id!r}", schedule)
        if self.asset_schedule is not None:
            _check_watchers(dag_id, assets_of(self.asset_schedule))
        timed = None if self.asset_schedule is not None else schedule
        assert timed is None or isinstance(timed, str | timedelta), "as_condition took lists"
        # When runs are due, catchup included (executor/schedules.py, docs/scheduling.md);
        # the triggerer starts them (executor/store/starts.py).
        self.schedule: Schedule | None = _schedule(
            dag_id, timed, start_date, end_date, timezone, catchup, max_active_runs
        )
        self.timezone = timezone
        self.max_active_runs = max_active_runs
        # A trigger whose event starts a run (its string fields may use {{ ds }}).
        self.start_when = _start_when(dag_id, start_when)
        # When its runs must have ended, how long they may run, what a failed task does
        # to them (executor/runpolicy.py; held by the triggerer: executor/runwaits.py).
        self.policy = _policy(dag_id, deadline, dagrun_timeout, on_task_failure, timezone)
        # Callbacks and notify= URLs: the tasks' defaults and the run's own (docs/dag-patterns.md).
        self.hooks = _hooks(
            f"DAG {dag_id!r}",
            {
                "on_failure": on_failure,
                "on_retry": on_retry,
                "on_success": on_success,
                "on_sensor_timeout": on_sensor_timeout,
                "on_run_failure": on_run_failure,
                "on_run_success": on_run_success,
            },
            notify,
        )
        # Each handler's bound, and how often a failed one is tried again (doubling delay).
        self.callback_timeout = seconds(callback_timeout) or DEFAULT_TIMEOUT
        if callback_retries < 0:
            raise DagError(f"DAG {dag_id!r}: callback_retries must be >= 0")
        self.callback_retries = callback_retries
        self.callback_retry_delay = seconds(callback_retry_delay) or 0.0
        self.tasks: dict[str, TaskSpec] = {}
        # Task groups by full id (``extract.s3``), and those whose ``with`` block is open.
        self.groups: dict[str, TaskGroup] = {}
        self._groups_open: list[TaskGroup] = []
        self._consumers: tuple[int, dict[str, list[TaskSpec]]] | None = None

    @property
    def catchup(self) -> bool:
        """``catchup=`` as declared: it lives on the schedule (none: nothing to catch up)."""
        return self.schedule is not None and self.schedule.catchup

    def task(
        self,
        fn: TaskFn | None = None,
        *,
        task_id: str | None = None,
        parents: Iterable[ParentRef] = (),
        retries: int = 0,
        retry_delay: Duration = 1.0,
        retry_backoff: float = 2.0,
        max_retry_delay: Duration = 3600.0,
        retry_jitter: float = 0.1,
        execution_timeout: Duration | None = None,
        trigger_rule: TriggerRule | str = TriggerRule.ALL_SUCCESS,
        priority: int = 0,
        expand: ParentRef | Sequence[Any] | None = None,
        map_cap: int | None = None,
        branch: bool = False,
        sensor: SensorSpec | None = None,
        pool: str = "default",
        pool_slots: int = 1,
        queue: str = "default",
        on_failure: Callback | None = None,
        on_retry: Callback | None = None,
        on_success: Callback | None = None,
        on_sensor_timeout: Callback | None = None,
        notify: NotifySpec = None,
        setup: bool = False,
        teardown: bool = False,
        teardown_of: Iterable[ParentRef] = (),
        on_failure_fail_run: bool = False,
        templates: dict[str, Any] | None = None,
        outlets: Iterable[Asset] = (),
    ) -> Any:
        """Declare a task; usable as ``@dag.task`` or ``@dag.task(parents=[...], retries=3)``.

        ``setup=True`` makes a setup task, ``teardown_of=[setup_task]`` (or
        ``teardown=True``) a teardown: it runs once its parents ended however they ended,
        provided one of its setups succeeded, is skipped when they were skipped, and its
        failure does not fail the run unless ``on_failure_fail_run=True``
        (docs/dag-patterns.md, "Setup and teardown"). ``teardown_of`` makes those tasks
        its parents and marks them setups.

        ``expand=upstream`` runs one instance per item of ``upstream``'s output (a list),
        ``expand=[...]`` one per item of a literal list (``ctx.item``); ``.partial(...)``,
        ``.expand(a=..., b=...)`` (cross product) and ``.expand_kwargs(...)`` on the task
        map it over keyword arguments (docs/dag-patterns.md). Declared inside
        ``with dag.group("g"):`` its id is ``g.<name>``.
        ``branch=True`` makes the task's return value (a child id or list of ids) choose which
        children run; the others end SKIPPED. ``pool="warehouse", pool_slots=1`` holds that
        many of the pool's slots while RUNNING (``slotless pools set``); ``queue="gpu"`` runs
        it only on workers serving that queue (``slotless worker --queues gpu``).
        ``on_failure=fn`` (and on_retry, on_success, on_sensor_timeout) runs ``fn(ctx)`` in a
        worker slot when that happens, and ``notify=`` sends to apprise URLs
        (executor/notifications.py); unset, the DAG's apply. ``templates={"path":
        "s3://b/{{ ds }}/x"}`` is rendered per attempt into ``ctx.templates`` (Airflow's
        ``templates_dict``; docs/templates.md). ``outlets=[Asset(...)]``: its
        SUCCESS records an event of each (executor/assets.py), which may start the DAGs
        scheduled on them.
        """

        def register(f: TaskFn | None) -> TaskSpec:
            name = task_id or str(getattr(f, "__name__", ""))
            group = self._groups_open[-1] if self._groups_open else None
            tid = f"{group.group_id}.{name}" if group is not None else name
            if not name or name.startswith("{"):
                raise DagError(f"invalid task id {name!r} in DAG {self.dag_id!r}")
            if tid in self.tasks:
                raise DagError(f"duplicate task id {tid!r} in DAG {self.dag_id!r}")
            try:
                rule = TriggerRule(trigger_rule)
            except ValueError:
                known = ", ".join(r.value for r in TriggerRule)
                raise DagError(
                    f"task {tid!r}: unknown trigger rule {trigger_rule!r} (known: {known})"
                ) from None
            if retries < 0:
                raise DagError(f"task {tid!r}: retries must be >= 0")
            # A parent named twice is one edge (else n_parents counts an edge never bumped).
            parent_ids = list(dict.fromkeys(p for ref in parents for p in _refs(ref)))
            mapping = None
            if expand is not None:
                if isinstance(expand, TaskSpec):
                    source = Source(task=expand.task_id)
                elif isinstance(expand, str):
                    source = Source(task=expand)
                elif isinstance(expand, list | tuple):
                    source = _source(tid, "expand", expand)
                else:
                    raise DagError(f"task {tid!r}: expand= takes a task or a list, not {expand!r}")
                mapping = MapSpec("items", (("", source),))
                _check_mappable(tid, rule, branch, group)
                if source.task is not None and source.task not in parent_ids:
                    parent_ids.append(source.task)
            elif group is not None and group.mapped is not None:
                if sensor is not None:
                    raise DagError(f"task {tid!r}: a mapped group cannot hold a sensor (yet)")
                if branch:
                    raise DagError(f"task {tid!r}: a mapped group cannot hold a branch")
                over = group.mapped.over
                assert over is not None
                mapping = MapSpec("items", (("", over),), group=group.mapped.group_id)
            if map_cap is not None and map_cap < 0:
                raise DagError(f"task {tid!r}: map_cap must be >= 0")
            setups = [self._setup_of(tid, s) for s in teardown_of]
            is_teardown = teardown or bool(setups)
            _check_role(tid, setup, is_teardown, on_failure_fail_run, mapping is not None)
            if is_teardown:
                rule = TriggerRule.ALL_DONE_SETUP_SUCCESS
                parent_ids += [s.task_id for s in setups if s.task_id not in parent_ids]
            _check_pool(tid, pool, pool_slots, queue)
            outs = _outlets(self.dag_id, tid, outlets)
            hooks = _hooks(
                f"task {tid!r}",
                {
                    "on_failure": on_failure,
                    "on_retry": on_retry,
                    "on_success": on_success,
                    "on_sensor_timeout": on_sensor_timeout,
                },
                notify,
            )
            rendered_later = declared_templates(templates, f"DAG {self.dag_id!r}: task {tid!r}")
            spec = TaskSpec(
                dag=self,
                task_id=tid,
                fn=f,
                templates=rendered_later,
                parents=parent_ids,
                retries=retries,
                retry_delay=seconds(retry_delay) or 0.0,
                retry_backoff=retry_backoff,
                max_retry_delay=seconds(max_retry_delay) or 0.0,
                retry_jitter=retry_jitter,
                execution_timeout=seconds(execution_timeout),
                trigger_rule=rule,
                priority=priority,
                mapping=mapping,
                map_cap=map_cap,
                group=group,
                branch=branch,
                sensor=sensor,
                pool=pool,
                pool_slots=pool_slots,
                queue=queue,
                hooks=hooks,
                setup=setup,
                teardown=is_teardown,
                on_failure_fail_run=on_failure_fail_run,
                outlets=outs,
            )
            for s in setups:
                s.setup = True  # as Airflow's as_teardown(setups=...) marks them
            self.tasks[tid] = spec
            if group is not None:
                group.members.append(tid)
            return spec

        return register(fn) if fn is not None or sensor is not None else register

    def sensor(
        self,
        task_id: str,
        trigger: BaseTrigger,
        *,
        mode: SensorMode = "deferrable",
        timeout: Duration = DEFAULT_SENSOR_TIMEOUT,
        soft_fail: bool = False,
        poke_interval: Duration | None = None,
        expected_by: str | time | None = None,
        **options: Any,
    ) -> TaskSpec:
        """A task that waits until ``trigger``'s condition holds; its output is the event.

        String fields of the trigger (at any depth) are Jinja2 templates with Airflow's
        names and macros (``{{ macros.ds_add(ds, -1) }}``: docs/templates.md), rendered
        per run; their syntax and names are checked here.
        After ``timeout`` the sensor fails with "sensor timeout", or ends SKIPPED if
        ``soft_fail``. With ``expected_by="05:30"`` (a time of day on the DAG's clock, from
        the run's logical date: executor/runpolicy.py), a "late" notice goes out once if
        the condition has not held by then; the sensor keeps waiting until ``timeout``.
        """
        if mode not in ("poke", "reschedule", "deferrable"):
            raise DagError(f"sensor {task_id!r}: unknown mode {mode!r}")
        check_fields(trigger.templates(), TASK_NAMES, f"DAG {self.dag_id!r}: sensor {task_id!r}")
        if isinstance(trigger, PersonWait):
            if mode != "deferrable":  # a person answers: there is nothing for a slot to check
                raise DagError(
                    f"sensor {task_id!r}: a person's wait is deferrable only, not {mode!r}"
                )
            options["notify"] = _with_needs_answer(options.get("notify"), trigger.notify)
        if mode != "deferrable" and trigger.event_wait() is not None:
            # An event is pushed, never polled: there is nothing for a slot to check.
            raise DagError(f"sensor {task_id!r}: an event wait is deferrable only, not {mode!r}")
        try:
            late = None if expected_by is None else time_of_day("expected_by", expected_by)
            timeout_s = seconds(timeout) or 0.0
        except ValueError as exc:
            raise DagError(f"DAG {self.dag_id!r}: sensor {task_id!r}: {exc}") from None
        spec = SensorSpec(
            trigger=trigger,
            mode=mode,
            timeout=timeout_s,
            soft_fail=soft_fail,
            poke_interval=seconds(poke_interval),
            expected_by=late,
        )
        return self.task(None, task_id=task_id, sensor=spec, **options)

    def group(
        self,
        group_id: str,
        *,
        expand: TaskSpec | Sequence[Any] | None = None,
        map_cap: int | None = None,
    ) -> TaskGroup:
        """A task group: ``with dag.group("extract") as g:`` declares ``extract.<task>``.

        ``expand=`` (a literal list, or an upstream task whose output is a list) maps the
        group: each of its tasks runs once per item (``ctx.item``), instance ``i`` after
        instance ``i`` of its parents in the group. ``map_cap`` bounds the items (default
        the deployment's ``SLOTLESS_MAX_MAP``). A mapped group cannot be inside another.
        """
        parent = self._groups_open[-1] if self._groups_open else None
        if not group_id or not group_id.replace("_", "").replace("-", "").isalnum():
            raise DagError(f"invalid group id {group_id!r}: use letters, digits, _ -")
        full = f"{parent.group_id}.{group_id}" if parent is not None else group_id
        if full in self.groups:
            raise DagError(f"duplicate group id {full!r} in DAG {self.dag_id!r}")
        over = None
        if expand is not None:
            if parent is not None and parent.mapped is not None:
                raise DagError(
                    f"group {full!r}: a mapped group cannot be inside another mapped group "
                    f"({parent.mapped.group_id})"
                )
            if isinstance(expand, TaskSpec):
                over = Source(task=expand.task_id)
            elif isinstance(expand, list | tuple):
                over = _source(full, "expand", expand)
            else:
                raise DagError(f"group {full!r}: expand= takes a task or a list, not {expand!r}")
        if map_cap is not None and (expand is None or map_cap < 0):
            raise DagError(f"group {full!r}: map_cap needs expand= and must be >= 0")
        group = TaskGroup(self, full, parent, over, map_cap)
        self.groups[full] = group
        if parent is not None:
            parent.children.append(group)
        return group

    def map_spec(self, task_id: str) -> MapSpec | None:
        """What ``task_id`` maps over as its rows store it: a member of a mapped group gets
        the group's wiring (its parents in the group, its children there, and the parents
        outside it that every member's template waits for)."""
        return self.map_specs([task_id])[task_id]

    def map_specs(self, task_ids: Iterable[str] | None = None) -> dict[str, MapSpec | None]:
        """:meth:`map_spec` of many tasks (all by default), each mapped group read once."""
        wanted = list(self.tasks if task_ids is None else task_ids)
        out: dict[str, MapSpec | None] = {}
        wiring: dict[str, tuple[list[str], tuple[str, ...], dict[str, list[str]]]] = {}
        for task_id in wanted:
            spec = self.tasks[task_id]
            mapping = spec.mapping
            if mapping is None or mapping.group is None:
                out[task_id] = mapping
                continue
            if mapping.group not in wiring:
                wiring[mapping.group] = self._group_wiring(self.groups[mapping.group])
            members, needs, children = wiring[mapping.group]
            inside = set(members)
            out[task_id] = MapSpec(
                mapping.kind,
                mapping.over,
                group=mapping.group,
                after=tuple(p for p in spec.parents if p in inside),
                before=tuple(children.get(task_id, ())),
                needs=needs,
                rule=spec.trigger_rule.value,
            )
        return out

    def _group_wiring(
        self, group: TaskGroup
    ) -> tuple[list[str], tuple[str, ...], dict[str, list[str]]]:
        """A mapped group's tasks, the parents outside it (its upstream list's task too),
        and each task's children inside it."""
        members = group.task_ids()
        inside = set(members)
        needs: set[str] = set()
        children: dict[str, list[str]] = {}
        for t in members:
            for p in self.tasks[t].parents:
                if p in inside:
                    children.setdefault(p, []).append(t)
                else:
                    needs.add(p)
        if group.over is not None and group.over.task is not None:
            needs.add(group.over.task)
        return members, tuple(sorted(needs)), children

    def template_parents(self, task_id: str) -> list[str]:
        """The parents ``task_id``'s row waits for: its own, or for a member of a mapped
        group the group's parents outside it (its parents inside are waited for per
        instance)."""
        return _row_parents(self.tasks[task_id], self.map_spec(task_id))

    def _setup_of(self, tid: str, ref: ParentRef) -> TaskSpec:
        """A task ``teardown_of`` names: declared before, not a teardown, not mapped."""
        named = ", ".join(_refs(ref))
        found = self.tasks.get(named)
        if found is None:
            raise DagError(f"task {tid!r}: teardown_of names {named!r}, which is not "
                           "a task of this DAG (declare the setup first)")  # fmt: skip
        if found.teardown or found.mapping is not None:
            what = "a teardown" if found.teardown else "a mapped task"
            raise DagError(f"task {tid!r}: teardown_of names {found.task_id!r}, {what}")
        return found

    def children(self, task_id: str) -> list[str]:
        return [t.task_id for t in self.tasks.values() if task_id in t.parents]

    def mapped_consumers(self, task_id: str) -> list[TaskSpec]:
        """Tasks that expand over ``task_id``'s output (indexed once: workers ask per task)."""
        if self._consumers is None or self._consumers[0] != len(self.tasks):
            index: dict[str, list[TaskSpec]] = {}
            for t in self.tasks.values():
                for source in t.mapping.tasks if t.mapping is not None else ():
                    index.setdefault(source, []).append(t)
            self._consumers = (len(self.tasks), index)
        return self._consumers[1].get(task_id, [])

    def validate(self) -> None:
        """Raise :class:`DagError` for unknown parents, a cycle (naming it), or a deferrable
        sensor whose trigger class the triggerer would refuse."""
        for spec in self.tasks.values():
            if spec.sensor is not None and spec.sensor.mode == "deferrable":
                _check_deferrable(spec.task_id, spec.sensor.trigger)
            for parent in spec.parents:
                if parent not in self.tasks:
                    raise DagError(f"task {spec.task_id!r} has unknown parent {parent!r}")
                if parent == spec.task_id:
                    raise DagError(f"cycle: {parent} -> {parent}")
        cycle = find_cycle({t.task_id: t.parents for t in self.tasks.values()})
        if cycle:
            raise DagError("cycle: " + " -> ".join(cycle))
        for group in self.groups.values():
            if group.over is not None and group.over.task is not None:
                if group.over.task not in self.tasks:
                    raise DagError(f"group {group.group_id!r} maps over unknown task "
                                   f"{group.over.task!r}")  # fmt: skip
                if group.over.task in group.task_ids():
                    raise DagError(
                        f"group {group.group_id!r} maps over its own task {group.over.task!r}"
                    )
        # A mapped group's members wait, as rows, for the group's parents outside it: a
        # task outside that both follows one member and precedes another is a cycle there.
        specs = self.map_specs()
        cycle = find_cycle({t: _row_parents(s, specs[t]) for t, s in self.tasks.items()})
        if cycle:
            raise DagError("cycle through a mapped group: " + " -> ".join(cycle))


def _schedule(
    dag_id: str,
    spec: str | timedelta | None,
    start_date: datetime | date | None,
    end_date: datetime | date | None,
    timezone: str,
    catchup: bool,
    max_active_runs: int,
) -> Schedule | None:
    """The DAG's schedule, checked at declaration: a DagError names the DAG and the field."""
    if max_active_runs < 1:
        raise DagError(f"DAG {dag_id!r}: max_active_runs must be >= 1, not {max_active_runs}")
    try:
        if spec is None:
            # No schedule, but the dates and the zone are still checked.
            Schedule.parse("@daily", timezone=timezone, start_date=start_date, end_date=end_date)
            return None
        return Schedule.parse(
            spec, timezone=timezone, start_date=start_date, end_date=end_date, catchup=catchup
        )
    except ValueError as exc:
        raise DagError(f"DAG {dag_id!r}: {exc}") from None


def _with_needs_answer(notify: Any, urls: Sequence[str]) -> Any:
    """A person's wait tells ``urls`` when it begins (the ``needs_answer`` event), beside
    whatever ``notify=`` the task declares itself."""
    if not urls:
        return notify
    if notify is None:
        per_event: dict[str, Any] = {}
    elif isinstance(notify, str | list | tuple):
        listed = [notify] if isinstance(notify, str) else list(notify)
        per_event = dict.fromkeys(sorted(ALERT_EVENTS), listed)
    else:
        per_event = dict(notify)
    per_event[NEEDS_ANSWER] = list(urls)
    return per_event


def _policy(
    dag_id: str,
    deadline: str | time | None,
    dagrun_timeout: Duration | None,
    on_task_failure: str,
    timezone: str,
) -> RunPolicy:
    """The run policy, checked at declaration: a DagError names the DAG and the field."""
    try:
        return RunPolicy(
            on_task_failure=failure_policy(on_task_failure),
            deadline=None if deadline is None else time_of_day("deadline", deadline),
            dagrun_timeout=timeout_seconds(dagrun_timeout),
            timezone=timezone,
        )
    except ValueError as exc:
        raise DagError(f"DAG {dag_id!r}: {exc}") from None


def _start_when(dag_id: str, trigger: BaseTrigger | None) -> BaseTrigger | None:
    """The start condition, checked at declaration as the triggerer will load it."""
    if trigger is None:
        return None
    if not isinstance(trigger, BaseTrigger):
        raise DagError(f"DAG {dag_id!r}: start_when must be a trigger, not {trigger!r}")
    if trigger.event_wait() is not None:
        raise DagError(
            f"DAG {dag_id!r}: start_when cannot be an event wait (yet): start runs from "
            "another system with POST /api/v1/dags/{dag}/runs (docs/api.md)"
        )
    classpath = trigger.classpath()
    if not is_allowed(classpath):
        raise DagError(
            f"DAG {dag_id!r}: start_when trigger class {classpath} is not allow-listed "
            "(register it: docs/writing-triggers.md)"
        )
    check_fields(trigger.templates(), START_NAMES, f"DAG {dag_id!r}: start_when")
    try:  # rendered for a date as the triggerer will: a value its class refuses is found now
        render_trigger(trigger, Scope.for_date(dag_id, date(2000, 1, 1), ZoneInfo("UTC")))
    except (KeyError, ValueError, TriggerLoadError) as exc:
        raise DagError(f"DAG {dag_id!r}: start_when: {exc}") from None
    return trigger


def _outlets(dag_id: str, tid: str, outlets: Iterable[Asset]) -> tuple[Asset, ...]:
    outs = tuple(dict.fromkeys(outlets))
    bad = [o for o in outs if not isinstance(o, Asset)]
    if bad:
        raise DagError(f"DAG {dag_id!r}: task {tid!r}: outlets are assets, not {bad[0]!r}")
    _check_watchers(dag_id, outs)
    return outs


def _check_watchers(dag_id: str, assets: Iterable[Asset]) -> None:
    """An asset's watchers are held like start conditions: checked the same way."""
    for a in assets:
        for w in a.watchers:
            try:
                _start_when(dag_id, w)
            except DagError as exc:
                raise DagError(f"{exc} (a watcher of asset {a.uri})") from None


def _check_deferrable(task_id: str, trigger: BaseTrigger) -> None:
    """A deferrable sensor's trigger class must be one the triggerer loads: found when the
    DAG is checked, not by a task that falls back to rescheduling until its timeout. Checked
    here rather than in ``DAG.sensor``, so that a class registered after the declaration
    (``register`` further down the file) counts."""
    classpath = trigger.classpath()
    if not is_allowed(classpath):
        raise DagError(
            f"sensor {task_id!r}: trigger class {classpath} is not allow-listed, so it cannot "
            "defer: register it under the 'slotless.triggers' entry point or name it in "
            "SLOTLESS_ALLOWED_TRIGGERS (docs/writing-triggers.md), or give the sensor "
            "mode='reschedule'"
        )


def _check_role(tid: str, setup: bool, teardown: bool, fails_run: bool, mapped: bool) -> None:
    """A task's part in a setup/teardown pair, checked at declaration."""
    if setup and teardown:
        raise DagError(f"task {tid!r}: a task is a setup or a teardown, not both")
    if fails_run and not teardown:
        raise DagError(f"task {tid!r}: on_failure_fail_run is for a teardown (teardown_of=...)")
    if (setup or teardown) and mapped:
        role = "setup" if setup else "teardown"
        raise DagError(f"task {tid!r}: a {role} task cannot be mapped (expand=, a mapped group)")


def _check_pool(tid: str, pool: object, pool_slots: object, queue: object) -> None:
    """The names' spelling and the slot count, at declaration; whether the pool and the
    queue exist is the store's to say (executor/store/pools.py)."""
    try:
        check_name("pool", pool)
        check_name("queue", queue)
    except PoolError as exc:
        raise DagError(f"task {tid!r}: {exc}") from None
    if not isinstance(pool_slots, int) or isinstance(pool_slots, bool) or pool_slots < 1:
        raise DagError(f"task {tid!r}: pool_slots must be a whole number >= 1, not {pool_slots!r}")


def _hooks(owner: str, callbacks: dict[str, Callback | None], notify: NotifySpec) -> Hooks:
    """Declared callbacks and notify= URLs, checked now: an invalid URL is named here."""
    try:
        return Hooks.declare(owner, callbacks, notify)
    except BadHook as exc:
        raise DagError(str(exc)) from None


def _row_parents(spec: TaskSpec, mapping: MapSpec | None) -> list[str]:
    if mapping is None or mapping.needs is None:
        return spec.parents
    return list(mapping.needs)


def _refs(p: ParentRef) -> list[str]:
    """The task ids a parent reference names: a group names its leaves."""
    if isinstance(p, TaskGroup):
        return [t.task_id for t in p.leaves()]
    return [p.task_id if isinstance(p, TaskSpec) else p]


def _tasks_of(other: Downstream, end: Literal["roots", "leaves"]) -> list[TaskSpec]:
    items = [other] if isinstance(other, TaskSpec | TaskGroup) else list(other)
    out: list[TaskSpec] = []
    for item in items:
        if isinstance(item, TaskGroup):
            out += item.roots() if end == "roots" else item.leaves()
        else:
            out.append(item)
    return out


def _source(owner: str, name: str, value: Any) -> Source:
    """A list to map over, as declared: an upstream task, or a literal list (checked now:
    it is stored in the DAG's shape as JSON)."""
    if isinstance(value, TaskSpec):
        return Source(task=value.task_id)
    if not isinstance(value, list | tuple):
        raise DagError(
            f"task {owner!r}: {name} takes a list or an upstream task, not {type(value).__name__}"
        )
    try:
        json.dumps(list(value), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DagError(f"task {owner!r}: {name}'s list cannot be stored as JSON: {exc}") from None
    return Source(values=tuple(value))


def _check_mappable(
    tid: str,
    rule: TriggerRule,
    branch: bool,
    group: TaskGroup | None,
) -> None:
    if rule not in _MAPPABLE_RULES:
        raise DagError(
            f"task {tid!r}: a mapped task cannot use trigger rule "
            f"{rule.value} (it must wait for all parents)"
        )
    if branch:
        # Each instance would skip what it did not choose, even what another chose.
        raise DagError(f"task {tid!r}: a mapped task cannot be a branch")
    if group is not None and group.mapped is not None:
        raise DagError(
            f"task {tid!r}: a task in mapped group {group.mapped.group_id!r} is mapped by it; "
            "it cannot be mapped again"
        )


def _group_view(ctx: TaskContext) -> None:
    """A mapped group's instance stores ``{"item": ..., "inputs": {...}}``: the group's
    item, and the outputs of its parents in the group for its index (written by the state
    machine when it becomes ready). Shown to the task as ``ctx.item`` and ``ctx.inputs``."""
    stored = ctx.item
    if isinstance(stored, dict) and "item" in stored and not getattr(ctx, "_grouped", False):
        ctx.item = stored["item"]
        ctx.inputs.update(stored.get("inputs") or {})
        ctx._grouped = True  # type: ignore[attr-defined]


def _resume(spec: TaskSpec, fn: Callable[..., Any], ctx: TaskContext, **kwargs: Any) -> Any:
    """A deferred task's resume point, called as the task is (its arguments included)."""
    return fn(ctx, **spec.arguments(ctx), **kwargs)


def find_cycle(parents: dict[str, list[str]]) -> list[str] | None:
    """A cycle as a closed path ``[a, b, c, a]`` (edges parent -> child), or None."""
    children: dict[str, list[str]] = {t: [] for t in parents}
    for child, ps in parents.items():
        for p in ps:
            children.setdefault(p, []).append(child)
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(children, white)
    for start in children:
        if color[start] != white:
            continue
        # Iterative DFS so that a 10,000-task chain does not hit the recursion limit.
        path: list[str] = [start]
        stack = [iter(children[start])]
        color[start] = grey
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                color[path.pop()] = black
                stack.pop()
            elif color[nxt] == grey:
                return [*path[path.index(nxt) :], nxt]
            elif color[nxt] == white:
                color[nxt] = grey
                path.append(nxt)
                stack.append(iter(children[nxt]))
    return None
