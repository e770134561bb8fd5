"""The schedules made at run time of one scheduler.

The book keeps the functions schedules may name (``Scheduler.task``) and every
stored schedule this instance knows of; the ones it can run become jobs like
declared ones (``_dynamic.jobs``: claims, pauses, retries, history, status,
metrics and the page treat them as any other; reading the store: ``_dynamic.changes``).
With a store, the store's table is the truth: a
change is written there first, applied here at once, and read by the other
instances at their next heartbeat (`sync`: the rows changed since the last
version seen), while the claim of each tick checks the version, so that no
instance runs a tick under a spec changed elsewhere. Without a store the book
itself is the truth, for this process.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio

from .._checks import check_name, is_whole
from .._core.declarations import RESERVED
from .._core.lifecycle import CurrentRun
from .._core.parts import Parts
from .._core.pauses import Pauses
from .._core.startup import warn_if_in_several_processes
from .._errors import (
    ConfigurationError,
    JobNotFoundError,
    NameTakenError,
    StoreError,
    TooManySchedulesError,
    UnconfirmedError,
    short,
)
from .._redaction import hidden
from .._schedules import Schedule
from .._status import ErrorInfo
from .._store import AppliedRows, ScheduleRow, ScheduleTable, SetChange
from .changes import ScheduleChanges
from .jobs import StoredJobs
from .sets import AppliedSchedules, ScheduleSpec
from .stored import (
    StoredSchedule,
    Task,
    check_kwargs,
    check_stored_options,
    decode,
    encode,
    task_of,
)

__all__ = ["MAX_SCHEDULES", "ScheduleBook", "check_max_schedules"]

MAX_SCHEDULES = 100_000
"""``Scheduler(max_schedules=)``'s default: the most live schedules. Each instance
holds every one (about 2 KiB each) and reads them at start; the bench measures
100,000 (BENCHMARKS.md)."""


def check_max_schedules(most: object) -> int | None:
    """``Scheduler(max_schedules=)``, checked."""
    if most is not None and not is_whole(most, 1, 10**9):
        raise ConfigurationError(
            f"Scheduler(max_schedules={short(most)}): the most live schedules, a whole "
            "number from 1 to 1,000,000,000, or None for no bound"
        )
    return most


# A write is waited for this many store timeouts, as a pause is.
_CHANGE_WAIT = 3
# A change's compare-and-set is tried this often against concurrent changes.
_TRIES = 3


class ScheduleBook(ScheduleChanges):
    """The functions schedules may name, and the stored schedules of one scheduler."""

    def __init__(
        self, parts: Parts, current: CurrentRun, pauses: Pauses, most: int | None = None
    ) -> None:
        self._parts = parts
        self.most = most
        """The most live schedules (``Scheduler(max_schedules=)``; None: no bound)."""
        self._current = current
        self._pauses = pauses
        self.tasks: dict[str, tuple[Task, bool]] = {}
        """By name: the function, and whether it takes the run's context."""
        self.schedules: dict[str, StoredSchedule] = {}
        """Every stored schedule this instance knows of, run here or not."""
        self._jobs = StoredJobs(parts, current, pauses.made_anew)  # of the ones run here
        self._seen = 0  # the highest version read from the store
        self._read_at = 0  # when the last read of the changes began (µs, database's time)
        self._told: set[tuple[str, int]] = set()  # schedules left alone, logged once
        self._version = 0  # without a store: this process's own count
        self._read_for: object = None  # the run whose start read every row
        self._read_all_at = 0.0  # when every row is read again (the loop's time)

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
                f"schedule {name!r}: no task named {short(task)} (the tasks, registered with "
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
        if name in RESERVED:
            raise ConfigurationError(
                f"schedule {name!r}: the route GET /jobs/{name} has that name: choose another name"
            )
        if name in self._parts.runners and not self._jobs.runs(name):
            raise ConfigurationError(
                f"schedule {name!r}: a declared job has that name: choose another name"
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
            most, live = self.most, len(self.schedules)
            if name not in self.schedules and most is not None and live >= most:
                raise TooManySchedulesError(live, 1, most)
            row = None if name in self.schedules else self._local(name, task, spec)
        else:
            create = partial(table.create, name, task, spec, self.most)
            row = await self._write("create", name, create)
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
            current = await self._live_schedule(name)
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

    async def apply(self, group: str, wanted: Iterable[ScheduleSpec]) -> AppliedSchedules:
        """Make the live schedules of ``group`` exactly ``wanted``: with a store,
        in one transaction, and applied here at once (the other instances at
        their next heartbeat)."""
        group, given, rows = await self._checked_set(group, wanted)
        table = self._table
        if table is None:
            warn_if_in_several_processes(self._parts.logger, group)
            answer = self._apply_here(group, rows)
            apply = partial(self._apply, quiet=True)
        else:
            # A set of 100,000 takes seconds to write: a millisecond a row on top
            # of a change's wait.
            within = _CHANGE_WAIT * self._store_timeout() + len(rows) / 1000
            answer = await self._write_set(group, table, rows, within)
            apply = partial(self._applied, quiet=True)
        made = []
        for count, row in enumerate((*answer.created, *answer.changed, *answer.removed), 1):
            made.append(apply(row))
            if count % 500 == 0:
                await anyio.lowlevel.checkpoint()  # each builds a job: let requests in
        for stored in made[: len(answer.created) + len(answer.changed)]:
            options = given[stored.name].options or {}
            if "paused" in options:
                await self._pause(stored, paused=bool(options["paused"]), verb="applied")
        done = AppliedSchedules(
            group,
            created=tuple(row.name for row in answer.created),
            changed=tuple(row.name for row in answer.changed),
            removed=tuple(row.name for row in answer.removed),
            unchanged=answer.unchanged,
        )
        self._parts.logger.info(
            "schedules of group %r applied: %d made, %d changed, %d removed, %d as they were "
            "(DEBUG logs each)",
            group,
            len(done.created),
            len(done.changed),
            len(done.removed),
            done.unchanged,
        )
        return done

    async def _checked_set(
        self, group: str, wanted: Iterable[ScheduleSpec]
    ) -> tuple[str, dict[str, ScheduleSpec], dict[str, tuple[str, str]]]:
        """The group's name, and each schedule (by name) with its task and spec, or
        `ConfigurationError` for the first that cannot be, saying which (its place
        in the set: one of 100,000): nothing applied."""
        try:
            # A group's name goes where a job's does (URLs, logs, a VARCHAR(200)).
            group = check_name(group)
        except ConfigurationError as exc:
            raise ConfigurationError(f"apply_schedules(): the group's name: {exc}") from None
        if isinstance(wanted, (str, bytes, Mapping)) or not isinstance(wanted, Iterable):
            raise ConfigurationError(
                f"apply_schedules({group!r}, {short(hidden(wanted))}): give a list of ScheduleSpec"
            )
        rows: dict[str, tuple[str, str]] = {}
        given: dict[str, ScheduleSpec] = {}
        for index, spec in enumerate(wanted):
            if index % 500 == 499:
                await anyio.lowlevel.checkpoint()  # requests go on while 100,000 are checked
            try:
                name, row = self._checked(spec, rows)
            except ConfigurationError as exc:
                raise ConfigurationError(
                    f"apply_schedules({group!r}): schedules[{index}]: {exc}"
                ) from None
            rows[name] = row
            given[name] = spec
        return group, given, rows

    def _checked(
        self, spec: ScheduleSpec, rows: Mapping[str, tuple[str, str]]
    ) -> tuple[str, tuple[str, str]]:
        if not isinstance(spec, ScheduleSpec):
            raise ConfigurationError(
                f"{short(hidden(spec))} is not a ScheduleSpec: give ScheduleSpec(name, task, "
                "schedule, kwargs=..., options=...) for each"
            )
        name = self._refuse_declared(spec.name)
        if name in rows:
            raise ConfigurationError(f"schedule {name!r} is given twice: give each name once")
        options = spec.options or {}
        return name, self._check(name, spec.task, spec.schedule, spec.kwargs, options)

    async def _write_set(
        self,
        group: str,
        table: ScheduleTable,
        rows: dict[str, tuple[str, str]],
        within: float,
    ) -> AppliedRows:
        """`ScheduleTable.apply`, told as a change is: `StoreError` when nothing
        changed, `UnconfirmedError` when it may have."""
        try:
            with anyio.fail_after(within):
                return await table.apply(group, rows, self.most, within)
        except (NameTakenError, TooManySchedulesError):
            raise  # refused, nothing written: it says why
        except StoreError as exc:
            raise StoreError(
                f"cannot apply the schedules of group {group!r}: {exc}; nothing changed: ask "
                "again once the store answers"
            ) from exc
        except Exception as exc:
            raise UnconfirmedError(
                f"the store did not confirm the schedules of group {group!r} in time "
                f"({ErrorInfo.of(exc)}): they may have been applied; GET /jobs/schedules "
                "shows whether they were, and applying the same set again is safe"
            ) from exc

    def _apply_here(self, group: str, rows: dict[str, tuple[str, str]]) -> AppliedRows:
        """Without a store: the book is the truth, for this process."""
        current = {
            name: (s.task, encode(s.schedule, dict(s.kwargs), dict(s.options)))
            for name, s in self.schedules.items()
            if s.group == group
        }
        new, changed, gone = change = SetChange.of(current, rows)
        taken = [name for name in new if name in self.schedules]
        if taken:
            raise SetChange.taken(group, taken)
        change.check_bound(len(self.schedules), self.most)
        now = time.time()

        def row(name: str, task: str, spec: str, removed: bool) -> ScheduleRow:
            return ScheduleRow(name, task, spec, self._next(), now, removed, group)

        return AppliedRows(
            created=[row(n, *rows[n], False) for n in new],
            changed=[row(n, *rows[n], False) for n in changed],
            removed=[row(n, current[n][0], "", True) for n in gone],
            unchanged=len(rows) - len(new) - len(changed),
        )

    async def list(self) -> list[StoredSchedule]:
        """Every schedule, as the store has it now (and applied here). While the
        scheduler runs, the changes since the last read are what the store has
        beyond what this instance knows (as each heartbeat reads them): 100,000
        rows are not read again for each listing (0.5 s)."""
        table = self._table
        if table is not None:
            async with self._read_or_say("read the schedules"):
                if self._current.running is None:
                    await self._read_all(table)
                else:
                    await self.sync()  # every row, at the first read of a run
        return sorted(self.schedules.values(), key=lambda s: s.name)

    async def _live_schedule(self, name: str) -> StoredSchedule:
        table = self._table
        if table is None:
            found = self.schedules.get(name)
        else:
            async with self._read_or_say(f"change schedule {name!r}"):
                row = await table.get(name)
            found = None if row is None else decode(row, row.task in self.tasks)
        if found is None:
            raise self._not_found(name)
        return found

    @asynccontextmanager
    async def _read_or_say(self, what: str) -> AsyncIterator[None]:
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
        # The store has no such schedule; this instance may not have heard yet of
        # its removal elsewhere: not listed as one it has.
        known = sorted(n for n in self.schedules if n != name)
        return JobNotFoundError(name, known, kind="schedule")

    async def _write(self, verb: str, name: str, write: Callable[[], Any]) -> ScheduleRow | None:
        """A write to the store's table, told as a pause's change is: `StoreError`
        when nothing changed, `UnconfirmedError` when it may have."""
        try:
            with anyio.fail_after(_CHANGE_WAIT * self._store_timeout()):
                row: ScheduleRow | None = await write()
                return row
        except TooManySchedulesError:
            raise  # refused before the write: nothing changed, and it says why
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
