"""The schedules made at run time of one scheduler, and their jobs.

The book keeps the functions schedules may name (``Scheduler.task``) and every
stored schedule this instance knows of. A schedule it can run becomes a job
like a declared one: a `Job` of the function with the schedule's arguments
bound, and its runner in the scheduler's runners (so claims, pauses, retries,
history, status, metrics and the page treat it as any other). A change makes a
new job and runner, which takes over the old one's stats; the old one ends
after its run in flight. With a store, the store's table is the truth: a
change is written there first, applied here at once, and read by the other
instances at their next heartbeat (`sync`: the rows changed since the last
version seen), while the claim of each tick checks the version, so that no
instance runs a tick under a spec changed elsewhere. Without a store the book
itself is the truth, for this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import anyio

from ._checks import check_name
from ._declaring import RESERVED
from ._errors import ConfigurationError, JobNotFoundError, StoreError, UnconfirmedError
from ._job import Job
from ._parts import Parts
from ._runner import JobRunner
from ._running import Life
from ._schedules import Schedule
from ._status import ErrorInfo
from ._stored import (
    ScheduleRow,
    ScheduleTable,
    StoredSchedule,
    Task,
    check_kwargs,
    check_stored_options,
    decode,
    encode,
    task_of,
)

__all__ = ["ScheduleBook"]

# A write is waited for this many store timeouts, as a pause is.
_CHANGE_WAIT = 3
# A change's compare-and-set is tried this often against concurrent changes.
_TRIES = 3


class ScheduleBook:
    """The functions schedules may name, and the stored schedules of one scheduler."""

    def __init__(self, parts: Parts, life: Life, forget_pause: Callable[[str], None]) -> None:
        self._parts = parts
        self._life = life
        self._forget_pause = forget_pause
        self.tasks: dict[str, tuple[Task, bool]] = {}
        """By name: the function, and whether it takes the run's context."""
        self.schedules: dict[str, StoredSchedule] = {}
        """Every stored schedule this instance knows of, run here or not."""
        self._runners: dict[str, JobRunner] = {}  # the jobs of the ones run here
        self._seen = 0  # the highest version read from the store
        self._read_at = 0  # when the last read of the changes began (µs, database's time)
        self._told: set[tuple[str, int]] = set()  # schedules left alone, logged once
        self._version = 0  # without a store: this process's own count

    @property
    def _table(self) -> ScheduleTable | None:
        return getattr(self._parts.store, "schedules", None)

    # -- functions ----------------------------------------------------------

    def add_task(self, func: Task, name: str | None) -> str:
        name, takes_context = task_of(func, name)
        if name in self.tasks and self.tasks[name][0] is not func:
            raise ConfigurationError(f"task {name!r} is registered twice: give one of them name=")
        self.tasks[name] = (func, takes_context)
        return name

    # -- changes ------------------------------------------------------------

    def _check(
        self,
        name: str,
        task: object,
        schedule: Schedule,
        kwargs: object,
        options: Mapping[str, Any],
    ) -> tuple[str, str]:
        """The task's name and the spec, or `ConfigurationError` saying what is wrong."""
        if not isinstance(task, str):
            task = getattr(task, "__name__", task)
        if not isinstance(task, str) or task not in self.tasks:
            known = ", ".join(repr(t) for t in sorted(self.tasks)[:20]) or "none"
            raise ConfigurationError(
                f"schedule {name!r}: no task named {task!r} (the tasks, registered with "
                f"@scheduler.task(), are: {known})"
            )
        func, takes_context = self.tasks[task]
        kwargs = check_kwargs(task, func, takes_context, {} if kwargs is None else kwargs)
        options = check_stored_options(name, options)
        spec = encode(schedule, kwargs, options)
        # The job's own checks, now rather than on every instance later.
        self._job(StoredSchedule(name, task, schedule, kwargs, options))
        return task, spec

    def _refuse_declared(self, name: str) -> str:
        name = check_name(name)
        if name in RESERVED or (name in self._parts.runners and name not in self._runners):
            raise ConfigurationError(
                f"schedule {name!r}: a declared job has that name (or a route does): "
                "choose another name"
            )
        return name

    async def add(
        self,
        name: str,
        task: object,
        schedule: Schedule,
        kwargs: object,
        options: Mapping[str, Any],
    ) -> StoredSchedule:
        name = self._refuse_declared(name)
        task, spec = self._check(name, task, schedule, kwargs, options)
        table = self._table
        row: ScheduleRow | None
        if table is None:
            row = None if name in self.schedules else self._local(name, task, spec)
        else:
            row = await self._write("create", name, partial(table.create, name, task, spec))
        if row is None:
            raise ConfigurationError(f"a schedule named {name!r} exists: change it instead")
        return self._apply(row)

    async def update(
        self,
        name: str,
        *,
        task: object | None,
        schedule: Schedule | None,
        kwargs: object | None,
        options: Mapping[str, Any],
    ) -> StoredSchedule:
        """Change what is given, keep the rest (the options given replace those
        of the same name). With a store, against the row as the store has it."""
        table = self._table
        for _ in range(_TRIES):
            current = await self._current(name)
            new_task, spec = self._check(
                name,
                current.task if task is None else task,
                current.schedule if schedule is None else schedule,
                current.kwargs if kwargs is None else kwargs,
                {**current.options, **options},
            )
            if table is None:
                return self._apply(self._local(name, new_task, spec))
            change = partial(table.change, name, new_task, spec, current.version)
            row = await self._write("change", name, change)
            if row is not None:
                return self._apply(row)
        raise StoreError(f"schedule {name!r} keeps changing elsewhere: ask again")

    async def remove(self, name: str) -> None:
        table = self._table
        if table is None:
            if name not in self.schedules:
                raise self._not_found(name)
            self._apply(ScheduleRow(name, "", "", self._next(), time.time(), True))
            return
        row = await self._write("remove", name, partial(table.remove, name))
        if row is None:
            raise self._not_found(name)
        self._apply(row)

    async def list(self) -> list[StoredSchedule]:
        """Every schedule, as the store has it now (and applied here)."""
        table = self._table
        if table is not None:
            with anyio.fail_after(_CHANGE_WAIT * self._store_timeout()):
                rows = await table.changes(0)
            live = {row.name for row in rows}
            for row in rows:
                self._apply_newer(row)
            for gone in [n for n in self.schedules if n not in live]:
                # Removed elsewhere, and the removal's row already pruned.
                self._apply(ScheduleRow(gone, "", "", self.schedules[gone].version + 1, 0, True))
        return sorted(self.schedules.values(), key=lambda s: s.name)

    async def _current(self, name: str) -> StoredSchedule:
        table = self._table
        if table is None:
            found = self.schedules.get(name)
        else:
            with anyio.fail_after(_CHANGE_WAIT * self._store_timeout()):
                row = await table.get(name)
            found = None if row is None else decode(row, row.task in self.tasks)
        if found is None:
            raise self._not_found(name)
        return found

    def _not_found(self, name: str) -> JobNotFoundError:
        return JobNotFoundError(name, sorted(self.schedules), kind="schedule")

    def _store_timeout(self) -> float:
        store = self._parts.store
        assert store is not None
        return store.timeout

    async def _write(self, verb: str, name: str, write: Callable[[], Any]) -> ScheduleRow | None:
        """A write to the store's table, told as a pause's change is: `StoreError`
        when nothing changed, `UnconfirmedError` when it may have."""
        try:
            with anyio.fail_after(_CHANGE_WAIT * self._store_timeout()):
                row: ScheduleRow | None = await write()
                return row
        except StoreError as exc:
            raise StoreError(
                f"cannot {verb} schedule {name!r}: {exc}; nothing changed: ask again once "
                "the store answers"
            ) from exc
        except Exception as exc:
            raise UnconfirmedError(
                f"the store did not confirm the {verb} of schedule {name!r} in time "
                f"({ErrorInfo.of(exc)}): it may have been made; GET /jobs/schedules shows "
                "whether it was"
            ) from exc

    def _local(self, name: str, task: str, spec: str) -> ScheduleRow:
        return ScheduleRow(name, task, spec, self._next(), time.time(), False)

    def _next(self) -> int:
        self._version += 1
        return self._version

    # -- reading the store's changes ------------------------------------------

    async def sync(self) -> None:
        """The changes made since the last read (each heartbeat), applied."""
        table = self._table
        if table is None:
            return
        store = self._parts.store
        assert store is not None
        # Versions are stamped before their change commits, within the store's
        # deadline (twice its timeout): a change stamped earlier than the last
        # read may commit after it. Read again from that far before the last
        # read (not before the last version seen: after a burst of changes, that
        # read the whole burst at every beat until the next change); what is
        # applied already is skipped.
        back = int(3 * store.timeout * 1e6)
        since = 0 if not self._seen else max(1, max(self._seen, self._read_at) - back)
        read_at = int(self._parts.ticking.now() * 1e6)  # the database's time, before it reads
        rows = await table.changes(since)
        self._read_at = read_at
        for row in rows:
            self._apply_newer(row)

    def _apply_newer(self, row: ScheduleRow) -> None:
        known = self.schedules.get(row.name)
        if known is not None and known.version >= row.version:
            return
        if known is None and row.removed:
            self._seen = max(self._seen, row.version)
            return
        self._apply(row)

    # -- applying -------------------------------------------------------------

    def _apply(self, row: ScheduleRow) -> StoredSchedule:
        """Make this instance run the row's schedule (or stop running it: a
        removal's row, for which the schedule as it was comes back)."""
        self._seen = max(self._seen, row.version)
        name, logger = row.name, self._parts.logger
        if row.removed:
            gone = self.schedules.pop(name, None)
            self._retire(name)
            logger.info("schedule %r removed", name, extra={"job": name})
            return gone or StoredSchedule(name, row.task, _UNREADABLE, version=row.version)
        known = row.task in self.tasks
        try:
            stored = decode(row, known)
        except ConfigurationError as exc:
            self._leave_alone(row, f"its spec cannot be read by this release ({exc})")
            return StoredSchedule(name, row.task, _UNREADABLE, version=row.version, known=False)
        self.schedules[name] = stored
        if not known:
            self._leave_alone(row, f"it names the task {row.task!r}, which this instance lacks")
            return stored
        if name in self._parts.runners and name not in self._runners:
            self._leave_alone(row, "a job declared in this release's code has its name")
            return stored
        try:
            job = self._job(stored)
        except ConfigurationError as exc:
            self._leave_alone(row, str(exc))
            return stored
        self._install(job, stored.version)
        logger.info(
            "schedule %r (version %d): task %r %s",
            name,
            stored.version,
            stored.task,
            stored.schedule.describe(),
            extra={"job": name},
        )
        return stored

    def _leave_alone(self, row: ScheduleRow, why: str) -> None:
        self._retire(row.name)
        if (row.name, row.version) not in self._told:
            self._told.add((row.name, row.version))
            self._parts.logger.warning(
                "schedule %r is left alone here: %s (the instances that can run it do)",
                row.name,
                why,
                extra={"job": row.name},
            )

    def _job(self, stored: StoredSchedule) -> Job:
        func, _ = self.tasks[stored.task]
        bound = partial(func, **stored.kwargs) if stored.kwargs else func
        options: dict[str, Any] = {"name": stored.name, **stored.options}
        return Job.build(bound, stored.schedule, options, where="add_schedule", task=stored.task)  # type: ignore[arg-type]

    def _install(self, job: Job, version: int) -> None:
        parts = self._parts
        runner = JobRunner(job, parts.ticking, parts.logger, parts.leases, parts.history)
        runner.observers = parts.observers or None
        old = self._runners.get(job.name)
        if old is None:
            self._forget_pause(job.name)  # the store's pause of the name applies anew
        else:
            # The schedule's job goes on, under its new spec: its counts, its
            # history and its pause are the same job's.
            runner.stats, runner.history, runner.thread_done = (
                old.stats,
                old.history,
                old.thread_done,
            )
            runner.paused_until, runner.pause_unknown = old.paused_until, old.pause_unknown
        self._runners[job.name] = parts.runners[job.name] = runner
        if runner.leases is not None:
            parts.versions[job.name] = version
        else:
            parts.versions.pop(job.name, None)
        if old is not None:
            old.retired = True  # its stats are the new runner's from now on
            old.stop()  # after its run in flight
        running = self._life.running
        if running is not None:
            running.adopt(runner)

    def _retire(self, name: str) -> None:
        old = self._runners.pop(name, None)
        if old is None:
            return
        self._parts.runners.pop(name, None)
        self._parts.versions.pop(name, None)
        old.stop()  # after its run in flight
        running = self._life.running
        if running is not None:
            running.let_go()


class _Unreadable(Schedule):
    """The schedule of a row this release cannot read: it never ticks here."""

    def next_after(self, ts: float) -> float:
        raise ConfigurationError("this schedule cannot be read by this release")

    def describe(self) -> str:
        return "unreadable by this release"


_UNREADABLE = _Unreadable()
