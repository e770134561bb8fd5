"""The scheduler: the registry of jobs and the owner of their task group."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from ._checks import seconds
from ._claims import Claims
from ._clock import Clock, OffsetClock, SystemClock
from ._dispatcher import Dispatcher
from ._errors import ConfigurationError, JobNotFoundError, JobRunningError, short
from ._heartbeat import Heartbeat
from ._job import Job
from ._leases import LeaseKeeper
from ._logging import make_visible
from ._runner import JobRunner, RunResult
from ._schedules import Cron, Every, Schedule
from ._status import ClusterView, JobStatus, utc
from ._store import Instance, Store
from ._tasks import JobTasks

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = ["AppLifespan", "Scheduler"]

F = TypeVar("F", bound=Callable[..., Any])

AppLifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]
"""The app's own lifespan: ``app -> async context manager`` yielding its state."""


class Scheduler:
    """The registry of jobs, and the lifespan that runs them.

    Example::

        scheduler = Scheduler(lifespan=resources)

        @scheduler.every(hours=1)
        async def expire_sessions(ctx: JobContext) -> None: ...

        app = FastAPI(lifespan=scheduler.lifespan)
        app.include_router(scheduler.router)  # status at /jobs

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
        clock: where time comes from; tests pass a :class:`LoopClock`.
    """

    def __init__(
        self,
        *,
        lifespan: AppLifespan | None = None,
        logger: logging.Logger | None = None,
        shutdown_timeout: float | timedelta | None = 20.0,
        store: Store | None = None,
        clock: Clock | None = None,
    ) -> None:
        if shutdown_timeout is not None:
            shutdown_timeout = seconds(
                "shutdown_timeout", shutdown_timeout, context="Scheduler(): ", allow_zero=True
            )
        _check_parts(lifespan, logger, store, clock)
        self.logger = logger or logging.getLogger("fastapi_jobs")
        self.shutdown_timeout = shutdown_timeout
        self.clock: Clock = clock or SystemClock()
        self.store = store
        # Jobs tick on this clock: with a store, shifted onto the database's.
        self._ticking_clock: Clock = self.clock
        self._heartbeat: Heartbeat | None = None
        if store is not None:
            self._ticking_clock = on_db_time = OffsetClock(self.clock)
            self._heartbeat = Heartbeat(store, on_db_time, self.logger)
        self._leases = LeaseKeeper(store) if store is not None else None
        self.instance = Instance()
        self._app_lifespan = lifespan
        self._runners: dict[str, JobRunner] = {}
        self._state: Mapping[str, Any] | None = None
        self._router: APIRouter | None = None

    # -- declaring jobs ---------------------------------------------------

    def add_job(
        self,
        func: Callable[..., Any],
        schedule: Schedule,
        *,
        name: str | None = None,
        timeout: float | timedelta | None = None,
        run_on_startup: bool = False,
        every_instance: bool = False,
        catch_up: float | timedelta | None = None,
    ) -> Job:
        """Register ``func`` to run on ``schedule``; the decorators call this.

        ``timeout`` cancels a run that takes longer (recorded as
        ``timed_out``); ``run_on_startup`` also runs the job once when the
        scheduler starts (with a store: the current period's tick, once
        across instances). With a store, ``every_instance=True`` opts an
        idempotent job out of claims (it runs in every instance), and
        ``catch_up`` runs the latest tick missed during downtime once, if it
        is at most that old (default: missed ticks are skipped).
        """
        if self._state is not None:
            raise ConfigurationError(
                f"cannot add job {name or getattr(func, '__name__', func)!r}: the "
                "scheduler is already running; declare jobs before the app starts"
            )
        job = Job.build(
            func,
            schedule,
            name=name,
            timeout=timeout,
            run_on_startup=run_on_startup,
            every_instance=every_instance,
            catch_up=catch_up,
        )
        if job.name in self._runners:
            raise ConfigurationError(f"job {job.name!r} is declared twice: give one of them name=")
        if job.name == "instances":
            raise ConfigurationError(
                "the job name 'instances' is taken by GET /jobs/instances: choose another name="
            )
        if job.catch_up is not None and (self.store is None or job.every_instance):
            raise ConfigurationError(
                f"job {job.name!r}: catch_up= needs the store to remember the last tick "
                "across restarts: pass Scheduler(store=...), and do not combine it "
                "with every_instance=True"
            )
        self._runners[job.name] = JobRunner(job, self._ticking_clock, self.logger, self._leases)
        return job

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
        name: str | None = None,
        timeout: float | timedelta | None = None,
        run_on_startup: bool = False,
        every_instance: bool = False,
        catch_up: float | timedelta | None = None,
    ) -> Callable[[F], F]:
        """Decorate a job that runs at a fixed interval (see :class:`Every`).

        The arguments add up: ``every(hours=1, minutes=30)`` is 90 minutes.
        Ticks lie on a grid from the Unix epoch plus ``offset``, the same in
        every process and after every restart.
        """
        if _func is not None:
            raise ConfigurationError(
                f"every() takes the interval as keywords, got {short(_func)}: write "
                "@scheduler.every(hours=1) (with parentheses), not @scheduler.every"
            )
        schedule = Every(days=days, hours=hours, minutes=minutes, seconds=seconds, offset=offset)
        return self._decorator(
            schedule,
            name=name,
            timeout=timeout,
            run_on_startup=run_on_startup,
            every_instance=every_instance,
            catch_up=catch_up,
        )

    def cron(
        self,
        expr: str,
        *,
        tz: str | tzinfo = "UTC",
        name: str | None = None,
        timeout: float | timedelta | None = None,
        run_on_startup: bool = False,
        every_instance: bool = False,
        catch_up: float | timedelta | None = None,
    ) -> Callable[[F], F]:
        """Decorate a job that runs on a cron expression in ``tz`` (see :class:`Cron`)."""
        return self._decorator(
            Cron(expr, tz=tz),
            name=name,
            timeout=timeout,
            run_on_startup=run_on_startup,
            every_instance=every_instance,
            catch_up=catch_up,
        )

    def _decorator(self, schedule: Schedule, **options: Any) -> Callable[[F], F]:
        def register(func: F) -> F:
            self.add_job(func, schedule, **options)
            return func  # unchanged, so tests can call it directly

        return register

    @property
    def jobs(self) -> Mapping[str, Job]:
        """The declared jobs, by name."""
        return {name: runner.job for name, runner in self._runners.items()}

    # -- running ----------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[Mapping[str, Any]]:
        """The lifespan to give ``FastAPI(lifespan=...)`` (or Starlette).

        Enters the app's own lifespan, then starts the jobs with its state;
        on the way out, drains the jobs before the app's resources close.
        """
        async with AsyncExitStack() as stack:
            state: Mapping[str, Any] | None = None
            if self._app_lifespan is not None:
                state = await stack.enter_async_context(self._app_lifespan(app))
            if state is None:
                state = {}
            async with self.running(state):
                yield state

    @asynccontextmanager
    async def running(self, state: Mapping[str, Any] | None = None) -> AsyncIterator[None]:
        """Run the jobs for the duration of the ``async with`` block.

        What :meth:`lifespan` uses; use it directly outside an ASGI app. On
        exit: stop ticking at once, wait for runs in flight up to
        ``shutdown_timeout``, then cancel what remains and log each job cut.
        """
        if self._state is not None:
            raise RuntimeError("this scheduler is already running")
        self._state = {} if state is None else state
        runners = list(self._runners.values())
        stopped = anyio.Event()
        store = self.store
        make_visible(self.logger)
        self._warn_if_unclaimed_in_several_processes()
        try:
            if store is not None:
                await store.open(self._state, self.instance)
            if self._heartbeat is not None:
                await self._heartbeat.beat()  # learn the database's time before ticking
            self._log_start(runners)
            claims = None if store is None else Claims(store, self.logger)
            dispatcher = Dispatcher(self._ticking_clock, claims)
            tasks = JobTasks(self._state, dispatcher, stopped)
            now = self._ticking_clock.now()
            for runner in runners:
                runner.arm(claims, tasks)
                if runner.job.catch_up is None:
                    first = runner.first_tick(now)
                    if first is not None:
                        dispatcher.add(runner, first)
                else:
                    tasks.spawn(runner)  # its task asks the store for missed ticks first
            async with anyio.create_task_group() as tg:
                beating, keeping, releasing = (anyio.CancelScope() for _ in range(3))
                dispatching = anyio.CancelScope()
                if self._heartbeat is not None:
                    tg.start_soon(_run_in, beating, self._heartbeat.run)
                if self._leases is not None:
                    tg.start_soon(_run_in, keeping, self._leases.run)
                if claims is not None:
                    tg.start_soon(_run_in, releasing, claims.run)
                tg.start_soon(tasks.run)
                tg.start_soon(_run_in, dispatching, dispatcher.run)
                try:
                    yield
                finally:
                    with anyio.CancelScope(shield=True):
                        beating.cancel()
                        dispatcher.stop()  # no more ticks; claims in flight run their winners
                        await self._drain(runners, tasks, stopped)
                        dispatching.cancel()  # a claim still stuck past the deadline
                        await dispatcher.ended.wait()  # its claims released, as queued
                        keeping.cancel()  # the runs in flight renewed their leases until now
                        if claims is not None:
                            releasing.cancel()
                            await claims.flush()  # the releases of the last runs
        finally:
            self._state = None
            if store is not None:
                with anyio.CancelScope(shield=True):
                    await store.close()

    def _log_start(self, runners: list[JobRunner]) -> None:
        """One line per job (a summary past the first few dozen): what runs when."""
        if not self.logger.isEnabledFor(logging.INFO):
            return
        now = self._ticking_clock.now()
        for runner in runners[:_LISTED_AT_START]:
            job = runner.job
            where = (
                "claimed in the store (one instance per tick)"
                if runner.store is not None
                else "in every instance"
                if job.every_instance
                else "in this process (no store)"
            )
            try:
                nxt = utc(job.schedule.next_after(now))
            except Exception:  # noqa: BLE001 - a user's schedule; its loop reports it
                nxt = None
            self.logger.info(
                "job %r: %s, next run %s, %s",
                job.name,
                job.schedule.describe(),
                "unknown" if nxt is None else nxt.isoformat(timespec="seconds"),
                where,
            )
        if len(runners) > _LISTED_AT_START:
            self.logger.info(
                "and %d more jobs (GET /jobs lists them all)", len(runners) - _LISTED_AT_START
            )

    def _warn_if_unclaimed_in_several_processes(self) -> None:
        unclaimed = [
            n for n, r in self._runners.items() if r.store is None and not r.job.every_instance
        ]
        if unclaimed and _several_processes():
            self.logger.warning(
                "this app runs in several processes and has no store: every process "
                "runs these jobs on every tick: %s. Pass Scheduler(store=SQLAlchemyStore(...)) "
                "to run each tick once, or every_instance=True for jobs that may run "
                "everywhere.",
                ", ".join(unclaimed),
            )

    async def _drain(self, runners: list[JobRunner], tasks: JobTasks, stopped: anyio.Event) -> None:
        for runner in runners:
            runner.stop()
        tasks.stop()
        in_flight = [r.job.name for r in runners if r.in_flight]
        if in_flight:
            self.logger.info(
                "shutting down: waiting up to %s for runs in flight: %s",
                "no limit" if self.shutdown_timeout is None else f"{self.shutdown_timeout:g}s",
                ", ".join(in_flight),
            )
        with anyio.move_on_after(self.shutdown_timeout):
            await stopped.wait()
        for runner in runners:
            if runner.in_flight:
                self.logger.warning(
                    "job %r was still running at the shutdown deadline (%gs): cancelling it",
                    runner.job.name,
                    self.shutdown_timeout,
                    extra={"job": runner.job.name},
                )
        # Cancelled again and again for a short grace, as anyio's scopes do: a
        # job that swallows one cancellation meets the next at its next await.
        with anyio.move_on_after(_GRACE):
            while not stopped.is_set():
                for runner in runners:
                    if runner.in_flight:
                        runner.cut()
                with anyio.move_on_after(_RECUT):
                    await stopped.wait()
        if not stopped.is_set():
            self.logger.error(
                "shutdown: job(s) %s ignored cancellation for %gs past the deadline; "
                "the scheduler stops waiting for them",
                ", ".join(repr(r.job.name) for r in runners if r.in_flight),
                _GRACE,
            )
            stopped.set()  # the tasks' owner stops waiting and returns
        for runner in runners:
            runner.stats.next_run_at = None  # also for jobs that never came due
        threads = [r.job.name for r in runners if r.thread_running]
        if threads:
            self.logger.warning(
                "shutdown: the thread(s) of job(s) %s are still running and cannot be "
                "interrupted; the process exits when they return",
                ", ".join(repr(name) for name in threads),
            )

    async def run_now(self, name: str, *, state: Mapping[str, Any] | None = None) -> RunResult:
        """Run one job once, now, and return how it ended.

        For tests and operators. The run is guarded and recorded like a
        scheduled one (errors are returned, not raised). ``state`` defaults to
        the running app's state (empty when the scheduler is not running).
        Raises :class:`JobRunningError` if a run of the job is going.
        """
        runner = self._runner(name)
        if runner.busy:
            raise JobRunningError(name)
        if state is None:
            state = self._state if self._state is not None else {}
        tick = self.clock.now()
        ran = await runner.run(tick, state, manual=True)
        return RunResult(
            name=name,
            outcome=ran.outcome,
            tick=datetime.fromtimestamp(tick, UTC),
            duration_s=ran.duration,
            error=ran.error,
        )

    # -- status -----------------------------------------------------------

    def status(self) -> list[JobStatus]:
        """A snapshot of every job's status in this process, in declaration order."""
        return [self._snapshot(r) for r in self._runners.values()]

    def job_status(self, name: str) -> JobStatus:
        """A snapshot of one job's status; :class:`JobNotFoundError` if unknown."""
        return self._snapshot(self._runner(name))

    async def cluster(self) -> ClusterView | None:
        """With a store: every job's last run across instances, and the instances
        seen recently. None without a store, or when the store is unreachable."""
        if self.store is None or self._state is None:
            return None
        try:
            with anyio.fail_after(self.store.timeout):
                return await self.store.read()
        except Exception as exc:  # noqa: BLE001 - a status page must not fail
            self.logger.warning("cannot read the store for the status page: %r", exc)
            return None

    async def cluster_status(self) -> list[JobStatus]:
        """:meth:`status`, with each claimed job's cluster-wide last run filled in."""
        statuses = self.status()
        view = await self.cluster()
        if view is not None:
            for status in statuses:
                if status.claims:
                    status.cluster = view.jobs.get(status.name)
        return statuses

    @property
    def router(self) -> APIRouter:
        """An ``APIRouter`` serving ``GET /jobs`` and ``GET /jobs/{name}``.

        Include it with the app's own dependencies to protect it:
        ``app.include_router(scheduler.router, dependencies=[Depends(admin)])``.
        """
        if self._router is None:
            from ._router import build_router

            self._router = build_router(self)
        return self._router

    def _snapshot(self, runner: JobRunner) -> JobStatus:
        return runner.stats.snapshot(
            runner.job.name,
            self.instance.id,
            runner.job.schedule.describe(),
            claims=runner.store is not None,
            running=runner.busy,
        )

    def _runner(self, name: str) -> JobRunner:
        try:
            return self._runners[name]
        except KeyError:
            raise JobNotFoundError(name, list(self._runners)) from None


# Start-up lines name each job up to this many; then one line counts the rest.
_LISTED_AT_START = 50

# After the shutdown deadline: how long runs that ignore cancellation are
# cancelled again, and how often, before the lifespan stops waiting for them.
_GRACE = 5.0
_RECUT = 0.1


def _check_parts(lifespan: object, logger: object, store: object, clock: object) -> None:
    """Refuse, with what to do, the parts of a Scheduler that cannot work."""
    if lifespan is not None and not callable(lifespan):
        raise ConfigurationError(
            f"Scheduler(lifespan={short(lifespan)}): pass the app's lifespan function "
            "(app -> async context manager), as FastAPI(lifespan=...) takes it"
        )
    if logger is not None and not isinstance(logger, logging.Logger):
        raise ConfigurationError(
            f"Scheduler(logger={short(logger)}): pass a logging.Logger, "
            "e.g. logging.getLogger('myapp.jobs')"
        )
    if isinstance(store, str):
        raise ConfigurationError(
            f"Scheduler(store={short(store)}): a store is not a URL; wrap it: "
            "store=SQLAlchemyStore(url) (from fastapi_jobs.stores import SQLAlchemyStore)"
        )
    # The protocols say what a store and a clock have: checked against them,
    # not against a list kept here beside them.
    if store is not None and not isinstance(store, Store):
        raise ConfigurationError(
            f"Scheduler(store={short(store)}) is not a store (fastapi_jobs.Store says "
            "what one has): pass fastapi_jobs.stores.SQLAlchemyStore(...)"
        )
    if clock is not None and not isinstance(clock, Clock):
        raise ConfigurationError(
            f"Scheduler(clock={short(clock)}) is not a Clock: pass SystemClock() "
            "or LoopClock(start) (or an object with now() and sleep_until())"
        )


def _several_processes() -> bool:
    """Whether this app runs, or is told it will run, in several worker processes."""
    try:
        if int(os.environ.get("WEB_CONCURRENCY", "1")) > 1:
            return True
    except ValueError:
        pass
    if "gunicorn" in os.environ.get("SERVER_SOFTWARE", "") or "gunicorn" in sys.argv[0]:
        return True
    # uvicorn --workers N runs each worker as a multiprocessing child.
    return multiprocessing.parent_process() is not None and "uvicorn" in " ".join(sys.argv)


async def _run_in(scope: anyio.CancelScope, func: Callable[[], Awaitable[None]]) -> None:
    """Run ``func`` until ``scope`` is cancelled (a background task of the lifespan)."""
    with scope:
        await func()
