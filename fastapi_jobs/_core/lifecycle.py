"""A running scheduler: what one ``Scheduler.running()`` block starts, and stops.

A `Running` exists for each run and holds what lives only while the jobs
run: the app's state, the claims, the dispatcher, the jobs' tasks and the
background tasks (each named). It starts them in order (the store open and the
database's time known before the first tick) and stops them in order: ticking
first, then the runs in flight drained (``_core.drain``), then the last claims
released and the last events told. The scheduler is running while
``CurrentRun.running`` holds one, and only then.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from .._logging import LIBRARY, make_visible
from .._status import SchedulerState
from .claims import Claims
from .dispatcher import Dispatcher
from .drain import drain
from .health import StoreHealth
from .parts import AppLifespan, Parts
from .runner import JobRunner
from .startup import log_start, warn_if_unclaimed_in_several_processes
from .tasks import JobTasks

__all__ = ["NEVER_STARTED", "CurrentRun", "Running", "app_state"]

NEVER_STARTED = (
    "the scheduler never started, so no job runs: the app did not run its lifespan. "
    "Write FastAPI(lifespan=scheduler.lifespan), and give the app's own lifespan to "
    "Scheduler(lifespan=...). A mounted app's lifespan does not run: give it to the app "
    "that is served"
)
"""Why a scheduler whose router answers has never run, and what to write (the
router was included, the lifespan forgotten)."""


class CurrentRun:
    """A scheduler's current run: None while it is not running."""

    __slots__ = ("ran", "running")

    def __init__(self) -> None:
        self.running: Running | None = None
        self.ran = False
        """Whether it has run (or runs): a scheduler stopped after running is
        told from one that never started."""

    @property
    def state(self) -> SchedulerState:
        if self.running is not None:
            return "running"
        return "stopped" if self.ran else "never_started"


@asynccontextmanager
async def app_state(lifespan: AppLifespan | None, app: Any) -> AsyncIterator[Mapping[str, Any]]:
    """The app's own lifespan (``Scheduler(lifespan=)``) entered: what it yields."""
    if lifespan is None:
        yield {}
        return
    async with lifespan(app) as state:
        yield {} if state is None else state


class Running:
    """One run of a scheduler's jobs: made by ``running()``, gone when it ends."""

    def __init__(
        self,
        parts: Parts,
        current: CurrentRun,
        state: Mapping[str, Any],
        *,
        ticking: bool,
        forget_pauses: Callable[[], None],
    ) -> None:
        self.parts = parts
        self._current = current
        self.state = state
        self.ticking = ticking
        self.runners = list(parts.runners.values())
        self._swept = 0  # how many runners the last `let_go` kept
        self.stopped = anyio.Event()
        self.claims: Claims | None = None
        self.health: StoreHealth | None = None
        """Whether the store answers (with a store): `Scheduler.health`."""
        self._forget_pauses = forget_pauses
        self._started: tuple[Dispatcher, JobTasks] | None = None
        self._stopping = False

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Run the jobs for the ``async with`` block; then stop, drain, close."""
        parts, store = self.parts, self.parts.store
        self._current.running = self
        self._current.ran = True
        # The library's own logger first: a scheduler logger below it then
        # shows its lines through that handler, once.
        make_visible(logging.getLogger(LIBRARY))  # the store's and the metrics' lines
        make_visible(parts.logger)
        warn_if_unclaimed_in_several_processes(parts)
        try:
            dispatcher, tasks = await self._start()
            body_error: BaseException | None = None
            try:
                async with anyio.create_task_group() as tg:
                    background = self._start_tasks(tg, dispatcher, tasks)
                    try:
                        yield
                    except BaseException as exc:
                        body_error = exc
                        raise
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._stop(background, dispatcher, tasks)
            except BaseExceptionGroup as group:
                # The block's own error comes out of the task group wrapped: give
                # it back as raised, as ``async with`` promises.
                if body_error is not None and group.exceptions == (body_error,):
                    raise body_error from None
                raise
        finally:
            self._current.running = self.claims = self._started = None
            if parts.heartbeat is not None:
                parts.heartbeat.on_step = parts.heartbeat.health = None
            if store is not None:
                with anyio.CancelScope(shield=True):
                    await store.close()

    async def _start(self) -> tuple[Dispatcher, JobTasks]:
        """Open the store, learn the database's time, and arm every job (placing
        each one's first tick when ``ticking``)."""
        parts, store, runners = self.parts, self.parts.store, self.runners
        if store is not None:
            self.health = StoreHealth(parts.logger, store.lease)
            if parts.heartbeat is not None:
                parts.heartbeat.health = self.health
            # What the store's pauses were is not known until it is read
            # again (the first beat): a job that no claim guards waits for it.
            self._forget_pauses()
            for runner in runners:
                if runner.leases is None:
                    runner.pause_unread()
            await store.open(self.state, parts.instance)
        if parts.heartbeat is not None:
            await parts.heartbeat.start()  # learn the database's time before ticking
            # The first beat read the stored schedules: their jobs start with the others.
            runners = self.runners = list(parts.runners.values())
        if self.ticking:
            log_start(parts.logger, runners, parts.ticking.now())
        claims = (
            None
            if store is None
            else Claims(store, parts.logger, parts.versions, parts.capabilities)
        )
        dispatcher = Dispatcher(parts.ticking, claims)
        if claims is not None:
            claims.health = self.health
        if parts.heartbeat is not None:
            parts.heartbeat.on_step = dispatcher.kick
            if claims is not None:
                claims.heartbeat = parts.heartbeat
        tasks = JobTasks(self.state, dispatcher, self.stopped)
        now = parts.ticking.now()
        self.claims = claims
        parts.observers.instance = parts.instance.id
        for runner in runners:
            runner.arm(claims, tasks)
            if self.ticking:
                self._place(runner, dispatcher, tasks, now)
        self._started = dispatcher, tasks
        return dispatcher, tasks

    def _place(
        self, runner: JobRunner, dispatcher: Dispatcher, tasks: JobTasks, now: float
    ) -> None:
        if runner.job.catch_up is None:
            first = runner.first_tick(now)
            if first is not None:
                dispatcher.add(runner, first)
        else:
            tasks.spawn(runner)  # its task asks the store for missed ticks first

    def adopt(self, runner: JobRunner) -> None:
        """Run ``runner`` from now on (a schedule made at run time). Before the
        start, the start takes it with the others; once stopping, nothing."""
        self.let_go()
        if self._started is None or self._stopping:
            return
        dispatcher, tasks = self._started
        runner.arm(self.claims, tasks)
        self.runners.append(runner)
        if self.ticking:
            self._place(runner, dispatcher, tasks, self.parts.ticking.now())

    def let_go(self) -> None:
        """Forget the runners stopped and idle (the jobs of schedules changed or
        removed); those still in flight stay, for the drain to wait for. Once
        the list has grown by half since the last time: a set of 100,000
        schedules applied adopts and retires as many runners, and a pass over
        the list for each was quadratic (10,000: 3 s). Stopped runners left in
        the list meanwhile are skipped, as those in flight were."""
        if self._started is None or self._stopping:
            return
        if len(self.runners) > self._swept + max(64, self._swept // 2):
            self.runners = [r for r in self.runners if not (r.stopping and not r.in_flight)]
            self._swept = len(self.runners)

    def _start_tasks(
        self, tg: anyio.abc.TaskGroup, dispatcher: Dispatcher, tasks: JobTasks
    ) -> Background:
        parts = self.parts
        background = Background(tg)
        if parts.heartbeat is not None:
            background.start("heartbeat", parts.heartbeat.run)
        if parts.leases is not None:
            background.start("leases", parts.leases.run)
        if self.claims is not None:
            background.start("releases", self.claims.run)
        background.start("observers", parts.observers.run)
        for name, service in parts.services:
            background.start(name, service, service=True)
        tg.start_soon(tasks.run, name="fastapi_jobs: the jobs' tasks")
        background.start("dispatcher", dispatcher.run)
        return background

    async def _stop(self, background: Background, dispatcher: Dispatcher, tasks: JobTasks) -> None:
        """The order of a stop: each part ends once what still needs it has."""
        parts = self.parts
        self._stopping = True  # no job adopted from here on
        background.cancel("heartbeat")
        background.cancel_services()
        dispatcher.stop()  # no more ticks; claims in flight run their winners
        await drain(parts, self.runners, tasks, self.stopped)
        background.cancel("dispatcher")  # a claim still stuck past the deadline
        await dispatcher.ended.wait()  # its claims released, as queued
        background.cancel("leases")  # the runs in flight renewed their leases until now
        if self.claims is not None:
            background.cancel("releases")
            await self.claims.flush()  # the releases of the last runs
        await parts.observers.flush()  # the last runs' events
        background.cancel("observers")


class Background:
    """The background tasks of a run, each in a cancel scope of its own, by name
    (the task's name too: ``fastapi_jobs: heartbeat``)."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._services: list[anyio.CancelScope] = []  # two may share a name

    def start(
        self, name: str, func: Callable[[], Awaitable[None]], *, service: bool = False
    ) -> None:
        scope = anyio.CancelScope()
        if service:
            self._services.append(scope)
        else:
            self._scopes[name] = scope
        self._tg.start_soon(_run_in, scope, func, name=f"fastapi_jobs: {name}")

    def cancel_services(self) -> None:
        for scope in self._services:
            scope.cancel()

    def cancel(self, name: str) -> None:
        """End the task ``name`` (if it was started)."""
        scope = self._scopes.get(name)
        if scope is not None:
            scope.cancel()


async def _run_in(scope: anyio.CancelScope, func: Callable[[], Awaitable[None]]) -> None:
    """Run ``func`` until ``scope`` is cancelled."""
    with scope:
        await func()
