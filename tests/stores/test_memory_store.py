"""``fastapi_jobs.testing.MemoryStore``: the SQL store's rules in memory, on a
clock of the test's, so that instances sharing a store run in virtual time.

The store's rules row by row (as tests/stores/test_store.py pins them on SQLite and
PostgreSQL), then whole schedulers in virtual time: a virtual day of ticks
across instances, pauses, leases renewed past their length, a take-over."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from itertools import pairwise

import anyio
import pytest

from fastapi_jobs import (
    ConfigurationError,
    Every,
    JobContext,
    JobRunningError,
    Scheduler,
    StoreError,
    TickAheadError,
)
from fastapi_jobs.stores import Ended, Instance, Store
from fastapi_jobs.stores._operations import NOT_OPEN
from fastapi_jobs.testing import LoopClock, MemoryDatabase, MemoryStore

START = datetime(2026, 3, 2, tzinfo=UTC)
T0 = START.timestamp()


class Fixed:
    """A database clock the test sets."""

    def __init__(self) -> None:
        self.at = T0

    def now(self) -> float:
        return self.at

    async def sleep_until(self, ts: float) -> None:  # pragma: no cover - never slept on
        raise AssertionError("the store never sleeps")


class Held(Fixed):
    """A clock the test sets, that the scheduler's timer waits on (for good)."""

    async def sleep_until(self, ts: float) -> None:
        await anyio.sleep_forever()


async def opened(database: MemoryDatabase, **options: float) -> MemoryStore:
    store = MemoryStore(database, **options)  # type: ignore[arg-type]
    await store.open({}, Instance())
    return store


async def test_it_is_a_store() -> None:
    assert isinstance(MemoryStore(), Store)


async def test_a_tick_is_claimed_once_and_only_after_the_last() -> None:
    """One claim per tick across instances; an older tick is never claimed after
    a newer one; a released job's next tick is claimed by whoever asks first."""
    clock = Fixed()
    database = MemoryDatabase(clock)
    a, b = await opened(database), await opened(database)
    assert await a.claim([("job", T0)]) == {"job": 1}
    assert await b.claim([("job", T0)]) == {}  # same tick: held, and not newer
    await a.release([Ended("job", 1, "ok", None, 0.1)])
    assert await b.claim([("job", T0 - 1)]) == {}  # older: never again
    assert await b.claim([("job", T0)]) == {}  # the same tick, released: never again
    assert await b.claim([("job", T0 + 0.5)]) == {"job": 2}
    assert await a.last_tick("job") == T0 + 0.5
    assert await a.renew("job", 1) is False  # not ours any more
    assert await b.renew("job", 2) is True


async def test_a_declared_jobs_claim_waits_for_a_live_stored_schedule_of_its_name() -> None:
    """As in the SQL store: a claim without a version (a declared job's) is not
    made while a live stored schedule has the job's name, and is once that
    schedule is removed; a stored schedule's claim is made under its version."""
    store = await opened(MemoryDatabase(Fixed()))
    made = await store.schedules.create("job", "task", "{}")
    assert made is not None
    assert await store.claim([("job", T0)]) == {}
    assert await store.claim([("job", T0)], versions={"job": made.version}) == {"job": 1}
    await store.release([Ended("job", 1, "ok", None, 0.1)])
    await store.schedules.remove("job")
    assert await store.claim([("job", T0 + 0.5)]) == {"job": 2}


async def test_a_lease_held_blocks_the_next_tick_until_it_ends() -> None:
    clock = Fixed()
    database = MemoryDatabase(clock)
    a, b = await opened(database, lease=30), await opened(database, lease=30)
    assert await a.claim([("job", T0)]) == {"job": 1}
    clock.at += 10
    assert await b.claim([("job", T0 + 10)]) == {}  # a's run goes on
    clock.at += 21  # a's lease is over (it died)
    assert await b.claim([("job", T0 + 31)]) == {"job": 2}
    # A's late release changes nothing: the claim is b's now.
    assert await a.release([Ended("job", 1, "ok", None, 31.0)]) == {}
    assert (await a.read()).jobs["job"].running_on == b._owner


async def test_a_tick_ahead_of_the_database_clock_says_so() -> None:
    clock = Fixed()
    a = await opened(MemoryDatabase(clock))
    refused = (await a.claim([("job", T0 + 30)]))["job"]
    assert isinstance(refused, TickAheadError)
    assert (refused.tick, refused.db_time) == (T0 + 30, T0)
    assert await a.claim([("job", T0 + 0.9)]) == {"job": 1}  # within the margin


async def test_pauses_hold_for_every_instance_but_not_for_a_run_by_hand() -> None:
    clock = Fixed()
    database = MemoryDatabase(clock)
    a, b = await opened(database), await opened(database)
    first = await a.pause("job", None)
    assert await b.claim([("job", T0)]) == {}
    assert await b.claim([("job", T0)], manual=True) == {"job": 1}
    await b.release([Ended("job", 1, "ok", None, 0.1, manual=True)])
    second = await b.resume("job")
    assert second > first
    assert (await a.pauses())["job"] == (0.0, second)
    timed = await a.pause("job", T0 + 60)
    assert await b.claim([("job", T0 + 1)]) == {}
    clock.at += 61
    assert await b.claim([("job", T0 + 61)]) == {"job": 2}
    assert (await a.read()).pause_versions == {"job": timed}


async def test_a_replace_claim_takes_over_and_records_the_run_it_cancels() -> None:
    clock = Fixed()
    database = MemoryDatabase(clock)
    a, b = await opened(database), await opened(database)
    assert await a.claim([("job", T0)]) == {"job": 1}
    clock.at += 5
    assert await b.claim([("job", T0 + 5)], replace=["job"]) == {"job": 2}
    [cancelled] = await a.runs("job", 10)
    assert cancelled.outcome == "cancelled" and cancelled.fence == 1
    assert cancelled.error is not None and b._owner in cancelled.error.message
    assert await a.renew("job", 1) is False  # its run is cancelled by the keeper


async def test_a_hand_off_row_never_released_is_only_reclaimed_for_its_tick() -> None:
    """A hand-off's claimer died holding tick T0: a claim of a later tick does not
    take the row, even with the lease over; a re-claim of T0 does."""
    clock = Fixed()
    database = MemoryDatabase(clock)
    dead, peer = await opened(database, lease=3, timeout=0.5), await opened(database)
    assert await dead.claim([("job", T0)], handoffs=["job"]) == {"job": 1}
    clock.at += 5
    assert await peer.claim([("job", T0 + 5)], handoffs=["job"]) == {}
    assert await peer.reclaim([("job", T0 + 5)]) == {"job": (T0, -2.0)}  # not its tick
    assert await peer.reclaim([("job", T0)]) == {"job": 2}
    assert await peer.reclaim([("other", T0)]) == {}  # never claimed
    await peer.release([Ended("job", 2, "ok", None, 0.1)])
    assert await peer.claim([("job", T0 + 5)], handoffs=["job"]) == {"job": 3}


async def test_the_history_is_newest_first_and_pruned_to_its_length() -> None:
    clock = Fixed()
    a = await opened(MemoryDatabase(clock))
    a.history = 3
    for n in range(5):
        clock.at = T0 + n
        assert await a.claim([("job", T0 + n)]) == {"job": n + 1}
        await a.release([Ended("job", n + 1, "failed" if n == 4 else "ok", None, 0.1)])
    assert [run.fence for run in await a.runs("job", 2)] == [5, 4]
    await a.prune()
    assert [run.fence for run in (await a.recent_runs(["job", "none"], 10))["job"]] == [5, 4, 3]
    view = (await a.read()).jobs["job"]
    assert view.last_outcome == "failed"
    assert view.last_success_at == datetime.fromtimestamp(T0 + 3, UTC)
    # A claim whose run never started is only freed: the last run stays.
    assert await a.claim([("job", T0 + 5)]) == {"job": 6}
    await a.release([Ended("job", 6, None, None, 0.0)])
    assert (await a.read()).jobs["job"].last_outcome == "failed"


async def test_instances_are_seen_while_they_beat() -> None:
    clock = Fixed()
    database = MemoryDatabase(clock)
    a, b = await opened(database, heartbeat=10), await opened(database, heartbeat=10)
    assert await a.beat() == T0
    await b.beat()
    assert len((await a.read()).instances) == 2
    clock.at += 31  # b missed three beats
    await a.beat()
    assert [seen.id for seen in (await a.read()).instances] == [a._owner]
    await a.close()
    assert (await b.read()).instances == []


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"lease": 0}, "lease=0"),
        ({"lease": 2 * 86400}, "lease=172800"),
        ({"heartbeat": 0.01}, "heartbeat=0.01"),
        ({"heartbeat": 1e300}, "heartbeat=1e"),
        ({"history": 10**6}, "history=1000000"),
        ({"timeout": 20}, "shorter than a third of the lease"),
        ({"history": -1}, "history=-1"),
        ({"database": "sqlite://"}, "must be a MemoryDatabase"),
        ({"database": MemoryDatabase(), "clock": Fixed()}, "not both"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigurationError, match=said):
        MemoryStore(**options)  # type: ignore[arg-type]


# -- whole schedulers, in virtual time -------------------------------------------


def instances(n: int, **options: float) -> tuple[LoopClock, list[Scheduler]]:
    clock = LoopClock(START)
    database = MemoryDatabase(clock)
    stores = [MemoryStore(database, **options) for _ in range(n)]  # type: ignore[arg-type]
    return clock, [Scheduler(clock=clock, store=store, shutdown_timeout=5) for store in stores]


@pytest.mark.looptime
async def test_replace_on_another_instance_takes_the_tick_over_a_run_that_holds_on() -> None:
    """A tick of an overlap="replace" job, due while another instance's run of it
    goes on past its cancel, is claimed over that run's lease and runs at once
    on the instance that claimed it."""
    clock, (a, b) = instances(2)
    started: list[tuple[str, float, float]] = []

    def declare(scheduler: Scheduler, who: str) -> None:
        @scheduler.every(seconds=1, overlap="replace", run_on_startup=who == "a")
        async def long(ctx: JobContext) -> None:
            started.append((who, ctx.tick.timestamp() - T0, clock.now() - T0))
            if who == "a" and len(started) == 1:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(1.5)  # past the next tick's cancel

    declare(a, "a")
    declare(b, "b")
    async with a.running(), b.running():
        await anyio.sleep(1.2)
    assert started[:2] == [("a", 0.0, 0.0), ("b", 1.0, 1.0)]


@pytest.mark.looptime
async def test_three_instances_run_every_tick_of_a_virtual_day_once() -> None:
    """Every minute for a virtual day on three instances: 1,440 ticks, each run
    once, the others counted as claimed elsewhere; the store's clock is the
    schedulers' own, so no offset, no tick early."""
    _, schedulers = instances(3)
    ran: list[float] = []
    for scheduler in schedulers:

        @scheduler.every(minutes=1, name="job")
        async def job(ctx: JobContext) -> None:
            ran.append(ctx.tick.timestamp())
            await anyio.sleep(5)

    async with schedulers[0].running(), schedulers[1].running(), schedulers[2].running():
        await anyio.sleep(86400 + 1)
        statuses = [scheduler.job_status("job") for scheduler in schedulers]
    assert len(ran) == len(set(ran)) == 1440
    assert ran == sorted(ran) and ran[0] == T0 + 60
    assert sum(status.skipped.get("claimed_elsewhere", 0) for status in statuses) == 2 * 1440
    assert all(set(status.skipped) <= {"claimed_elsewhere"} for status in statuses)


@pytest.mark.looptime
async def test_a_run_longer_than_its_lease_is_renewed_and_holds_the_job() -> None:
    """A run of 100 virtual seconds on a 30 s lease: renewed every third of it,
    never cancelled, and no other instance runs the job's ticks meanwhile."""
    _, schedulers = instances(2, lease=30, timeout=5)
    ran: list[tuple[float, float]] = []
    for scheduler in schedulers:

        @scheduler.every(seconds=60, name="job")
        async def job(ctx: JobContext) -> None:
            start = anyio.current_time()
            await anyio.sleep(100)
            ran.append((start, anyio.current_time()))

    async with schedulers[0].running(), schedulers[1].running():
        await anyio.sleep(60 * 5 + 1)
        statuses = [scheduler.job_status("job") for scheduler in schedulers]
    spans = sorted(ran)
    assert len(spans) >= 2
    assert all(end - start == pytest.approx(100) for start, end in spans)  # none cancelled
    assert all(b[0] >= a[1] for a, b in pairwise(spans))  # never together
    assert sum(status.failures for status in statuses) == 0


@pytest.mark.looptime
async def test_a_pause_until_an_instant_ends_on_every_instance() -> None:
    clock, schedulers = instances(2)
    ran: list[float] = []
    for scheduler in schedulers:

        @scheduler.every(hours=1, name="job")
        async def job(ctx: JobContext) -> None:
            ran.append(ctx.tick.timestamp())

    async with schedulers[0].running(), schedulers[1].running():
        await anyio.sleep(1)
        until = datetime.fromtimestamp(T0 + 5 * 3600 + 1, UTC)
        await schedulers[1].pause("job", until=until)
        await anyio.sleep(10 * 3600)
    # 1:00 to 5:00 paused; 6:00 to 10:00 ran, once each.
    assert ran == [T0 + hour * 3600 for hour in range(6, 11)]
    paused = sum(s.job_status("job").skipped.get("paused", 0) for s in schedulers)
    assert paused == 2 * 5
    assert math.isfinite(clock.now())


# -- a store's capabilities, read once ---------------------------------------------


class Half:
    """A schedules table of one's own, with only one of a table's methods."""

    async def create(self, name: str, task: str, spec: str) -> None: ...


def test_a_capability_offered_in_part_is_refused_by_name_when_the_scheduler_is_built() -> None:
    lacking = MemoryStore()
    lacking.schedules = Half()  # type: ignore[assignment]
    with pytest.raises(ConfigurationError) as raised:
        Scheduler(store=lacking)
    said = str(raised.value)
    assert "schedules" in said and "change, changes, get, remove" in said, said
    assert "ScheduleTable" in said


def test_a_store_without_the_protocol_is_told_what_it_lacks() -> None:
    class Partial:
        lease, timeout, heartbeat = 30.0, 5.0, 10.0

        async def claim(self) -> None: ...

    with pytest.raises(ConfigurationError, match=r"it lacks .*beat.*release"):
        Scheduler(store=Partial())  # type: ignore[arg-type]


def test_the_capabilities_are_read_from_each_store() -> None:
    from fastapi_jobs._store import Capabilities
    from fastapi_jobs.stores import SQLAlchemyStore

    sql = Capabilities.of(SQLAlchemyStore("sqlite+aiosqlite:///unused.sqlite3"))
    assert sql.schedules is not None and sql.backfills is not None and sql.outbox is not None
    assert sql.instant_claims and sql.release_then_claim is not None
    memory = Capabilities.of(MemoryStore())
    assert memory.schedules is not None and memory.backfills is not None
    assert memory.outbox is None and not memory.instant_claims
    assert memory.release_then_claim is None and memory.follow_clock is not None
    assert Capabilities.of(None) == Capabilities()
    assert Capabilities.of(None) == Capabilities()


@pytest.mark.looptime
async def test_two_backfills_of_one_range_on_two_instances_run_each_tick_once() -> None:
    """Past ticks are claimed in the shared database: two instances backfilling
    the same six hours run each tick once between them, and a tick the live
    schedule ran is not run again."""
    _, schedulers = instances(2)
    ran: list[float] = []
    for scheduler in schedulers:

        @scheduler.every(hours=1, name="job")
        async def job(ctx: JobContext) -> None:
            ran.append(ctx.tick.timestamp())
            await anyio.sleep(1)

    since, until = START, datetime.fromtimestamp(T0 + 6 * 3600, UTC)
    async with schedulers[0].running(), schedulers[1].running():
        await anyio.sleep(7 * 3600 + 1)  # 1:00 to 7:00 ran live
        results: list[object] = []

        async def backfill(scheduler: Scheduler) -> None:
            results.append(await scheduler.backfill("job", since, until))

        async with anyio.create_task_group() as tg:
            for scheduler in schedulers:
                tg.start_soon(backfill, scheduler)
    assert sorted(ran) == [T0 + hour * 3600 for hour in range(8)]  # 0:00 once, by a backfill
    assert len(ran) == len(set(ran))


@pytest.mark.looptime
async def test_stored_schedules_are_shared_by_the_instances_and_run_once() -> None:
    """A schedule added on one instance runs on both, each tick once; removed
    on the other, it runs nowhere after the next heartbeat."""
    clock, schedulers = instances(2)
    ran: list[tuple[str, float]] = []
    for scheduler in schedulers:

        @scheduler.task
        async def remind(ctx: JobContext, who: str) -> None:
            ran.append((who, ctx.tick.timestamp()))

    one, two = schedulers
    async with one.running(), two.running():
        await one.add_schedule("remind-ada", "remind", Every(minutes=1), kwargs={"who": "ada"})
        await anyio.sleep(20)  # a heartbeat: the other instance reads it
        assert [job.name for job in two.status()] == ["remind-ada"]
        await anyio.sleep(10 * 60)
        await two.remove_schedule("remind-ada")
        removed_at = clock.now()
        await anyio.sleep(20)
        assert one.status() == []
        await anyio.sleep(10 * 60)
    ticks = [tick for _, tick in ran]
    assert len(ticks) == len(set(ticks)) >= 10
    assert max(ticks) <= removed_at


@pytest.mark.looptime
async def test_a_store_given_no_clock_reads_the_schedulers_own() -> None:
    """``MemoryStore()`` beside a `LoopClock` set years ahead of the real clock:
    the database reads the scheduler's clock, so its ticks are not refused as
    ahead of it, and leases are virtual too."""
    clock = LoopClock(datetime(2031, 6, 1, tzinfo=UTC))
    store = MemoryStore()
    scheduler = Scheduler(clock=clock, store=store)
    ran: list[datetime] = []

    @scheduler.every(hours=1)
    async def job(ctx: JobContext) -> None:
        ran.append(ctx.tick)

    async with scheduler.running():
        await anyio.sleep(5 * 3600 + 1)
    assert len(ran) == 5 and store.database.clock is clock


def test_a_database_given_a_clock_keeps_it() -> None:
    mine = Fixed()
    store = MemoryStore(clock=mine)
    Scheduler(clock=LoopClock(START), store=store)
    assert store.database.clock is mine


def test_a_database_clock_that_is_not_a_clock_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="is not a Clock"):
        MemoryDatabase(1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="is not a Clock"):
        MemoryStore(clock="now")  # type: ignore[arg-type]


async def test_a_store_not_yet_opened_says_so_as_the_sql_store_does() -> None:
    """Every call before the scheduler opens the store is refused, as
    `SQLAlchemyStore` refuses it: a test on the memory store cannot pass where
    production would fail."""
    store = MemoryStore()
    calls = {
        "claim": store.claim([("job", T0)]),
        "beat": store.beat(),
        "renew": store.renew("job", 1),
        "release": store.release([Ended("job", 1, "ok", None, 0.1)]),
        "last_tick": store.last_tick("job"),
        "pause": store.pause("job", None),
        "resume": store.resume("job"),
        "pauses": store.pauses(),
        "read": store.read(),
        "runs": store.runs("job", 10),
        "recent_runs": store.recent_runs(["job"], 10),
        "prune": store.prune(),
        "schedules.create": store.schedules.create("s", "t", "{}"),
        "schedules.get": store.schedules.get("s"),
        "schedules.changes": store.schedules.changes(0),
        "backfills.claim": store.backfills.claim("job", T0),
    }
    said: dict[str, str] = {}
    for what, call in calls.items():
        try:
            await call
        except StoreError as exc:
            said[what] = str(exc)
    assert said == dict.fromkeys(calls, NOT_OPEN)
    scheduler = Scheduler(clock=LoopClock(START), store=MemoryStore())

    @scheduler.every(hours=1)
    async def job() -> None: ...

    with pytest.raises(StoreError, match="not open"):
        await scheduler.pause("job")


def test_a_clock_class_is_refused_saying_to_pass_an_instance() -> None:
    with pytest.raises(ConfigurationError, match="is not a Clock"):
        MemoryDatabase(LoopClock)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"is a class: pass a clock"):
        Scheduler(clock=LoopClock)  # type: ignore[arg-type]


async def test_a_trigger_while_the_database_clock_is_behind_the_last_claim_says_so() -> None:
    """The database's clock was stepped back: the job's last claimed tick is
    later than now on it. A trigger's claim (for now) is refused, and the error
    says that, not that the trigger's own tick was claimed."""
    clock = Held()
    database = MemoryDatabase(clock)
    scheduler = Scheduler(clock=clock, store=MemoryStore(database), shutdown_timeout=5)

    @scheduler.every(hours=1, name="job")
    async def job(ctx: JobContext) -> None: ...

    other = await opened(database)
    clock.at = T0 + 60
    assert await other.claim([("job", T0 + 60)]) == {"job": 1}
    await other.release([Ended("job", 1, "ok", None, 0.1)])
    clock.at = T0 + 30  # stepped back
    async with scheduler.running():
        with pytest.raises(JobRunningError) as raised:
            await scheduler.trigger("job")
    said = str(raised.value)
    assert "last ran for 2026-03-02T00:01:00+00:00" in said, said
    assert "stepped back?" in said and "claimed already" not in said
