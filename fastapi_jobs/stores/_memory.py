"""A store in this process's memory, on a clock of the test's: for tests of
schedules and of claims across instances in virtual time.

`SQLAlchemyStore` reads the database server's clock and waits on real I/O.
Under a fast-forwarded loop (``looptime``) virtual time races past its
deadlines while a statement is on its way, and the database's clock does not
move with the loop's. ``MemoryStore`` keeps the same rows in dictionaries and
reads the clock it is given (the schedulers' `LoopClock`), so its deadlines and
leases are virtual too. Several schedulers given stores on one
`MemoryDatabase` are instances of one app sharing its database.

The rules are the SQL store's, row for row (``stores/_claim_statements.py``,
``stores/_statements.py``): a tick is claimed only if it is newer than the
job's last claimed one, its lease is free (a hand-off's only once released),
the job is not paused (unless by hand), and the tick is not ahead of the
database's clock by more than a second; a stored schedule's tick only under
the schedule's version. Stored schedules and backfills are kept too; only the
hand-offs' outbox (a record of what was sent) needs `SQLAlchemyStore`.

A database given no clock reads the clock of the first scheduler built on it:
a test that gives its schedulers a `LoopClock` gets virtual leases without
saying so twice.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import anyio.lowlevel

from .._clock import Clock, SystemClock, as_datetime
from .._errors import (
    ConfigurationError,
    ScheduleChangedError,
    StoreError,
    TickAheadError,
    TooManySchedulesError,
    short,
)
from .._results import Outcome
from .._status import ClusterJobStatus, ClusterView, ErrorInfo, InstanceStatus, RunRecord, utc
from .._store import (
    FUTURE_MARGIN,
    REPLACED_BY,
    AppliedRows,
    Ended,
    Instance,
    Refused,
    ScheduleRow,
    SetChange,
)
from ._operations import NOT_OPEN
from ._options import check_claims

__all__ = ["MemoryDatabase", "MemoryStore"]

_SAID = "MemoryStore(): "


@dataclass(slots=True)
class _Claim:
    """A job's row of claims: its last claimed tick and its last run."""

    last_tick: float
    fence: int
    owner: str
    lease_until: float | None  # None: released
    started_at: float
    finished_at: float | None = None
    outcome: Outcome | None = None
    error: str | None = None
    duration: float | None = None


@dataclass(slots=True)
class _Run:
    """A row of the run history."""

    job: str
    fence: int
    tick: float
    manual: bool
    attempts: int
    started_at: float
    finished_at: float
    duration: float | None
    outcome: Outcome | None
    error: str | None
    instance: str


@dataclass(slots=True)
class _Seen:
    hostname: str
    pid: int
    started_at: float
    seen_at: float


@dataclass
class MemoryDatabase:
    """What instances of one app share: the rows a database would hold, and
    the clock it reads. Given no clock, it reads the clock of the first
    scheduler built on it (`SystemClock` if read before any is)."""

    clock: Clock | None = None
    claims: dict[str, _Claim] = field(default_factory=dict, repr=False)
    runs: list[_Run] = field(default_factory=list, repr=False)
    pauses: dict[str, tuple[float, int]] = field(default_factory=dict, repr=False)
    instances: dict[str, _Seen] = field(default_factory=dict, repr=False)
    schedules: dict[str, ScheduleRow] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.clock, type) or (
            self.clock is not None and not isinstance(self.clock, Clock)
        ):
            raise ConfigurationError(
                f"MemoryDatabase(clock={short(self.clock)}) is not a Clock: pass the "
                "schedulers' LoopClock, or none (it reads the first scheduler's)"
            )

    def now(self) -> float:
        """The database's time."""
        if self.clock is None:
            self.clock = SystemClock()
        return self.clock.now()

    def follow(self, clock: Clock) -> None:
        """A scheduler built on this database ticks on ``clock``: read it too,
        unless told a clock of its own."""
        if self.clock is None:
            self.clock = clock


class MemoryStore:
    """A `fastapi_jobs.stores.Store` in this process's memory (for tests).

    One per scheduler, as one `SQLAlchemyStore` is: stores made on one
    ``database`` (a `MemoryDatabase`) are instances of one app sharing it. Given
    a ``clock`` instead, the store makes a database of its own that reads it.
    In virtual time, give the database the schedulers' `LoopClock`::

        clock = LoopClock(datetime(2026, 1, 1, tzinfo=UTC))
        database = MemoryDatabase(clock)
        a = Scheduler(clock=clock, store=MemoryStore(database))
        b = Scheduler(clock=clock, store=MemoryStore(database))
    """

    def __init__(
        self,
        database: MemoryDatabase | None = None,
        *,
        clock: Clock | None = None,
        lease: float | timedelta = 30,
        timeout: float | timedelta = 5,
        heartbeat: float | timedelta = 10,
        history: int = 100,
    ) -> None:
        if database is not None and clock is not None:
            raise ConfigurationError(
                f"{_SAID}give a database or a clock, not both: the database reads its own clock"
            )
        if database is not None and not isinstance(database, MemoryDatabase):
            raise ConfigurationError(
                f"{_SAID}database must be a MemoryDatabase, not {short(database)}"
            )
        self.database = database or MemoryDatabase(clock)
        """The rows this store shares with the stores made on the same database."""
        # The SQL store's bounds: a test passes only what production takes.
        self.lease, self.timeout, self.heartbeat, self.history = check_claims(
            lease, timeout, heartbeat, history, said=_SAID
        )
        self.schedules = _Schedules(self)
        """The stored schedules (a `fastapi_jobs.stores.ScheduleTable`), shared
        by the stores on the same database."""
        self.backfills = _PastTicks(self)
        """Past ticks claimed for `Scheduler.backfill` (a `PastTicks`)."""
        self._instance: Instance | None = None

    def __repr__(self) -> str:
        return f"MemoryStore(lease={self.lease:g}, timeout={self.timeout:g})"

    def follow_clock(self, clock: Clock) -> None:
        """The scheduler's clock, given when it is built: the database reads it
        unless it was given one (see `MemoryDatabase`)."""
        self.database.follow(clock)

    @property
    def _owner(self) -> str:
        return self._opened().id

    def _opened(self) -> Instance:
        if self._instance is None:
            raise StoreError(NOT_OPEN)
        return self._instance

    def _now(self) -> float:
        return self.database.now()

    async def open(self, state: Mapping[str, object], instance: Instance) -> None:
        await anyio.lowlevel.checkpoint()
        self._instance = instance

    async def close(self) -> None:
        await anyio.lowlevel.checkpoint()
        if self._instance is not None:
            self.database.instances.pop(self._instance.id, None)

    # -- claims and releases: the SQL store's conditions ----------------------

    async def claim(
        self,
        wanted: Sequence[tuple[str, float]],
        *,
        manual: bool = False,
        versions: Mapping[str, int] | None = None,
        replace: Collection[str] = (),
        handoffs: Collection[str] = (),
    ) -> dict[str, int | Exception]:
        """See `fastapi_jobs.stores.Store.claim`."""
        await anyio.lowlevel.checkpoint()
        now, owner = self._now(), self._owner
        fences: dict[str, int | Exception] = {}
        for job, tick in wanted:
            if tick > now + FUTURE_MARGIN:
                fences[job] = TickAheadError(tick, now)
                continue
            version = None if versions is None else versions.get(job)
            if not self._current(job, version):
                if version is not None:
                    fences[job] = ScheduleChangedError(tick)
                continue
            if not manual and self._paused(job, now):
                continue
            row = self.database.claims.get(job)
            if row is None:
                self.database.claims[job] = _Claim(tick, 1, owner, now + self.lease, now)
                fences[job] = 1
                continue
            if row.last_tick >= tick:
                continue
            held = row.lease_until is not None and (row.lease_until >= now or job in handoffs)
            if held and (manual or job not in replace):
                continue
            if held and row.lease_until is not None and row.lease_until >= now:
                self._replaced(job, row, owner, now)  # overlap="replace" takes it over
            row.last_tick, row.fence, row.owner = tick, row.fence + 1, owner
            row.lease_until, row.started_at = now + self.lease, now
            fences[job] = row.fence
        return fences

    def _current(self, job: str, version: int | None) -> bool:
        """The SQL store's rule: a stored schedule's tick is claimed only under
        its row's version; a declared job's only while no live stored schedule
        has its name."""
        row = self.database.schedules.get(job)
        if row is None:
            return True
        return row.removed if version is None else row.version == version

    def _paused(self, job: str, now: float) -> bool:
        until, _ = self.database.pauses.get(job, (0.0, 0))
        return until > now

    def _replaced(self, job: str, row: _Claim, owner: str, now: float) -> None:
        """The history row of the run that a claim with ``replace`` cancels."""
        if self.history:
            self.database.runs.append(
                _Run(
                    job=job,
                    fence=row.fence,
                    tick=row.last_tick,
                    manual=False,
                    attempts=1,
                    started_at=row.started_at,
                    finished_at=now,
                    duration=max(0.0, now - row.started_at),
                    outcome="cancelled",
                    error=REPLACED_BY + owner,
                    instance=row.owner,
                )
            )

    async def reclaim(
        self, wanted: Sequence[tuple[str, float]]
    ) -> dict[str, int | tuple[float, float] | Exception]:
        """See `fastapi_jobs.stores.Store.reclaim`."""
        await anyio.lowlevel.checkpoint()
        if not wanted:
            return {}
        now, owner = self._now(), self._owner
        answer: dict[str, int | tuple[float, float] | Exception] = {}
        for job, tick in wanted:
            row = self.database.claims.get(job)
            if row is None or row.lease_until is None:
                continue  # released (or never claimed)
            if row.last_tick == tick and row.lease_until < now and not self._paused(job, now):
                row.fence, row.owner = row.fence + 1, owner
                row.lease_until, row.started_at = now + self.lease, now
                answer[job] = row.fence
            else:
                answer[job] = (row.last_tick, row.lease_until - now)
        return answer

    async def renew(self, job: str, fence: int) -> bool:
        await anyio.lowlevel.checkpoint()
        self._opened()
        row = self.database.claims.get(job)
        if row is None or row.fence != fence or row.lease_until is None:
            return False  # taken over, or released: a late renewal does not re-take it
        row.lease_until = self._now() + self.lease
        return True

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        """See `fastapi_jobs.stores.Store.release`."""
        await anyio.lowlevel.checkpoint()
        self._opened()
        now = self._now()
        for end in ended:
            row = self.database.claims.get(end.job)
            if row is None or row.fence != end.fence or row.lease_until is None:
                continue  # not the job's latest claim, or released already
            row.lease_until = None
            if end.outcome is None:
                continue  # its run never started: only freed
            row.finished_at, row.outcome = now, end.outcome
            row.error, row.duration = end.error, end.duration
            if self.history:
                tick = row.last_tick if end.tick is None else end.tick
                self.database.runs.append(
                    _Run(
                        job=end.job,
                        fence=end.fence,
                        tick=tick,
                        manual=end.manual,
                        attempts=end.attempts,
                        started_at=row.started_at,
                        finished_at=now,
                        duration=end.duration,
                        outcome=end.outcome,
                        error=end.error,
                        instance=row.owner,
                    )
                )
        return {}

    async def last_tick(self, job: str) -> float | None:
        await anyio.lowlevel.checkpoint()
        self._opened()
        row = self.database.claims.get(job)
        return None if row is None else row.last_tick

    # -- instances, pauses, reads -------------------------------------------

    async def beat(self) -> float:
        await anyio.lowlevel.checkpoint()
        instance, now = self._opened(), self._now()
        seen = self.database.instances.get(instance.id)
        if seen is None:
            self.database.instances[instance.id] = _Seen(instance.hostname, instance.pid, now, now)
        else:
            seen.seen_at = now
        return now

    async def pause(self, job: str, until: float | None) -> int:
        return await self._set_pause(job, math.inf if until is None else until)

    async def resume(self, job: str) -> int:
        return await self._set_pause(job, 0.0)

    async def _set_pause(self, job: str, until: float) -> int:
        await anyio.lowlevel.checkpoint()
        self._opened()
        _, version = self.database.pauses.get(job, (0.0, 0))
        version = _next_version(version, self._now())
        self.database.pauses[job] = (until, version)
        return version

    async def pauses(self) -> dict[str, tuple[float, int]]:
        await anyio.lowlevel.checkpoint()
        self._opened()
        return dict(self.database.pauses)

    async def read(self) -> ClusterView:
        await anyio.lowlevel.checkpoint()
        self._opened()
        now, db = self._now(), self.database
        live = sorted(
            (seen.started_at, id_, seen)
            for id_, seen in db.instances.items()
            if seen.seen_at > now - 3 * self.heartbeat
        )
        return ClusterView(
            jobs={job: self._job_status(job, row, now) for job, row in db.claims.items()},
            instances=[
                InstanceStatus(
                    id=id_,
                    hostname=seen.hostname,
                    pid=seen.pid,
                    started_at=as_datetime(seen.started_at),
                    seen_at=as_datetime(seen.seen_at),
                )
                for _, id_, seen in live
            ],
            pauses={job: until for job, (until, _) in db.pauses.items()},
            pause_versions={job: version for job, (_, version) in db.pauses.items()},
            read_at=now,
        )

    def _job_status(self, job: str, row: _Claim, now: float) -> ClusterJobStatus:
        successes = [
            r.finished_at for r in self.database.runs if r.job == job and r.outcome == "ok"
        ]
        last_success = row.finished_at if row.outcome == "ok" else max(successes, default=None)
        return ClusterJobStatus(
            last_tick=utc(row.last_tick),
            fence=row.fence,
            last_started_at=utc(row.started_at),
            last_finished_at=utc(row.finished_at),
            last_duration_s=row.duration,
            last_outcome=row.outcome,
            last_error=ErrorInfo.parse(row.error),
            last_success_at=utc(last_success),
            last_instance=row.owner,
            running_on=row.owner if row.lease_until is not None and row.lease_until > now else None,
        )

    async def runs(self, job: str, limit: int) -> list[RunRecord]:
        await anyio.lowlevel.checkpoint()
        self._opened()
        return self._newest(job, limit)

    async def recent_runs(self, jobs: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        await anyio.lowlevel.checkpoint()
        self._opened()
        return {job: self._newest(job, limit) for job in jobs}

    def _newest(self, job: str, limit: int) -> list[RunRecord]:
        found = [run for run in reversed(self.database.runs) if run.job == job][:limit]
        return [_record(run) for run in found]

    async def prune(self) -> None:
        """Keep each job's last ``history`` runs."""
        await anyio.lowlevel.checkpoint()
        self._opened()
        kept: dict[str, int] = {}
        newest_first: list[_Run] = []
        for run in reversed(self.database.runs):
            kept[run.job] = kept.get(run.job, 0) + 1
            if kept[run.job] <= self.history:
                newest_first.append(run)
        self.database.runs[:] = reversed(newest_first)


class _Schedules:
    """The stored schedules (the SQL store's ``StoreSchedules``): a row's
    version grows with each change, never below the clock in µs, and a removal
    marks the row, so that an instance reading the changes sees it. Used
    before its store is open, it says so, as the SQL store's does."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._database = store.database

    async def _ready(self) -> None:
        await anyio.lowlevel.checkpoint()
        self._store._opened()

    def _write(
        self, name: str, task: str, spec: str, removed: bool, group: str | None = None
    ) -> ScheduleRow:
        rows, now = self._database.schedules, self._database.now()
        old = rows.get(name)
        version = _next_version(-1 if old is None else old.version, now)
        rows[name] = row = ScheduleRow(name, task, spec, version, now, removed, group)
        return row

    def _live(self, name: str) -> ScheduleRow | None:
        row = self._database.schedules.get(name)
        return None if row is None or row.removed else row

    async def create(
        self, name: str, task: str, spec: str, most: int | None = None
    ) -> ScheduleRow | None:
        await self._ready()
        if self._live(name) is not None:
            return None
        live = sum(not row.removed for row in self._database.schedules.values())
        if most is not None and live >= most:
            raise TooManySchedulesError(live, 1, most)
        return self._write(name, task, spec, removed=False)

    async def change(self, name: str, task: str, spec: str, expect: int) -> ScheduleRow | None:
        await self._ready()
        row = self._live(name)
        if row is None or row.version != expect:
            return None
        return self._write(name, task, spec, removed=False, group=row.group)

    async def get(self, name: str) -> ScheduleRow | None:
        await self._ready()
        return self._live(name)

    async def remove(self, name: str) -> ScheduleRow | None:
        await self._ready()
        row = self._live(name)
        if row is None:
            return None
        return self._write(name, row.task, row.spec, removed=True, group=row.group)

    async def apply(
        self,
        group: str,
        rows: Mapping[str, tuple[str, str]],
        most: int | None,
        within: float,
    ) -> AppliedRows:
        await self._ready()
        table = self._database.schedules
        current = {
            name: (row.task, row.spec)
            for name, row in table.items()
            if row.group == group and not row.removed
        }
        new, changed, gone = change = SetChange.of(current, rows)
        taken = [name for name in new if self._live(name) is not None]
        if taken:
            raise SetChange.taken(group, taken)
        change.check_bound(sum(not row.removed for row in table.values()), most)
        return AppliedRows(
            created=[self._write(n, *rows[n], removed=False, group=group) for n in new],
            changed=[self._write(n, *rows[n], removed=False, group=group) for n in changed],
            removed=[self._write(n, *current[n], removed=True, group=group) for n in gone],
            unchanged=len(rows) - len(new) - len(changed),
        )

    async def changes(self, since: int) -> list[ScheduleRow]:
        await self._ready()
        rows = self._database.schedules.values()
        if since > 0:
            found = [row for row in rows if row.version >= since]
        else:
            found = [row for row in rows if not row.removed]
        return sorted(found, key=lambda row: row.version)


class _PastTicks:
    """Past ticks claimed for a backfill (the SQL store's ``StoreBackfills``):
    a tick the history has, or the job's last claimed one, ran; a held lease
    waits; a stored schedule changed since the backfill began refuses."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def claim(self, job: str, tick: float, version: int | None = None) -> int | Refused:
        await anyio.lowlevel.checkpoint()
        store = self._store
        database, now, owner = store.database, store._now(), store._owner
        if not store._current(job, version):
            return "changed"
        row = database.claims.get(job)
        ran = any(run.job == job and run.tick == tick for run in database.runs)
        if ran or (row is not None and row.last_tick == tick):
            return "ran"
        if row is not None and row.lease_until is not None and row.lease_until >= now:
            return "held"
        if tick > now + FUTURE_MARGIN:
            return "held"  # as the SQL store's: not claimed, whatever the reason
        if row is None:
            database.claims[job] = _Claim(tick, 1, owner, now + store.lease, now)
            return 1
        row.fence, row.owner = row.fence + 1, owner
        row.last_tick = max(row.last_tick, tick)  # never back: see the claim's rule
        row.lease_until, row.started_at = now + store.lease, now
        return row.fence


def _next_version(version: int, now: float) -> int:
    """A row's next version (a pause's, a schedule's), as the SQL store's: one
    more, and never below the clock in µs, so that it only grows across a
    removal and a new row of the same name."""
    return max(version + 1, int(now * 1_000_000))


def _record(run: _Run) -> RunRecord:
    return RunRecord(
        id=str(run.fence),
        job=run.job,
        tick=utc(run.tick),
        manual=run.manual,
        attempts=run.attempts,
        started_at=utc(run.started_at),
        finished_at=utc(run.finished_at),
        duration_s=run.duration,
        outcome=run.outcome,
        error=ErrorInfo.parse(run.error),
        instance=run.instance,
        fence=run.fence,
    )
