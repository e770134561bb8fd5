"""Reading the store's schedules, and applying what it says: the part of the
book (``_dynamic.book``) that each heartbeat runs.

Each beat reads the rows changed since the last read (by the index on
``version``); the first beat of each start and one every ``READ_ALL_EVERY``
read every row. A row newer than what this instance has is applied: its
schedule's job run here (``_dynamic.jobs``), or left alone, listed as
``known=False`` and said once, when this release cannot run it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from functools import partial

import anyio

from .._core.lifecycle import CurrentRun
from .._core.parts import Parts
from .._errors import ConfigurationError
from .._schedules import Schedule
from .._store import ScheduleRow, ScheduleTable
from .jobs import StoredJobs
from .stored import StoredSchedule, Task, check_kwargs, decode

__all__ = ["READ_ALL_EVERY", "UNREADABLE", "ScheduleChanges"]

_SAID_ONE_BY_ONE = 10
"""Schedules left alone that a read of every row names in the log; the rest it counts."""

READ_ALL_EVERY = 600.0
"""Seconds between two reads of every row (else only the changes are read):
what a lost read of changes missed is found within this."""


class ScheduleChanges:
    """The stored schedules this instance knows of, kept as the store has them."""

    _parts: Parts
    _current: CurrentRun
    _jobs: StoredJobs
    tasks: dict[str, tuple[Task, bool]]
    schedules: dict[str, StoredSchedule]
    _seen: int
    _read_at: int
    _told: set[tuple[str, int]]
    _read_for: object
    _read_all_at: float
    _budget: int | None = None  # warnings a read of every row may still say one by one
    _unsaid = 0  # and those it counts instead

    @property
    def _table(self) -> ScheduleTable | None:
        return self._parts.capabilities.schedules

    def _store_timeout(self) -> float:
        store = self._parts.store
        assert store is not None
        return store.timeout

    async def _read_all(self, table: ScheduleTable) -> None:
        """Every live row, applied where newer; the schedules known here and gone
        from the store (removed while this instance was away, the removal's row
        pruned since) are removed here too."""
        before = self._seen
        # As `sync` does: the next read of changes goes back from this read, not
        # from the newest version (a set of 100,000 applied at once shares one:
        # the next beat read them all again).
        read_at = int(self._parts.ticking.now() * 1e6)
        rows = await table.changes(0)
        self._read_at = max(self._read_at, read_at)
        # An older release beside 10,000 schedules it cannot run says a few, then a count.
        self._budget, self._unsaid = _SAID_ONE_BY_ONE, 0
        try:
            applied = sum(self._apply_newer(row, quiet=True) for row in rows)
        finally:
            self._budget = None
        if self._unsaid:
            self._parts.logger.warning(
                "and %d more stored schedule(s) are left alone here (GET /jobs/schedules "
                "lists them, known=false)",
                self._unsaid,
            )
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

    # -- reading the store's changes ------------------------------------------

    async def sync(self) -> None:
        """The changes made since the last read (each heartbeat), applied; at the
        first beat of each start and every ``READ_ALL_EVERY``, every row."""
        table = self._table
        if table is None:
            return
        running, now = self._current.running, anyio.current_time()
        if running is not self._read_for or now >= self._read_all_at:
            await self._read_all(table)
            self._read_for, self._read_all_at = running, now + READ_ALL_EVERY
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
        # A set applied elsewhere may bring thousands at once: each at DEBUG, and a count.
        quiet = len(rows) > _SAID_ONE_BY_ONE
        applied = sum(self._apply_newer(row, quiet=quiet) for row in rows)
        if quiet and applied:
            self._parts.logger.info("read %d changed stored schedule(s) (DEBUG logs each)", applied)

    async def learn(self, name: str) -> None:
        """Before acting on ``name``, which no job here has: read the changes, in
        case another instance made it since the last heartbeat (a trigger right
        after the schedule was made elsewhere). A failed read leaves it unknown."""
        if name in self._parts.runners or self._table is None or self._current.running is None:
            return
        with contextlib.suppress(Exception), anyio.fail_after(self._store_timeout()):
            await self.sync()

    def _applied(self, row: ScheduleRow, *, quiet: bool = False) -> StoredSchedule:
        """A row this instance wrote, applied unless a heartbeat's read applied it
        (or a newer change) while the write's answer came back. ``quiet``: logged
        at DEBUG (a set applied says what it did in one line)."""
        known = self.schedules.get(row.name)
        if known is not None and known.version >= row.version:
            return known
        if known is None and row.removed and row.version <= self._seen:
            return StoredSchedule(row.name, row.task, UNREADABLE, version=row.version)
        return self._apply(row, quiet=quiet)

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
            return gone or StoredSchedule(name, row.task, UNREADABLE, version=row.version)
        try:
            stored = decode(row, known=True)
        except ConfigurationError as exc:
            unreadable = StoredSchedule(name, row.task, UNREADABLE, version=row.version)
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
        if isinstance(job.func, partial) and job.func.keywords == stored.kwargs:
            # One dict of the arguments, not two (the job's copy is the one
            # kept): ~230 bytes a schedule, 23 MB at 100,000.
            stored = replace(stored, kwargs=job.func.keywords)
        self.schedules[name] = stored
        self._jobs.install(job, stored.version)
        if self._parts.logger.isEnabledFor(logging.DEBUG if quiet else logging.INFO):
            # (describe() costs ~5 µs: a start reads 100,000 rows, at DEBUG)
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
        stored = replace(stored, known=False, left_alone=why)
        self.schedules[row.name] = stored
        self._jobs.retire(row.name)
        if (row.name, row.version) not in self._told:
            self._told.add((row.name, row.version))
            if self._budget is not None:
                if self._budget <= 0:
                    self._unsaid += 1
                    return stored
                self._budget -= 1
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


UNREADABLE = _Unreadable()
