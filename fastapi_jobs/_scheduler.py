"""The scheduler: the registry of jobs and the owner of their task group."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from ._checks import flag, seconds
from ._claims import Claims
from ._clock import Clock, OffsetClock, SystemClock
from ._control import TriggeredRun, check_limit, check_until
from ._dispatcher import Dispatcher
from ._errors import (
    ConfigurationError,
    JobNotFoundError,
    JobRunningError,
    NotRunningError,
    StoreError,
    UnconfirmedError,
    short,
)
from ._heartbeat import Heartbeat
from ._history import run_id
from ._job import Job
from ._leases import LeaseKeeper
from ._logging import LIBRARY, make_visible
from ._observe import Observers
from ._runner import HISTORY, JobRunner, Manual, RunResult
from ._schedules import Cron, Every, Schedule
from ._status import (
    ClusterView,
    ErrorInfo,
    JobStatus,
    PauseState,
    RunRecord,
    pause_end,
    utc,
)
from ._store import Ended, Instance, Store
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
        history: the runs of each job this process keeps in memory for
            ``GET /jobs/{name}/runs`` (24 bytes each), 0 for none. Runs
            claimed in a store are in the store's history instead.
        observers: told about each run and each skipped tick (see
            :class:`Observer`); more with :meth:`add_observer`.
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
    ) -> None:
        if shutdown_timeout is not None:
            shutdown_timeout = seconds(
                "shutdown_timeout", shutdown_timeout, context="Scheduler(): ", allow_zero=True
            )
        _check_parts(lifespan, logger, store, clock)
        if not isinstance(history, int) or isinstance(history, bool) or not 0 <= history <= 10_000:
            raise ConfigurationError(
                f"Scheduler(history={short(history)}): the runs kept per job, a whole "
                "number from 0 to 10000"
            )
        self._history = history
        self.logger = logger or logging.getLogger(LIBRARY)
        self._observers = Observers(self.logger)
        if isinstance(observers, (str, bytes)) or not isinstance(observers, Iterable):
            raise ConfigurationError(
                f"Scheduler(observers={short(observers)}): pass a list of observers, "
                "e.g. observers=[MyObserver()]"
            )
        for observer in observers:
            self._observers.add(observer)
        self.shutdown_timeout = shutdown_timeout
        self.clock: Clock = clock or SystemClock()
        self.store = store
        # Jobs tick on this clock: with a store, shifted onto the database's.
        self._ticking_clock: Clock = self.clock
        self._heartbeat: Heartbeat | None = None
        # The version of each job's pause this process has applied (with a store).
        self._pause_versions: dict[str, int] = {}
        if store is not None:
            self._ticking_clock = on_db_time = OffsetClock(self.clock)
            self._heartbeat = Heartbeat(store, on_db_time, self.logger, self._apply_pauses)
        self._leases = LeaseKeeper(store) if store is not None else None
        self.instance = Instance()
        self._app_lifespan = lifespan
        self._runners: dict[str, JobRunner] = {}
        self._state: Mapping[str, Any] | None = None
        self._claims: Claims | None = None
        self._router: APIRouter | None = None
        # Tasks that live as long as the jobs run (the metrics' cluster reads).
        self._services: list[Callable[[], Awaitable[None]]] = []

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
        retries: int = 0,
        retry_backoff: float | timedelta = 1.0,
        retry_timeouts: bool = True,
        paused: bool = False,
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
        runs only once an operator resumes it (:meth:`resume`).
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
            retries=retries,
            retry_backoff=retry_backoff,
            retry_timeouts=retry_timeouts,
            paused=paused,
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
        runner = self._runners[job.name] = JobRunner(
            job, self._ticking_clock, self.logger, self._leases, self._history
        )
        runner.observers = self._observers or None
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
        retries: int = 0,
        retry_backoff: float | timedelta = 1.0,
        retry_timeouts: bool = True,
        paused: bool = False,
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
            retries=retries,
            retry_backoff=retry_backoff,
            retry_timeouts=retry_timeouts,
            paused=paused,
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
        retries: int = 0,
        retry_backoff: float | timedelta = 1.0,
        retry_timeouts: bool = True,
        paused: bool = False,
    ) -> Callable[[F], F]:
        """Decorate a job that runs on a cron expression in ``tz`` (see :class:`Cron`)."""
        return self._decorator(
            Cron(expr, tz=tz),
            name=name,
            timeout=timeout,
            run_on_startup=run_on_startup,
            every_instance=every_instance,
            catch_up=catch_up,
            retries=retries,
            retry_backoff=retry_backoff,
            retry_timeouts=retry_timeouts,
            paused=paused,
        )

    def add_observer(self, observer: object) -> None:
        """Tell ``observer`` about every run and skipped tick from now on: an
        object with some of :class:`Observer`'s methods (plain ones are called in
        the job's task and must be quick; ``async def`` ones are queued). An
        observer that raises is logged; the job goes on."""
        self._observers.add(observer)
        for runner in self._runners.values():
            runner.observers = self._observers

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
        async with self._app_state(app) as state, self.running(state):
            yield state

    @asynccontextmanager
    async def _app_state(self, app: Any) -> AsyncIterator[Mapping[str, Any]]:
        """The app's own lifespan (``lifespan=``) entered: what it yields."""
        if self._app_lifespan is None:
            yield {}
            return
        async with self._app_lifespan(app) as state:
            yield {} if state is None else state

    @asynccontextmanager
    async def running(
        self, state: Mapping[str, Any] | None = None, *, ticking: bool = True
    ) -> AsyncIterator[None]:
        """Run the jobs for the duration of the ``async with`` block.

        What :meth:`lifespan` uses; use it directly outside an ASGI app. On
        exit: stop ticking at once, wait for runs in flight up to
        ``shutdown_timeout``, then cancel what remains and log each job cut.
        ``ticking=False`` starts everything but the schedules: jobs run only
        when triggered (what the CLI's ``run`` does).
        """
        if self._state is not None:
            raise RuntimeError("this scheduler is already running")
        self._state = {} if state is None else state
        runners = list(self._runners.values())
        stopped = anyio.Event()
        store = self.store
        # The library's own logger first: a scheduler logger below it then
        # shows its lines through that handler, once.
        make_visible(logging.getLogger(LIBRARY))  # the store's and the metrics' lines
        make_visible(self.logger)
        self._warn_if_unclaimed_in_several_processes()
        try:
            if store is not None:
                # What the store's pauses were is not known until it is read
                # again (the first beat): a job that no claim guards waits for it.
                self._pause_versions.clear()
                for runner in runners:
                    if runner.leases is None:
                        runner.pause_unknown, runner.paused_until = True, math.inf
                await store.open(self._state, self.instance)
            if self._heartbeat is not None:
                await self._heartbeat.start()  # learn the database's time before ticking
            if ticking:
                self._log_start(runners)
            claims = None if store is None else Claims(store, self.logger)
            dispatcher = Dispatcher(self._ticking_clock, claims)
            if self._heartbeat is not None:
                self._heartbeat.on_step = dispatcher.kick
            tasks = JobTasks(self._state, dispatcher, stopped)
            now = self._ticking_clock.now()
            self._claims = claims
            observers = self._observers
            observers.instance = self.instance.id
            for runner in runners:
                runner.arm(claims, tasks)
                if not ticking:
                    continue
                if runner.job.catch_up is None:
                    first = runner.first_tick(now)
                    if first is not None:
                        dispatcher.add(runner, first)
                else:
                    tasks.spawn(runner)  # its task asks the store for missed ticks first
            body_error: BaseException | None = None
            try:
                async with anyio.create_task_group() as tg:
                    beating, keeping, releasing, observing = (anyio.CancelScope() for _ in range(4))
                    dispatching = anyio.CancelScope()
                    if self._heartbeat is not None:
                        tg.start_soon(_run_in, beating, self._heartbeat.run)
                    if self._leases is not None:
                        tg.start_soon(_run_in, keeping, self._leases.run)
                    if claims is not None:
                        tg.start_soon(_run_in, releasing, claims.run)
                    tg.start_soon(_run_in, observing, observers.run)
                    serving = [anyio.CancelScope() for _ in self._services]
                    for scope, service in zip(serving, self._services, strict=True):
                        tg.start_soon(_run_in, scope, service)
                    tg.start_soon(tasks.run)
                    tg.start_soon(_run_in, dispatching, dispatcher.run)
                    try:
                        yield
                    except BaseException as exc:
                        body_error = exc
                        raise
                    finally:
                        with anyio.CancelScope(shield=True):
                            beating.cancel()
                            for scope in serving:
                                scope.cancel()
                            dispatcher.stop()  # no more ticks; claims in flight run their winners
                            await self._drain(runners, tasks, stopped)
                            dispatching.cancel()  # a claim still stuck past the deadline
                            await dispatcher.ended.wait()  # its claims released, as queued
                            keeping.cancel()  # the runs in flight renewed their leases until now
                            if claims is not None:
                                releasing.cancel()
                                await claims.flush()  # the releases of the last runs
                            await observers.flush()  # the last runs' events
                            observing.cancel()
            except BaseExceptionGroup as group:
                # The block's own error comes out of the task group wrapped: give
                # it back as raised, as ``async with`` promises.
                if body_error is not None and group.exceptions == (body_error,):
                    raise body_error from None
                raise
        finally:
            self._state = self._claims = None
            if self._heartbeat is not None:
                self._heartbeat.on_step = None
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
            paused = ""
            if runner.paused_until > now:
                end = pause_end(runner.paused_until, now)
                paused = ", paused" + ("" if end is None else f" until {end.isoformat()}")
            self.logger.info(
                "job %r: %s, next run %s, %s%s",
                job.name,
                job.schedule.describe(),
                "unknown" if nxt is None else nxt.isoformat(timespec="seconds"),
                where,
                paused,
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
                    "job %r was still %s at the shutdown deadline (%gs): cancelling it",
                    runner.job.name,
                    "running" if runner.stats.running else "claiming its tick",
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
        scheduled one, retries included: what the job raises comes back on
        ``RunResult.error``, never raised. ``state`` defaults to the running
        app's state (empty when the scheduler is not running). No claim is
        made, so runs on other instances do not stop it.

        Raises :class:`JobNotFoundError` for an unknown name, and
        :class:`JobRunningError` if a run of the job is going in this process
        (or its tick is being claimed, or the thread of an earlier run has not
        returned). A cancellation of the caller cancels the run (its status's
        last outcome is ``cancelled``; no history entry) and goes on up.
        """
        runner = self._runner(name)
        if runner.busy:
            raise JobRunningError(name)
        if state is None:
            state = self._state if self._state is not None else {}
        tick = self.clock.now()
        ran = await runner.attempts(tick, state, Manual())
        return RunResult.of(name, datetime.fromtimestamp(tick, UTC), ran)

    # -- operating --------------------------------------------------------

    async def trigger(self, name: str, *, wait: bool = False) -> TriggeredRun:
        """Run ``name`` now, in the running app, as its task runs a tick.

        With a store the run is claimed first, like a tick: it holds the job's
        lease, so no scheduled tick runs beside it on any instance, and of two
        triggers on two instances one runs and the other raises
        :class:`JobRunningError` (saying where and since when). A paused job
        runs too: the operator asked. Returns once the run has started (with
        ``wait=True``, once it has ended: see :meth:`TriggeredRun.wait`).

        Raises :class:`JobNotFoundError`, :class:`JobRunningError`, and
        :class:`StoreError` when the store cannot be reached (nothing ran).
        """
        triggered = await self._start(name, self._ticking_clock.now(), by_hand=True)
        if wait:
            await triggered.wait()
        return triggered

    async def _start(self, name: str, tick: float, *, by_hand: bool) -> TriggeredRun:
        """Start a run of ``name`` for ``tick`` in its task (claimed first, with a
        store). ``by_hand``: the claim ignores a pause (else a paused job's claim
        is refused, as a tick's is)."""
        runner = self._runner(name)
        if self._state is None or runner.stopping:
            raise NotRunningError(
                f"cannot trigger {name!r}: the scheduler is not running (in tests, "
                "run_now() runs a job without the app)"
            )
        if runner.busy:
            raise self._busy(runner)
        manual = Manual()
        runner.in_flight = True  # no scheduled tick starts here meanwhile
        fence: int | None = None
        if runner.leases is not None:
            claims = self._claims
            assert claims is not None
            claimed_at = anyio.current_time()
            try:
                fences = await claims.claim([(name, tick)], manual=by_hand)
            finally:
                runner.in_flight = False
            got = None if fences is None else fences.get(name)
            if fences is None:
                raise StoreError(
                    f"cannot trigger {name!r}: the store cannot be reached; nothing ran"
                )
            if isinstance(got, Exception):
                raise StoreError(
                    f"cannot trigger {name!r}: the database refused its claim "
                    f"({ErrorInfo.of(got)}); "
                    "nothing ran"
                )
            if got is None:
                raise await self._held_elsewhere(name, tick)
            if runner.busy or runner.stopping:  # the app began to stop while we claimed
                claims.release_soon(Ended(name, got, None, None, 0.0, 0, True))  # never ran
                raise NotRunningError(f"cannot trigger {name!r}: the app is stopping")
            fence = runner.fence = got
            runner.claimed_at = claimed_at
            runner.in_flight = True
        runner.due, runner.manual = tick, manual
        runner.wake()
        triggered = TriggeredRun(
            name=name,
            # Its number among the job's runs here (they are recorded one at a time).
            id=run_id(
                self.instance.id, 0 if runner.history is None else runner.history.count, fence
            ),
            tick=datetime.fromtimestamp(tick, UTC),
            instance=self.instance.id,
            _manual=manual,
            _flush=None if fence is None or self._claims is None else self._claims.flush,
        )
        return triggered

    def _busy(self, runner: JobRunner) -> JobRunningError:
        name = runner.job.name
        if runner.in_flight and not runner.stats.running:
            return JobRunningError(
                name, message=f"job {name!r} is starting a run here (its tick is being claimed)"
            )
        return JobRunningError(name, utc(runner.stats.last_started_at), self.instance.id)

    async def _held_elsewhere(self, name: str, tick: float) -> JobRunningError:
        """Why a claim was refused: the job's lease is held (by whom, since when),
        or (for a claim that heeds pauses) it is paused, or its tick was claimed."""
        view = await self.cluster()
        held = None if view is None else view.jobs.get(name)
        if held is not None and held.running_on is not None:
            return JobRunningError(name, held.last_started_at, held.running_on)
        if view is not None and view.pauses.get(name, 0.0) > self._ticking_clock.now():
            return JobRunningError(name, message=f"job {name!r} is paused in the store")
        if held is not None and held.last_tick is not None and held.last_tick >= utc(tick):  # type: ignore[operator]
            return JobRunningError(
                name,
                message=f"the tick {utc(tick)} of job {name!r} was claimed already, by "
                f"{held.last_instance} (outcome: {held.last_outcome})",
            )
        return JobRunningError(name, message=f"job {name!r}: its claim was refused")

    async def _start_current_tick(self, name: str) -> TriggeredRun:
        """Claim the job's current tick (the latest due) and start its run here:
        what ``fastapi-jobs run`` does. :class:`JobRunningError` if it is taken."""
        runner = self._runner(name)
        tick = runner.job.schedule.last_at_or_before(self._ticking_clock.now())
        return await self._start(name, tick, by_hand=False)

    def _paused(self, name: str) -> bool | None:
        """Whether ``name`` is paused here now (with a store: as the store has it,
        from the last heartbeat, and as declared); None if the store's pauses
        could not be read (for a job that no claim guards)."""
        runner = self._runner(name)
        if runner.pause_unknown:
            return None
        return runner.paused_until > self._ticking_clock.now()

    async def pause(self, name: str, *, until: datetime | None = None) -> PauseState:
        """Skip the ticks of ``name`` (counted as ``skipped.paused``) until
        :meth:`resume`, or until ``until`` (an aware datetime) for a maintenance
        window. With a store the pause holds for every instance from its next
        tick, and across restarts; without one, for this process. Pausing a
        paused job changes only its end. A run going is not stopped.
        """
        runner = self._runner(name)
        until_ts = check_until(until, self._ticking_clock.now())
        await self._set_pause(runner, until_ts)
        return self._pause_state(runner)

    async def resume(self, name: str) -> PauseState:
        """Undo :meth:`pause` (and a declared ``paused=True``); the next tick runs.
        With a store, other instances learn it at their next heartbeat."""
        runner = self._runner(name)
        await self._set_pause(runner, None, resume=True)
        return self._pause_state(runner)

    async def _set_pause(
        self, runner: JobRunner, until: float | None, *, resume: bool = False
    ) -> None:
        store, name = self.store, runner.job.name
        paused_until = 0.0 if resume else math.inf if until is None else until
        verb = "resume" if resume else "pause"
        if store is None:
            runner.paused_until = paused_until
        else:
            try:
                # The store decides within its timeout and answers within twice
                # that: waited for, so that the answer says what became of it.
                with anyio.fail_after(_CHANGE_WAIT * store.timeout):
                    if resume:
                        version = await store.resume(name)
                    else:
                        version = await store.pause(name, until)
            except StoreError as exc:
                raise StoreError(
                    f"cannot {verb} {name!r}: {exc}; nothing changed: ask again once the "
                    "store answers"
                ) from exc
            except Exception as exc:
                raise UnconfirmedError(
                    f"the store did not confirm the {verb} of {name!r} in time "
                    f"({ErrorInfo.of(exc)}): it may have been made; GET /jobs/{name} "
                    "shows whether it was"
                ) from exc
            self._apply_pause(runner, paused_until, version)
        self.logger.info(
            "job %r %s%s",
            name,
            "resumed" if resume else "paused",
            "" if resume or until is None else f" until {utc(until)}",
            extra={"job": name},
        )

    def _pause_state(self, runner: JobRunner) -> PauseState:
        until = runner.paused_until
        now = self._ticking_clock.now()
        return PauseState(
            job=runner.job.name,
            paused=until > now,
            until=pause_end(until, now),
            scope="cluster" if self.store is not None else "process",
        )

    def _apply_pauses(self, pauses: Mapping[str, tuple[float, int]]) -> None:
        """A reading of the store's pauses (each heartbeat, GET /jobs): each job's
        pause as the cluster has it, where it is newer than what this process has.
        A reading may have begun before a change this process made or applied
        since, and answer after it; its older rows are left out. A job it does not
        list keeps what it has (the reading may be older than the job's row)."""
        runners = self._runners
        for runner in runners.values():
            if runner.pause_unknown:  # the first reading since the start: now known
                runner.pause_unknown = False
                runner.paused_until = runner.job.declared_pause
        for name, (until, version) in pauses.items():
            listed = runners.get(name)
            if listed is not None:
                self._apply_pause(listed, until, version)

    def _apply_pause(self, runner: JobRunner, paused_until: float, version: int) -> None:
        name = runner.job.name
        if version > self._pause_versions.get(name, -1):
            runner.paused_until, self._pause_versions[name] = paused_until, version

    async def runs(self, name: str, *, limit: int = 20) -> list[RunRecord]:
        """The last ``limit`` runs of ``name``, newest first: with a store, of
        every instance (its claimed runs); else of this process (the last 50)."""
        runner = self._runner(name)
        limit = check_limit(limit)
        store = self.store
        if store is not None and runner.leases is not None:
            if self._state is None:
                raise StoreError("the store opens when the scheduler starts")
            try:
                with anyio.fail_after(store.timeout):
                    return await store.runs(name, limit)
            except Exception as exc:
                raise StoreError(
                    f"cannot read the run history of {name!r}: {ErrorInfo.of(exc)}"
                ) from exc
        history = runner.history
        return [] if history is None else history.records(name, self.instance.id, limit)

    async def _recent_runs(self, names: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        """The last ``limit`` runs (as :meth:`runs`) of each job of ``names``, the
        claimed ones in one read of the store; a store that cannot be read gives
        them none."""
        found: dict[str, list[RunRecord]] = {}
        runners = {name: self._runners[name] for name in names if name in self._runners}
        claimed = [name for name, runner in runners.items() if runner.leases is not None]
        store = self.store
        if claimed and store is not None and self._state is not None:
            try:
                with anyio.fail_after(store.timeout):
                    found.update(await store.recent_runs(claimed, limit))
            except Exception as exc:  # noqa: BLE001 - a status page must not fail
                self.logger.warning("cannot read the run history for the status page: %r", exc)
        for name, runner in runners.items():
            if runner.leases is None and runner.history is not None:
                found[name] = runner.history.records(name, self.instance.id, limit)
        return found

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
        """:meth:`status`, with each claimed job's cluster-wide last run filled in
        (and every job's pause as the store has it)."""
        return self._statuses(await self.cluster())

    def _statuses(self, view: ClusterView | None) -> list[JobStatus]:
        if view is not None:
            versions = view.pause_versions
            self._apply_pauses(
                {name: (until, versions.get(name, 0)) for name, until in view.pauses.items()}
            )
        statuses = self.status()
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

    def control_router(
        self, *, dependencies: Sequence[Any] | None = None, public: bool = False
    ) -> APIRouter:
        """An ``APIRouter`` with ``POST /jobs/{name}/run``, ``/pause`` and ``/resume``.

        Pass the app's own auth: ``scheduler.control_router(dependencies=
        [Depends(require_admin)])``. Without dependencies it refuses to be built
        (anyone could run or stop jobs) unless ``public=True`` says so on purpose.
        Include it beside :attr:`router`, under the same ``/jobs``.
        """
        flag("public", public, context="control_router(): ")
        if not dependencies and not public:
            raise ConfigurationError(
                "control_router() without dependencies would let anyone who reaches "
                "the app run and pause jobs: pass the app's auth, e.g. "
                "control_router(dependencies=[Depends(require_admin)]), or public=True "
                "if the app is protected some other way (a private network)"
            )
        from ._router import build_control_router

        return build_control_router(self, list(dependencies or ()))

    def _snapshot(self, runner: JobRunner) -> JobStatus:
        return runner.stats.snapshot(
            runner.job.name,
            self.instance.id,
            runner.job.schedule.describe(),
            claims=runner.store is not None,
            running=runner.busy,
            paused_until=runner.job.declared_pause if runner.pause_unknown else runner.paused_until,
            now=self._ticking_clock.now(),
        )

    def _runner(self, name: str) -> JobRunner:
        try:
            return self._runners[name]
        except KeyError:
            raise JobNotFoundError(name, list(self._runners)) from None


# Start-up lines name each job up to this many; then one line counts the rest.
_LISTED_AT_START = 50

# A pause or resume is waited for this many store timeouts: the store decides
# within one and answers within two (see Store.pause).
_CHANGE_WAIT = 3

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
