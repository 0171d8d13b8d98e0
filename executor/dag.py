"""Declaring DAGs in Python: tasks, their parents, retries, trigger rules, fan-out, branches."""

from __future__ import annotations

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

TaskFn = Callable[[TaskContext], Any]


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
    expand: str | None = None
    map_cap: int | None = None
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
        self.methods[fn.__name__] = fn
        return fn

    def __rshift__(self, other: TaskSpec | Sequence[TaskSpec]) -> Any:
        for child in [other] if isinstance(other, TaskSpec) else other:
            if self.task_id not in child.parents:
                child.parents.append(self.task_id)
        return other

    def __rrshift__(self, others: Sequence[TaskSpec]) -> TaskSpec:
        for parent in others:
            parent >> self
        return self

    def __call__(self, ctx: TaskContext) -> Any:
        if self.fn is None:
            raise TypeError(f"{self.task_id} is a sensor; it has no callable")
        return self.fn(ctx)

    def effective_map_cap(self) -> int | None:
        if self.expand is None:
            return None
        return self.map_cap if self.map_cap is not None else deployment_map_cap()

    def retry_delay_for(self, attempt: int, rand: float) -> float:
        """Delay before the attempt after ``attempt``: exponential backoff with jitter.

        ``rand`` is uniform in [0, 1); the delay is scaled by a factor in
        [1 - jitter, 1 + jitter] so that retries of many tasks do not arrive together.
        """
        base = min(self.max_retry_delay, self.retry_delay * self.retry_backoff ** (attempt - 1))
        return max(0.0, base * (1 + self.retry_jitter * (2 * rand - 1)))


ParentRef = str | TaskSpec


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
        expand: ParentRef | None = None,
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

        ``expand=upstream`` runs one instance per item of ``upstream``'s output (a list).
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
            tid = task_id or str(getattr(f, "__name__", ""))
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
            parent_ids = list(dict.fromkeys(_ref(p) for p in parents))
            source = _ref(expand) if expand is not None else None
            if source is not None:
                if source not in parent_ids:
                    parent_ids.append(source)
                if rule not in _MAPPABLE_RULES:
                    raise DagError(
                        f"task {tid!r}: a mapped task cannot use trigger rule "
                        f"{rule.value} (it must wait for all parents)"
                    )
                if branch:
                    # Each instance would skip what it did not choose, even what another chose.
                    raise DagError(f"task {tid!r}: a mapped task cannot be a branch")
            if map_cap is not None and map_cap < 0:
                raise DagError(f"task {tid!r}: map_cap must be >= 0")
            setups = [self._setup_of(tid, s) for s in teardown_of]
            is_teardown = teardown or bool(setups)
            _check_role(tid, setup, is_teardown, on_failure_fail_run, source)
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
                expand=source,
                map_cap=map_cap,
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

    def _setup_of(self, tid: str, ref: ParentRef) -> TaskSpec:
        """A task ``teardown_of`` names: declared before, not a teardown, not mapped."""
        found = self.tasks.get(_ref(ref))
        if found is None:
            raise DagError(f"task {tid!r}: teardown_of names {_ref(ref)!r}, which is not "
                           "a task of this DAG (declare the setup first)")  # fmt: skip
        if found.teardown or found.expand is not None:
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
                if t.expand is not None:
                    index.setdefault(t.expand, []).append(t)
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


def _check_role(tid: str, setup: bool, teardown: bool, fails_run: bool, source: str | None) -> None:
    """A task's part in a setup/teardown pair, checked at declaration."""
    if setup and teardown:
        raise DagError(f"task {tid!r}: a task is a setup or a teardown, not both")
    if fails_run and not teardown:
        raise DagError(f"task {tid!r}: on_failure_fail_run is for a teardown (teardown_of=...)")
    if (setup or teardown) and source is not None:
        role = "setup" if setup else "teardown"
        raise DagError(f"task {tid!r}: a {role} task cannot be mapped (expand=)")


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


def _ref(p: ParentRef) -> str:
    return p.task_id if isinstance(p, TaskSpec) else p


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
