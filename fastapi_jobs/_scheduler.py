"""The scheduler: the public class, made of the sides that do its work.

``Scheduler`` keeps the signatures and docstrings users see, and hands each call
to the side that does it: declaring (``_core.declarations``, the options in
``_job.JobOptions``), running (``_core.lifecycle``: one object per ``running()``),
operating (``_core.manual_runs``, ``_core.pauses``) and reading (``_core.reader``). The
integrations reach it through its seam (``seam_of``, ``_core.seam``), never its
private attributes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, overload

from ._backfill.results import BackfillResult
from ._backfill.runs import MAX_TICKS, Backfills, Progress
from ._checks import flag, seconds
from ._clock import Clock, SystemClock
from ._control import TriggeredRun
from ._core.declarations import add_job, add_observer, add_observers
from ._core.lifecycle import CurrentRun, Running, app_state
from ._core.manual_runs import Operator
from ._core.observers import Observers
from ._core.parts import AppLifespan, Parts, check_history, check_parts, connect
from ._core.pauses import Pauses
from ._core.reader import Reader
from ._core.runner import HISTORY
from ._core.seam import Seam
from ._dynamic.book import MAX_SCHEDULES, ScheduleBook, check_max_schedules
from ._dynamic.bounds import ScheduleBounds
from ._dynamic.sets import AppliedSchedules, ScheduleSpec
from ._dynamic.stored import ScheduleOptions, StoredSchedule
from ._errors import ConfigurationError, short
from ._job import Job, JobOptions, check_options
from ._logging import LIBRARY
from ._results import RunResult
from ._schedules import Cron, Every, Schedule
from ._status import ClusterView, Health, JobStatus, PauseState, RunRecord
from ._store import Capabilities, Instance, Store

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = ["AppLifespan", "Scheduler", "seam_of"]
F = TypeVar("F", bound=Callable[..., Any])


class Scheduler:
    """The registry of jobs, and the lifespan that runs them.

    Example:

    ```python
    # fragment: an app's main module, `resources` its own lifespan
    scheduler = Scheduler(lifespan=resources)

    @scheduler.every(hours=1)
    async def expire_sessions(ctx: JobContext) -> None: ...

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)  # status at /jobs
    ```

    Args:
        lifespan: the app's own lifespan, entered first; what it yields (the
            database engine, clients) is the state jobs get on
            ``ctx.state`` and requests on ``request.state``.
        logger: where runs are logged; each job logs to a child named after
            it. Default: the ``fastapi_jobs`` logger.
        shutdown_timeout: on shutdown, how long to wait for runs in flight
            (seconds or a timedelta) before cancelling them; None waits for
            as long as they take.
        store: where ticks are claimed when several instances run (see
            ``fastapi_jobs.stores.SQLAlchemyStore``): each tick of each job
            then runs on one instance only. Without one, nothing touches a
            database and every instance runs every job.
        clock: where time comes from; tests pass a `LoopClock`.
        history: the runs of each job this process keeps in memory (50 by default) for
            ``GET /jobs/{name}/runs`` (24 bytes each), 0 for none. Runs
            claimed in a store are in the store's history instead.
        observers: told about each run and each skipped tick (see
            `Observer`); more with `add_observer`.
        max_schedules: the most live schedules made at run time (100,000 by
            default; None for no bound). Each instance holds every one. A
            schedule past it is refused with `TooManySchedulesError`.
    """

    def __init__(
        self,
        *,
        lifespan: AppLifespan | None = None,
        logger: logging.Logger | None = None,
        shutdown_timeout: float | timedelta | None = 20.0,
        store: Store | None = None,
        clock: Clock | None = None,
        history: int = HISTORY,
        observers: Sequence[object] = (),
        max_schedules: int | None = MAX_SCHEDULES,
    ) -> None:
        if shutdown_timeout is not None:
            shutdown_timeout = seconds(
                "shutdown_timeout", shutdown_timeout, context="Scheduler(): ", allow_zero=True
            )
        check_parts(lifespan, logger, store, clock)
        history = check_history(history)
        max_schedules = check_max_schedules(max_schedules)
        logger = logger or logging.getLogger(LIBRARY)
        clock = clock or SystemClock()
        parts = self._parts = Parts(
            logger=logger,
            clock=clock,
            ticking=clock,
            store=None,
            capabilities=Capabilities.of(None),
            instance=Instance(),
            observers=Observers(logger),
            leases=None,
            history=history,
            shutdown_timeout=shutdown_timeout,
            app_lifespan=lifespan,
        )
        add_observers(parts, observers)
        self._pauses = pauses = Pauses(parts)
        self._current = CurrentRun()
        self._book = ScheduleBook(parts, self._current, pauses, max_schedules)
        # Jobs tick on the clock (with a store, shifted onto the database's).
        connect(parts, clock, store, pauses.apply, [("the stored schedules", self._book.sync)])
        # Every public call below takes one path: the seam, which the
        # integrations use too, over the sides that do the work.
        reader = Reader(parts, self._current, pauses)
        operator = Operator(parts, self._current, reader)
        backfills = Backfills(parts, self._current)
        self._seam = Seam(parts, self._current, reader, operator, pauses, self._book, backfills)
        self._router: APIRouter | None = None

    @property
    def logger(self) -> logging.Logger:
        """Where runs are logged (each job to a child named after it)."""
        return self._parts.logger

    @property
    def clock(self) -> Clock:
        """Where time comes from."""
        return self._parts.clock

    @property
    def store(self) -> Store | None:
        """Where ticks are claimed, or None."""
        return self._parts.store

    @property
    def instance(self) -> Instance:
        """This process as the store knows it (its id names it in runs and claims)."""
        return self._parts.instance

    @property
    def shutdown_timeout(self) -> float | None:
        """How long a stop waits for runs in flight (seconds; None: as long as they take)."""
        return self._parts.shutdown_timeout

    @shutdown_timeout.setter
    def shutdown_timeout(self, value: float | None) -> None:
        self._parts.shutdown_timeout = value

    # -- declaring jobs ---------------------------------------------------

    def add_job(
        self, func: Callable[..., Any], schedule: Schedule, **options: Unpack[JobOptions]
    ) -> Job:
        """Register ``func`` to run on ``schedule``; the decorators call this.

        ``timeout`` cancels a run that takes longer (recorded as
        ``timed_out``); ``run_on_startup`` also runs the job once when the
        scheduler starts (with a store: the current period's tick, once
        across instances). With a store, ``every_instance=True`` opts an
        idempotent job out of claims (it runs in every instance), and
        ``catch_up`` runs the latest tick missed during downtime once, if it
        is at most that old (default: missed ticks are skipped).

        ``retries`` tries a failed run again within its tick, after
        ``retry_backoff`` seconds, then twice that, and so on (with jitter),
        never past the job's next tick; a timed-out run counts as failed unless
        ``retry_timeouts=False``. ``paused=True`` declares the job paused: it
        runs only once an operator resumes it (`resume`).

        ``enqueue=`` (a `fastapi_jobs.queues.Handoff`, e.g. ``ArqTask``) makes a
        hand-off job: ``func`` returns the queue task's keyword arguments, and
        each run enqueues the task under the key ``"<job>@<tick>"``.
        """
        return add_job(self._parts, func, schedule, options, running=self._running)

    def every(
        self,
        _func: object = None,
        /,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        seconds: float = 0,
        offset: float | timedelta = 0,
        **options: Unpack[JobOptions],
    ) -> Callable[[F], F]:
        """Decorate a job that runs at a fixed interval (see `Every`).

        The arguments add up: ``every(hours=1, minutes=30)`` is 90 minutes.
        Ticks lie on a grid from the Unix epoch plus ``offset``, the same in
        every process and after every restart. The job's options are
        `add_job`'s.
        """
        check_options(options, "every")  # at once, as a keyword the signature lacked was
        if _func is not None:
            raise ConfigurationError(_every_positional(_func))
        schedule = Every(days=days, hours=hours, minutes=minutes, seconds=seconds, offset=offset)
        return self._decorator(schedule, options, "every")

    def cron(
        self, expr: str, *, tz: str | tzinfo = "UTC", **options: Unpack[JobOptions]
    ) -> Callable[[F], F]:
        """Decorate a job that runs on a cron expression in ``tz`` (see `Cron`);
        the job's options are `add_job`'s."""
        check_options(options, "cron")
        return self._decorator(Cron(expr, tz=tz), options, "cron")

    def add_observer(self, observer: object) -> None:
        """Tell ``observer`` about every run and skipped tick from now on: an
        object with some of `Observer`'s methods (plain ones are called in
        the job's task and must be quick; ``async def`` ones are queued). An
        observer that raises is logged; the job goes on."""
        add_observer(self._parts, observer)

    def _decorator(self, schedule: Schedule, options: JobOptions, where: str) -> Callable[[F], F]:
        def register(func: F) -> F:
            add_job(self._parts, func, schedule, options, running=self._running, where=where)
            return func  # unchanged, so tests can call it directly

        return register

    @property
    def jobs(self) -> Mapping[str, Job]:
        """The jobs, by name: declared ones, and those of the schedules made at run
        time that this instance runs (their `Job.task` names the task)."""
        return self._seam.jobs

    # -- running ----------------------------------------------------------

    @property
    def _running(self) -> bool:
        return self._current.running is not None

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[Mapping[str, Any]]:
        """The lifespan to give ``FastAPI(lifespan=...)`` (or Starlette).

        Enters the app's own lifespan, then starts the jobs with its state;
        on the way out, drains the jobs before the app's resources close.
        """
        async with app_state(self._parts.app_lifespan, app) as state, self.running(state):
            yield state

    @asynccontextmanager
    async def running(
        self, state: Mapping[str, Any] | None = None, *, ticking: bool = True
    ) -> AsyncIterator[None]:
        """Run the jobs for the duration of the ``async with`` block.

        What `lifespan` uses; use it directly outside an ASGI app. On
        exit: stop ticking at once, wait for runs in flight up to
        ``shutdown_timeout``, then cancel what remains and log each job cut.
        ``ticking=False`` starts everything but the schedules: jobs run only
        when triggered (what the CLI's ``run`` does).
        """
        if self._running:
            raise RuntimeError("this scheduler is already running")
        run = Running(
            self._parts,
            self._current,
            {} if state is None else state,
            ticking=ticking,
            forget_pauses=self._pauses.forget,
        )
        async with run.run():
            yield

    async def run_now(self, name: str, *, state: Mapping[str, Any] | None = None) -> RunResult:
        """Run one job once, now, and return how it ended.

        For tests and operators. The run is guarded and recorded like a
        scheduled one, retries included: what the job raises comes back on
        ``RunResult.error``, never raised. ``state`` defaults to the running
        app's state (empty when the scheduler is not running). No claim is
        made, so runs on other instances do not stop it.

        Raises `JobNotFoundError` for an unknown name, and
        `JobRunningError` if a run of the job is going in this process
        (or its tick is being claimed, or the thread of an earlier run has not
        returned). A cancellation of the caller cancels the run (its status's
        last outcome is ``cancelled``; no history entry) and goes on up.
        """
        return await self._seam.run_now(name, state)

    # -- operating --------------------------------------------------------

    async def trigger(self, name: str, *, wait: bool = False) -> TriggeredRun:
        """Run ``name`` now, in the running app, as its task runs a tick.

        With a store the run is claimed first, like a tick: it holds the job's
        lease, so no scheduled tick runs beside it on any instance, and of two
        triggers on two instances one runs and the other raises
        `JobRunningError` (saying where and since when). A paused job
        runs too: the operator asked. Returns once the run has started (with
        ``wait=True``, once it has ended: see `TriggeredRun.wait`).

        Raises `JobNotFoundError`, `JobRunningError`, and
        `StoreError` when the store cannot be reached (nothing ran).
        """
        return await self._seam.trigger(name, wait=wait)

    async def pause(self, name: str, *, until: datetime | None = None) -> PauseState:
        """Skip the ticks of ``name`` (counted as ``skipped.paused``) until
        `resume`, or until ``until`` (an aware datetime) for a maintenance
        window. With a store the pause holds for every instance from its next
        tick, and across restarts; without one, for this process. Pausing a
        paused job changes only its end. A run going is not stopped.
        """
        return await self._seam.pause(name, until)

    async def resume(self, name: str) -> PauseState:
        """Undo `pause` (and a declared ``paused=True``); the next tick runs.
        With a store, other instances learn it at their next heartbeat."""
        return await self._seam.resume(name)

    async def runs(self, name: str, *, limit: int = 20) -> list[RunRecord]:
        """The last ``limit`` runs of ``name``, newest first: with a store, of
        every instance (its claimed runs); else of this process (the last 50)."""
        return await self._seam.runs(name, limit)

    # -- schedules made at run time ----------------------------------------

    @overload
    def task(self, func: F, /) -> F: ...
    @overload
    def task(self, func: None = None, /, *, name: str | None = None) -> Callable[[F], F]: ...

    def task(self, func: Any = None, /, *, name: str | None = None) -> Any:
        """Register a function that schedules made at run time may name
        (`add_schedule`), by its name or ``name``: ``@scheduler.task()``.

        It takes the run's context first if it wants it (``ctx: JobContext``),
        then the schedule's arguments by keyword: ``async def report(ctx:
        JobContext, tenant: str) -> None``. Returned unchanged.
        """
        if func is not None:
            self._book.add_task(func, name)
            return func

        def register(func: F) -> F:
            self._book.add_task(func, name)
            return func

        return register

    @property
    def tasks(self) -> Mapping[str, Callable[..., Any]]:
        """The functions schedules may name, by name."""
        return {name: func for name, (func, _) in self._book.tasks.items()}

    async def add_schedule(
        self,
        name: str,
        task: str | Callable[..., Any],
        schedule: Schedule,
        *,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> StoredSchedule:
        """Make a schedule at run time: ``task`` (a function registered with
        `task`, or its name) runs on ``schedule`` (an `Every` or a `Cron` in a
        named zone) with ``kwargs`` (JSON values the function takes), as a job
        named ``name`` with the job's options (``timeout``, ``retries``,
        ``retry_backoff``, ``retry_timeouts``, ``paused``, ``catch_up``,
        ``every_instance``).

        With a store it is kept in the store (the scheduler must be running):
        every instance runs it from its next heartbeat on (this one at once),
        each tick once across them, and it is back after a restart. Without
        one it lives in this process.

        Raises `ConfigurationError` for anything the schedule cannot be (the
        task unknown, arguments it does not take or that are not JSON, a
        duplicate name or a declared job's), `StoreError` when the store
        could not make it (nothing changed), and `UnconfirmedError` when
        the store did not answer in time (it may have been made).
        """
        return await self._seam.add_schedule(name, task, schedule, kwargs, options)

    async def update_schedule(
        self,
        name: str,
        *,
        task: str | Callable[..., Any] | None = None,
        schedule: Schedule | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> StoredSchedule:
        """Change a schedule made at run time: what is given replaces what it
        had (``kwargs`` as a whole; each option given, that option), the rest
        stays. Once this returns, no instance claims a tick of it under the old
        spec; a run going under it ends as it would have. Raises
        `JobNotFoundError` for an unknown name, else as `add_schedule`."""
        return await self._seam.update_schedule(
            name, task=task, schedule=schedule, kwargs=kwargs, options=options
        )

    async def remove_schedule(self, name: str) -> None:
        """Remove a schedule made at run time: once this returns, no instance
        claims a tick of it; a run going ends as it would have. Raises
        `JobNotFoundError` for an unknown name, else as `add_schedule`."""
        await self._seam.remove_schedule(name)

    async def apply_schedules(
        self, group: str, schedules: Iterable[ScheduleSpec]
    ) -> AppliedSchedules:
        """Make the schedules of ``group`` (a tenant, a source) exactly
        ``schedules``, in one transaction: those missing are made, those whose
        task, schedule, kwargs or options differ are changed, the group's others
        are removed, the rest are left as they are (their versions kept). So
        the same set may be applied at every deploy::

            await scheduler.apply_schedules(
                "reports",
                [ScheduleSpec(f"report-{t}", "report", Cron("0 7 * * *"), kwargs={"tenant": t})
                 for t in tenants],
            )

        Once this returns, no instance claims a tick of a schedule it removed
        or changed under the old spec. Raises `ConfigurationError` for a
        schedule that cannot be (nothing applied), `NameTakenError` when a
        live schedule outside the group has one of the names,
        `TooManySchedulesError` past ``max_schedules``, and `StoreError` or
        `UnconfirmedError` as `add_schedule` does.
        """
        return await self._seam.apply_schedules(group, schedules)

    async def schedules(self) -> list[StoredSchedule]:
        """Every schedule made at run time, by name (with a store: as the store
        has it now, including those this instance cannot run: ``known=False``)."""
        return await self._seam.schedules()

    # -- backfills ----------------------------------------------------------

    async def backfill(
        self,
        name: str,
        since: datetime,
        until: datetime,
        *,
        max_ticks: int = MAX_TICKS,
        progress: Progress | None = None,
    ) -> BackfillResult:
        """Run job ``name`` once for every tick of its schedule from ``since`` to
        ``until`` (aware datetimes, both included, in the past), oldest first,
        one at a time, in the running scheduler; return how each tick went.

        Each run is the job's task's, as a trigger's is (``ctx.manual`` is
        True, ``ctx.tick`` the backfilled tick): a live tick that comes during
        it meets a run going (by default dropped as ``overlap``), and a live
        run going is waited for before the next tick. With a store each tick
        is claimed first: one that ran already (on any instance, as the
        store's history says) is skipped, a lease held elsewhere is waited for
        up to the store's lease, and two backfills of one range run each tick
        once. Without one, nothing is shared between processes.

        ``progress(number, count, tick)`` is told after each tick. Raises
        `ConfigurationError` for a range without a time zone, reversed, in
        the future or with more than ``max_ticks`` ticks, `JobNotFoundError`,
        `NotRunningError`, and `JobRunningError` while a backfill of the job
        goes.
        """
        return await self._seam.backfill(name, since, until, max_ticks, progress)

    # -- status -----------------------------------------------------------

    def status(self) -> list[JobStatus]:
        """A snapshot of every job's status in this process, in declaration order."""
        return self._seam.status()

    def job_status(self, name: str) -> JobStatus:
        """A snapshot of one job's status; `JobNotFoundError` if unknown."""
        return self._seam.job_status(name)

    async def cluster(self) -> ClusterView | None:
        """With a store: every job's last run across instances, and the instances
        seen recently. None without a store, or when the store is unreachable."""
        return await self._seam.cluster()

    async def cluster_status(self) -> list[JobStatus]:
        """`status`, with each claimed job's cluster-wide last run filled in
        (and every job's pause as the store has it)."""
        return await self._seam.cluster_status()

    def health(self) -> Health:
        """Whether this instance's scheduler does its work: it runs, and its
        store (if any) has not failed every claim or every heartbeat for longer
        than its lease. See `health_router` for the HTTP form a probe reads."""
        return self._seam.health()

    def health_router(self, path: str = "/healthz/jobs") -> APIRouter:
        """An ``APIRouter`` with one route, ``GET path``: `health` as JSON, with
        HTTP 200 when it is ok and 503 when it is not, for a Kubernetes probe or
        a load balancer. It shows no job, host or error message, so it needs no
        auth: ``app.include_router(scheduler.health_router())``."""
        from ._web.health_routes import build_health_router

        return build_health_router(self._seam, path)

    @property
    def router(self) -> APIRouter:
        """An ``APIRouter`` serving the status: ``GET /jobs``, ``/jobs/{name}``, its
        ``/runs``, ``/jobs/instances``, ``/jobs/schedules`` and the page ``/jobs/ui``.

        Include it with the app's own dependencies to protect it:
        ``app.include_router(scheduler.router, dependencies=[Depends(admin)])``.
        """
        if self._router is None:
            from ._web.status_routes import build_router

            self._router = build_router(self._seam)
        return self._router

    def control_router(
        self,
        *,
        dependencies: Sequence[Any] | None = None,
        public: bool = False,
        bounds: ScheduleBounds | None = None,
    ) -> APIRouter:
        """An ``APIRouter`` with ``POST /jobs/{name}/run``, ``/pause``, ``/resume``,
        ``/backfill``; ``POST /jobs/schedules``, ``PUT /jobs/schedules?group=`` (a
        set), ``PATCH`` and ``DELETE /jobs/schedules/{name}``.

        Pass the app's own auth:
        ``scheduler.control_router(dependencies=[Depends(require_admin)])``.
        Without dependencies it refuses to be built (anyone could run or stop
        jobs) unless ``public=True`` says so on purpose.
        ``bounds``: what a schedule made or changed over HTTP may ask
        (`ScheduleBounds`: by default ticks 10 s apart at least, durations
        of a week at most, 10 retries).
        Include it beside `router`, under the same ``/jobs``.
        """
        if bounds is not None and not isinstance(bounds, ScheduleBounds):
            raise ConfigurationError(
                f"control_router(bounds={short(bounds)}): pass a ScheduleBounds(...)"
            )
        flag("public", public, context="control_router(): ")
        if not dependencies and not public:
            raise ConfigurationError(
                "control_router() without dependencies would let anyone who reaches "
                "the app run and pause jobs: pass the app's auth, e.g. "
                "control_router(dependencies=[Depends(require_admin)]), or public=True "
                "if the app is protected some other way (a private network)"
            )
        from ._web.control_routes import build_control_router

        return build_control_router(
            self._seam, list(dependencies or ()), bounds or ScheduleBounds()
        )


def _every_positional(given: object) -> str:
    """What to write instead of ``every(given)``: the interval goes by keyword."""
    said = f"every() takes the interval as keywords, got {short(given)}: write"
    if callable(given):  # @scheduler.every over a function: the call was left out
        return f"{said} @scheduler.every(hours=1) (with parentheses), not @scheduler.every"
    if isinstance(given, timedelta):
        given = given.total_seconds()
    if isinstance(given, int | float) and not isinstance(given, bool):
        return f"{said} @scheduler.every(seconds={given:g}) (or minutes=, hours=, days=)"
    return f"{said} e.g. @scheduler.every(minutes=5) (seconds=, minutes=, hours=, days=)"


def seam_of(scheduler: Scheduler) -> Seam:
    """What the integrations read of ``scheduler`` and ask of it (see ``_core.seam``)."""
    return scheduler._seam
