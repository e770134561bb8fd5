"""The schedules made at run time of one scheduler.

The book keeps the functions schedules may name (``Scheduler.task``) and every
stored schedule this instance knows of; the ones it can run become jobs like
declared ones (``_stored_jobs``: claims, pauses, retries, history, status,
metrics and the page treat them as any other). With a store, the store's table is the truth: a
change is written there first, applied here at once, and read by the other
instances at their next heartbeat (`sync`: the rows changed since the last
version seen), while the claim of each tick checks the version, so that no
instance runs a tick under a spec changed elsewhere. Without a store the book
itself is the truth, for this process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import anyio

from ._checks import check_name
from ._declaring import RESERVED
from ._errors import (
    ConfigurationError,
    JobNotFoundError,
    NameTakenError,
    StoreError,
    UnconfirmedError,
)
from ._parts import Parts
from ._pausing import Pauses
from ._running import Life
from ._schedules import Schedule
from ._startup import warn_if_in_several_processes
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
from ._stored_jobs import StoredJobs

__all__ = ["ScheduleBook"]

# A write is waited for this many store timeouts, as a pause is.
_CHANGE_WAIT = 3
# A change's compare-and-set is tried this often against concurrent changes.
_TRIES = 3
READ_ALL_EVERY = 600.0
"""Seconds between two reads of every row (else only the changes are read):
what a lost read of changes missed is found within this."""


class ScheduleBook:
    """The functions schedules may name, and the stored schedules of one scheduler."""

    def __init__(self, parts: Parts, life: Life, pauses: Pauses) -> None:
        self._parts = parts
        self._life = life
        self._pauses = pauses
        self.tasks: dict[str, tuple[Task, bool]] = {}
        """By name: the function, and whether it takes the run's context."""
        self.schedules: dict[str, StoredSchedule] = {}
        """Every stored schedule this instance knows of, run here or not."""
        self._jobs = StoredJobs(parts, life, pauses.forget_one)  # of the ones run here
        self._seen = 0  # the highest version read from the store
        self._told: set[tuple[str, int]] = set()  # schedules left alone, logged once
        self._version = 0  # without a store: this process's own count
        self._read_for: object = None  # the run whose start read every row
        self._read_all_at = 0.0  # when every row is read again (the loop's time)

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
            # The function itself: the name it was registered under.
            task = next((n for n, (f, _) in self.tasks.items() if f is task), task)
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
        self._jobs.build(StoredSchedule(name, task, schedule, kwargs, options), self.tasks)
        return task, spec

    def _refuse_declared(self, name: str) -> str:
        name = check_name(name)
        if name in RESERVED or (name in self._parts.runners and not self._jobs.runs(name)):
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
            warn_if_in_several_processes(self._parts.logger, name)
            row = None if name in self.schedules else self._local(name, task, spec)
        else:
            row = await self._write("create", name, partial(table.create, name, task, spec))
        if row is None:
            raise NameTakenError(f"a schedule named {name!r} exists: change it instead")
        made = self._applied(row)
        if options.get("paused"):
            # Paused from the start, whatever a removed schedule of the name left.
            await self._pause(made, paused=True, verb="made")
        return made

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
        name = check_name(name)  # before the store: a NUL is no name it can look up
        if task is None and schedule is None and kwargs is None and not options:
            raise ConfigurationError(
                f"update_schedule({name!r}): nothing to change: give the task, the schedule, "
                "the kwargs or an option"
            )
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
                changed = self._apply(self._local(name, new_task, spec))
            else:
                change = partial(table.change, name, new_task, spec, current.version)
                row = await self._write("change", name, change)
                if row is None:
                    continue  # changed elsewhere meanwhile: against the new row
                changed = self._applied(row)
            if "paused" in options:
                # As the operator's pause or resume: over an earlier one, on every instance.
                await self._pause(changed, paused=bool(options["paused"]), verb="changed")
            return changed
        raise StoreError(f"schedule {name!r} keeps changing elsewhere: ask again")

    async def _pause(self, stored: StoredSchedule, *, paused: bool, verb: str) -> None:
        """``paused=`` given: the job paused or resumed as `Scheduler.pause` does."""
        if stored.name not in self._parts.runners:
            return  # not run here (left alone): its declared default holds where it runs
        try:
            if paused:
                await self._pauses.pause(stored.name, None)
            else:
                await self._pauses.resume(stored.name)
        except StoreError as exc:
            raise StoreError(
                f"schedule {stored.name!r} was {verb}, but not its pause: {exc}"
            ) from exc

    async def remove(self, name: str) -> None:
        name = check_name(name)
        table = self._table
        if table is None:
            if name not in self.schedules:
                raise self._not_found(name)
            self._apply(ScheduleRow(name, "", "", self._next(), time.time(), True))
            return
        row = await self._write("remove", name, partial(table.remove, name))
        if row is None:
            raise self._not_found(name)
        self._applied(row)

    async def list(self) -> list[StoredSchedule]:
        """Every schedule, as the store has it now (and applied here)."""
        table = self._table
        if table is not None:
            async with self._reading("read the schedules"):
                await self._read_all(table)
        return sorted(self.schedules.values(), key=lambda s: s.name)

    async def _read_all(self, table: ScheduleTable) -> None:
        """Every live row, applied where newer; the schedules known here and gone
        from the store (removed while this instance was away, the removal's row
        pruned since) are removed here too."""
        before = self._seen
        rows = await table.changes(0)
        applied = sum(self._apply_newer(row, quiet=True) for row in rows)
        if applied:
            here = sum(1 for row in rows if self._jobs.runs(row.name))
            self._parts.logger.info(
                "read %d stored schedule(s): %d run here (DEBUG logs each)", applied, here
            )
        live = {row.name for row in rows}
        # Only what was known before the read began: a schedule made here while
        # it went is not in its answer.
        gone = [s for s in self.schedules.values() if s.name not in live and s.version <= before]
        for stored in gone:
            self._apply(ScheduleRow(stored.name, stored.task, "", stored.version, 0.0, True))

    async def _current(self, name: str) -> StoredSchedule:
        table = self._table
        if table is None:
            found = self.schedules.get(name)
        else:
            async with self._reading(f"change schedule {name!r}"):
                row = await table.get(name)
            found = None if row is None else decode(row, row.task in self.tasks)
        if found is None:
            raise self._not_found(name)
        return found

    @asynccontextmanager
    async def _reading(self, what: str) -> AsyncIterator[None]:
        """A read of the store's table, under its deadline: any failure is a
        `StoreError` saying what could not be done (nothing changed)."""
        try:
            with anyio.fail_after(_CHANGE_WAIT * self._store_timeout()):
                yield
        except Exception as exc:
            raise StoreError(
                f"cannot {what}: the store could not be read ({ErrorInfo.of(exc)}); nothing changed"
            ) from exc

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
        """The changes made since the last read (each heartbeat), applied; at the
        first beat of each start and every ``READ_ALL_EVERY``, every row."""
        table = self._table
        if table is None:
            return
        running, now = self._life.running, anyio.current_time()
        if running is not self._read_for or now >= self._read_all_at:
            await self._read_all(table)
            self._read_for, self._read_all_at = running, now + READ_ALL_EVERY
            return
        store = self._parts.store
        assert store is not None
        # Versions are stamped before their change commits, within the store's
        # deadline (twice its timeout): a change stamped earlier than the last
        # seen may commit after that was read. Read again from that far back;
        # what is applied already is skipped.
        since = max(1, self._seen - int(3 * store.timeout * 1e6))
        for row in await table.changes(since):
            self._apply_newer(row)

    async def learn(self, name: str) -> None:
        """Before acting on ``name``, which no job here has: read the changes, in
        case another instance made it since the last heartbeat (a trigger right
        after the schedule was made elsewhere). A failed read leaves it unknown."""
        if name in self._parts.runners or self._table is None or self._life.running is None:
            return
        with contextlib.suppress(Exception), anyio.fail_after(self._store_timeout()):
            await self.sync()

    def _applied(self, row: ScheduleRow) -> StoredSchedule:
        """A row this instance wrote, applied unless a heartbeat's read applied it
        (or a newer change) while the write's answer came back."""
        known = self.schedules.get(row.name)
        if known is not None and known.version >= row.version:
            return known
        if known is None and row.removed and row.version <= self._seen:
            return StoredSchedule(row.name, row.task, _UNREADABLE, version=row.version)
        return self._apply(row)

    def _apply_newer(self, row: ScheduleRow, *, quiet: bool = False) -> bool:
        """The row applied if it is newer than what this instance has (whether it was)."""
        known = self.schedules.get(row.name)
        if known is not None and known.version >= row.version:
            return False
        if known is None and row.removed:
            self._seen = max(self._seen, row.version)
            return False
        self._apply(row, quiet=quiet)
        return True

    # -- applying -------------------------------------------------------------

    def _apply(self, row: ScheduleRow, *, quiet: bool = False) -> StoredSchedule:
        """Make this instance run the row's schedule (or stop running it: a
        removal's row, for which the schedule as it was comes back). ``quiet``:
        logged at DEBUG (a start reads every row: one line each would be 10,000)."""
        self._seen = max(self._seen, row.version)
        name = row.name
        log = self._parts.logger.debug if quiet else self._parts.logger.info
        if row.removed:
            gone = self.schedules.pop(name, None)
            self._jobs.retire(name)
            log("schedule %r removed", name, extra={"job": name})
            return gone or StoredSchedule(name, row.task, _UNREADABLE, version=row.version)
        try:
            stored = decode(row, known=True)
        except ConfigurationError as exc:
            unreadable = StoredSchedule(name, row.task, _UNREADABLE, version=row.version)
            return self._leave_alone(
                row, unreadable, f"its spec cannot be read by this release ({exc})"
            )
        if stored.task not in self.tasks:
            return self._leave_alone(
                row, stored, f"it names the task {row.task!r}, which this instance lacks"
            )
        if name in self._parts.runners and not self._jobs.runs(name):
            return self._leave_alone(
                row, stored, "a job declared in this release's code has its name"
            )
        try:
            # The task of this release may take other arguments than the one
            # the schedule was made for: checked here, not at each run.
            func, takes_context = self.tasks[stored.task]
            check_kwargs(stored.task, func, takes_context, stored.kwargs)
            job = self._jobs.build(stored, self.tasks)
        except ConfigurationError as exc:
            return self._leave_alone(row, stored, str(exc))
        self.schedules[name] = stored
        self._jobs.install(job, stored.version)
        log(
            "schedule %r (version %d): task %r %s",
            name,
            stored.version,
            stored.task,
            stored.schedule.describe(),
            extra={"job": name},
        )
        return stored

    def _leave_alone(self, row: ScheduleRow, stored: StoredSchedule, why: str) -> StoredSchedule:
        """Not run here, listed as such (``known=False``), said once per version."""
        stored = replace(stored, known=False)
        self.schedules[row.name] = stored
        self._jobs.retire(row.name)
        if (row.name, row.version) not in self._told:
            self._told.add((row.name, row.version))
            self._parts.logger.warning(
                "schedule %r is left alone here: %s (the instances that can run it do)",
                row.name,
                why,
                extra={"job": row.name},
            )
        return stored


class _Unreadable(Schedule):
    """The schedule of a row this release cannot read: it never ticks here."""

    def next_after(self, ts: float) -> float:
        raise ConfigurationError("this schedule cannot be read by this release")

    def describe(self) -> str:
        return "unreadable by this release"


_UNREADABLE = _Unreadable()
