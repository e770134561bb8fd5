"""The seam: what the integrations (the routers and the page, metrics, the CLI)
read of a scheduler and ask of it, and nothing else.

Each ``Scheduler`` makes one `Seam` when it is built; an integration
given a scheduler asks for it with ``fastapi_jobs._scheduler.seam_of``, and the
routers are built with it. So the integrations never touch the scheduler's
private attributes, the public class shows no internal names, and this module
imports none of the integrations (nor the scheduler): no import cycle.
"""

from __future__ import annotations

from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    KeysView,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from .._backfill.results import BackfillResult
from .._backfill.runs import Backfills, Progress
from .._clock import Clock
from .._control import TriggeredRun
from .._dynamic.book import ScheduleBook
from .._dynamic.sets import AppliedSchedules, ScheduleSpec
from .._dynamic.stored import StoredSchedule
from .._errors import ConfigurationError
from .._job import Job
from .._logging import make_visible
from .._results import RunResult
from .._schedules import Schedule
from .._status import ClusterView, Health, JobStatus, PauseState, RunRecord, SchedulerState
from .._store import Store
from .health import health_of
from .lifecycle import NEVER_STARTED, CurrentRun, app_state
from .manual_runs import Operator
from .parts import Parts, connect
from .pauses import Pauses
from .reader import Reader
from .runner import JobRunner

__all__ = ["Seam"]


class Seam:
    """A scheduler's internals, as far as its integrations need them."""

    def __init__(
        self,
        parts: Parts,
        current: CurrentRun,
        reader: Reader,
        operator: Operator,
        pauses: Pauses,
        book: ScheduleBook,
        backfills: Backfills,
    ) -> None:
        self.backfills = backfills
        """The scheduler's backfills (`Scheduler.backfill` and the control
        router's endpoint share them)."""
        self._parts = parts
        self._current = current
        self._reader = reader
        self._operator = operator
        self._pauses = pauses
        self._book = book
        self._told_never_started = False

    # -- what it is

    @property
    def running(self) -> bool:
        """Whether the scheduler runs now (inside ``running()``)."""
        return self._current.running is not None

    def state(self, request: str) -> SchedulerState:
        """Whether the scheduler runs, never started or has stopped, for a
        ``request`` (its method and path) to a router. The first request that
        finds it never started logs why, at ERROR, once: the router was
        included and the lifespan forgotten, and nothing else would say so."""
        state = self._current.state
        if state == "never_started" and not self._told_never_started:
            self._told_never_started = True
            logger = self._parts.logger
            make_visible(logger)  # what a start does: plain uvicorn shows no library's INFO
            logger.error("%s: %s", request, NEVER_STARTED)
        return state

    @property
    def store(self) -> Store | None:
        return self._parts.store

    @property
    def read_jobs(self) -> Callable[[Collection[str], bool], Awaitable[ClusterView]] | None:
        """The store's read of some jobs' claims (``Store.read_jobs``), if it has one."""
        return self._parts.capabilities.read_jobs

    @property
    def instance_id(self) -> str:
        return self._parts.instance.id

    @property
    def jobs(self) -> Mapping[str, Job]:
        """The jobs, by name: those declared (in declaration order), then those of
        the schedules made at run time that this instance runs."""
        return {name: runner.job for name, runner in self._parts.runners.items()}

    def runners(self) -> list[JobRunner]:
        """Every job's runner, for figures read straight from each job's stats."""
        return list(self._parts.runners.values())

    def connect(self, clock: Clock, store: Store | None) -> None:
        """Run on ``clock`` and ``store`` from now on, not on those it was built
        with (``fastapi_jobs.testing.virtual``), every job afresh (no run, no
        count, its declared pause): only while it is not running."""
        if self._current.running is not None:
            raise ConfigurationError(
                "the scheduler is running: give it another clock or store before the "
                "app starts (enter testing.virtual(...) around the LifespanManager)"
            )
        reads = [("the stored schedules", self._book.sync)]
        connect(self._parts, clock, store, self._pauses.apply, reads)
        self._pauses.forget()
        for runner in self._parts.runners.values():
            for tell in self._parts.leaving:  # what it counted is kept (metrics' counters)
                tell(runner)
            runner.afresh()

    def health(self) -> Health:
        """Whether the scheduler does its work (`Scheduler.health`)."""
        running = self._current.running
        store = self._parts.store
        return health_of(
            self._current.state,
            None if running is None else running.health,
            None if store is None else store.lease,
        )

    def claimed(self, name: str) -> bool:
        """Whether the ticks of ``name`` are claimed in the store."""
        return self._parts.runner(name).store is not None

    def now(self) -> float:
        """Now on the clock the jobs tick on (with a store: the database's)."""
        return self._parts.ticking.now()

    # -- reading

    async def cluster(self, jobs: Collection[str] | None = None) -> ClusterView | None:
        """The cluster's view; ``jobs``: those whose claims are needed (others may come)."""
        return await self._reader.cluster(jobs)

    async def cluster_status(self) -> list[JobStatus]:
        return self._reader.statuses(await self._reader.cluster())

    def statuses(
        self, view: ClusterView | None, names: Iterable[str] | None = None
    ) -> list[JobStatus]:
        return self._reader.statuses(view, names)

    def names(self) -> KeysView[str]:
        """The jobs' names, as `jobs` has them, without a mapping made for each call."""
        return self._parts.runners.keys()

    def in_state(self, view: ClusterView | None, state: str) -> list[str]:
        return self._reader.in_state(view, state)

    async def unwell(self) -> ClusterView | None:
        """A reading enough to tell which jobs fail or run (`in_state`)."""
        return await self._reader.unwell()

    async def runs(self, name: str, limit: int) -> list[RunRecord]:
        return await self._reader.runs(name, limit)

    async def recent_runs(self, names: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        return await self._reader.recent_runs(names, limit)

    def paused(self, name: str) -> bool | None:
        return self._pauses.paused(name)

    def status(self) -> list[JobStatus]:
        return self._reader.status()

    def job_status(self, name: str) -> JobStatus:
        return self._reader.job_status(name)

    # -- acting

    async def trigger(self, name: str, *, wait: bool = False) -> TriggeredRun:
        await self._book.learn(name)
        return await self._operator.trigger(name, wait=wait)

    async def start_current_tick(self, name: str) -> TriggeredRun:
        await self._book.learn(name)
        return await self._operator.start_current_tick(name)

    async def pause(self, name: str, until: datetime | None) -> PauseState:
        await self._book.learn(name)
        return await self._pauses.pause(name, until)

    async def resume(self, name: str) -> PauseState:
        await self._book.learn(name)
        return await self._pauses.resume(name)

    async def run_now(self, name: str, state: Mapping[str, Any] | None) -> RunResult:
        return await self._operator.run_now(name, state)

    async def backfill(
        self,
        name: str,
        since: datetime,
        until: datetime,
        max_ticks: int,
        progress: Progress | None,
    ) -> BackfillResult:
        return await self.backfills.run(name, since, until, max_ticks, progress)

    # -- schedules made at run time

    def schedules_here(self) -> list[StoredSchedule]:
        """The stored schedules as this instance last read them (each heartbeat),
        those it cannot run included: the page's, which must not read every row
        of the store at each refresh."""
        return sorted(self._book.schedules.values(), key=lambda s: s.name)

    def left_alone(self) -> list[tuple[str, str, str]]:
        """The stored schedules this instance cannot run: (name, task, why)."""
        alone = [s for s in self._book.schedules.values() if not s.known]  # few: sorted after
        return [(s.name, s.task, s.left_alone or "") for s in sorted(alone, key=lambda s: s.name)]

    async def schedules(self) -> list[StoredSchedule]:
        """Every stored schedule, as the store has it now."""
        return await self._book.list()  # a failed read is the book's StoreError

    async def add_schedule(
        self,
        name: str,
        task: object,
        schedule: Schedule,
        kwargs: object,
        options: Mapping[str, Any],
    ) -> StoredSchedule:
        """The book checks what it is given (a task by name or function, kwargs)."""
        return await self._book.add(name, task, schedule, kwargs, options)

    async def update_schedule(
        self,
        name: str,
        *,
        task: object | None,
        schedule: Schedule | None,
        kwargs: object | None,
        options: Mapping[str, Any],
    ) -> StoredSchedule:
        return await self._book.update(
            name, task=task, schedule=schedule, kwargs=kwargs, options=options
        )

    async def remove_schedule(self, name: str) -> None:
        await self._book.remove(name)

    async def apply_schedules(
        self, group: str, schedules: Iterable[ScheduleSpec]
    ) -> AppliedSchedules:
        return await self._book.apply(group, schedules)

    def add_service(self, name: str, service: Callable[[], Awaitable[None]]) -> None:
        """Run ``service`` as a task of each run of the jobs (cancelled as they stop)."""
        self._parts.services.append((name, service))

    def on_leaving(self, tell: Callable[[JobRunner], None]) -> None:
        """Call ``tell`` with each runner that leaves the scheduler for good (a
        stored schedule removed, or left alone here), as it leaves: its stats go
        with it. A run it has going ends after that, on its stats."""
        self._parts.leaving.append(tell)

    @asynccontextmanager
    async def app_state(self, app: Any) -> AsyncIterator[Mapping[str, Any]]:
        """The app's own lifespan entered (``Scheduler(lifespan=)``): what it yields."""
        async with app_state(self._parts.app_lifespan, app) as state:
            yield state
