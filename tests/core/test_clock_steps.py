"""A step of the host's wall clock (NTP, a VM resumed, `date -s`), seen by the
scheduler. With a store, jobs tick on the database's time and go on as before;
without one, ticks are wall-clock instants, as docs/guides/jobs.md says."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import Every, JobContext, Scheduler
from fastapi_jobs._core.dispatcher import GROUP_FROM, WATCH_EVERY
from fastapi_jobs.observers import TickSkipped
from fastapi_jobs.stores import SQLAlchemyStore
from fastapi_jobs.testing import LoopClock, MemoryDatabase, MemoryStore

from ..conftest import START, serving
from ..support.instances import Seeing, engine_for
from ..support.postgres import PostgresServer
from ..support.waiting import poll


class SteppedTime:
    """``time.time`` with a step added from the moment :meth:`step` is called."""

    def __init__(self) -> None:
        self.real = time.time
        self.offset = 0.0

    def __call__(self) -> float:
        return self.real() + self.offset

    def step(self, seconds: float) -> None:
        self.offset += seconds


async def test_with_a_store_a_wall_clock_step_changes_nothing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app host's clock steps ten minutes ahead, then ten minutes behind, while
    a job runs every 0.2 s: the job goes on ticking on the database's time, each
    tick once, none counted as missed and none placed ten minutes away."""
    wall = SteppedTime()
    monkeypatch.setattr(time, "time", wall)
    engine = create_async_engine(database_url)
    ticks: list[datetime] = []
    scheduler = Scheduler(store=SQLAlchemyStore(engine, heartbeat=0.3), shutdown_timeout=5)

    @scheduler.every(seconds=0.2)
    async def job(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    statuses = []
    try:
        async with scheduler.running():
            await poll(lambda: len(ticks) >= 3)
            for step in (600.0, -1200.0):
                wall.step(step)
                stepped_at = len(ticks)
                await poll(lambda: len(ticks) >= stepped_at + 4)  # noqa: B023 - called here
                statuses.append(scheduler.job_status("job"))
    finally:
        await engine.dispose()
    assert len(ticks) == len(set(ticks))
    # On the grid of the real time, not ten minutes off it.
    assert all(abs(tick.timestamp() - wall.real()) < 60 for tick in ticks)
    for status in statuses:
        assert status.skipped.get("missed", 0) <= 2  # the test's own stalls, at most
        assert status.next_run_at is not None
        assert abs(status.next_run_at.timestamp() - wall.real()) < 60


class SteppingClock:
    """A wall clock over the (virtual) loop's that can be stepped, as the system
    clock is by NTP; sleeps go by the loop's clock, as asyncio's do."""

    def __init__(self, start: datetime) -> None:
        self.base = start.timestamp()
        self.anchor: float | None = None

    def now(self) -> float:
        if self.anchor is None:
            self.anchor = anyio.current_time()
        return self.base + anyio.current_time() - self.anchor

    async def sleep_until(self, ts: float) -> None:
        await anyio.sleep(max(0.0, ts - self.now()))

    def step(self, seconds: float) -> None:
        self.base += seconds


@pytest.mark.looptime
async def test_without_a_store_ticks_follow_the_wall_clock() -> None:
    """Without a store the wall clock is the only time there is: stepped forward, the
    ticks in between count as missed and the latest runs within a minute (the timer
    wakes at least that often), not when the interval's sleep would have ended;
    stepped back, the ticks that ran are not run again: the job waits for the clock
    to come back to its next tick."""
    clock = SteppingClock(START)
    scheduler = Scheduler(clock=clock)
    ticks: list[float] = []

    @scheduler.every(hours=1)
    async def job(ctx: JobContext) -> None:
        ticks.append(clock.now() - START.timestamp())

    async with scheduler.running():
        await anyio.sleep(HOUR + 600)  # 1:00 ran; 1:10
        clock.step(3 * HOUR)  # 4:10
        await anyio.sleep(WATCH_EVERY)
        forward = scheduler.job_status("job")
        assert len(ticks) == 2 and 4 * HOUR + 600 <= ticks[1] <= 4 * HOUR + 600 + WATCH_EVERY
        clock.step(-3 * HOUR)  # 1:11
        await anyio.sleep(HOUR)  # 2:11 on the clock, 5:11 was its next tick
        back = scheduler.job_status("job")
        await anyio.sleep(3 * HOUR)  # 5:11
    assert forward.skipped == {"missed": 2}  # 2:00 and 3:00; 4:00 ran, late
    assert len(ticks) == 3 and back.runs == 2 and ticks[2] == 5 * HOUR


HOUR = 3600.0


class StepClock:
    """A clock of the app's own (not the system clock, so read as it is) that an
    operator can step."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    async def sleep_until(self, ts: float) -> None:
        await anyio.sleep(max(0.0, ts - self.now()))


async def test_with_a_store_an_offset_jump_wakes_the_timer(tmp_path: Path) -> None:
    """A clock that cannot be read through the monotonic one steps ten minutes
    back: the next heartbeat moves the offset by as much, and the timer, asleep
    on the old offset, is woken, so the job ticks again within a heartbeat or two
    instead of after ten minutes. (The heartbeat is slower than the job, so the
    timer goes back to sleep on the old offset before the beat corrects it.)"""
    clock = StepClock()
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}")
    ticks: list[datetime] = []
    store = SQLAlchemyStore(engine, heartbeat=1.0)
    scheduler = Scheduler(store=store, clock=clock, shutdown_timeout=5)

    @scheduler.every(seconds=0.2)
    async def job(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    try:
        async with scheduler.running():
            await poll(lambda: len(ticks) >= 3)
            clock.offset = -600.0
            stepped_at = len(ticks)
            await poll(lambda: len(ticks) >= stepped_at + 3)
    finally:
        await engine.dispose()
    assert len(ticks) == len(set(ticks))
    assert all(abs(tick.timestamp() - time.time()) < 60 for tick in ticks)


@pytest.mark.looptime
async def test_without_a_store_a_step_back_and_forth_between_two_looks_does_not_stall() -> None:
    """The clock steps an hour back and, before the watcher looks again, an hour
    forward: its offset is where it was, but the timer went back to sleep for an
    hour in between. The watcher sees the instant overdue and wakes it."""
    clock = SteppingClock(START + timedelta(seconds=30))  # the watcher looks at :30
    scheduler = Scheduler(clock=clock)
    ticks: list[float] = []

    @scheduler.every(minutes=10)
    async def job(ctx: JobContext) -> None:
        ticks.append(clock.now() - START.timestamp())

    async with scheduler.running():
        await anyio.sleep(560)  # 9:50 on the clock
        clock.step(-HOUR)  # the timer wakes at 10:00 and reads 9:00 less: an hour more
        await anyio.sleep(20)
        clock.step(HOUR)  # 10:10, the 10:00 tick overdue; the watcher looks at 10:30
        await anyio.sleep(WATCH_EVERY)
    assert len(ticks) == 1 and 600 <= ticks[0] <= 610 + WATCH_EVERY, ticks


@pytest.mark.looptime
async def test_with_a_store_a_host_clock_stepped_forward_runs_the_next_tick_on_the_database(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """This host's clock steps an hour ahead just before a tick; the database's
    does not. The timer wakes before the heartbeat has seen the step: the claim
    of the tick it jumped to is refused as ahead of the database's clock, the
    clock takes the database's reading, and the job runs again at its next
    tick on the database's time, not an hour later at the tick it jumped to."""
    database = MemoryDatabase(LoopClock(START))
    clock = SteppingClock(START)
    # A beat every 7 s: the beats (294, 301) miss the step (299) and the tick (300).
    scheduler = Scheduler(clock=clock, store=MemoryStore(database, heartbeat=7))
    ran: list[float] = []

    @scheduler.every(minutes=1)
    async def job(ctx: JobContext) -> None:
        ran.append(database.now() - START.timestamp())

    with caplog.at_level(logging.WARNING, "fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(299)  # 4:59, four runs
            clock.step(HOUR)
            await anyio.sleep(10 * 60)
    assert ran[:4] == [60, 120, 180, 240]
    after = ran[4:]
    # From the next minute on the database's clock: at most one tick lost to the step.
    assert after and after[0] <= 6 * 60 + 1, ran
    assert len(after) >= 9, ran
    assert "ahead of its clock" in caplog.text


@pytest.fixture
def stepped_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, whose clock the test steps."""
    yield from serving(lambda: PostgresServer(steppable=True), "PostgreSQL (under libfaketime)")


@pytest.mark.slow
async def test_a_database_clock_stepped_back_loses_only_the_ticks_it_had_run(
    stepped_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL's clock steps back 4 s while two instances run ten jobs every
    0.5 s (claimed as one set, by instant) and one every 0.7 s (claimed alone).
    The ticks of the 4 s the database's clock goes over again ran already: they
    cannot run again, so the jobs wait for the database's clock to come back to
    their next tick. Nothing else is lost: every job's ticks run one after the
    other, with no gap, each once, and no tick is counted as skipped for a
    reason that did not happen (claimed elsewhere, though no instance ran it).
    Before, each instance claimed on its old reading of the database's clock
    until its next heartbeat (10 s), every claim refused as in the future, and
    those ticks were lost."""
    server = stepped_postgres
    url = server.url(server.create_database())
    runs: Counter[tuple[str, float]] = Counter()
    grouped = [f"set-{n}" for n in range(GROUP_FROM + 2)]
    seen: list[TickSkipped] = []  # for a failure to say which instance dropped a tick

    def an_instance() -> Scheduler:
        scheduler = Scheduler(store=SQLAlchemyStore(lambda state: state["db"]), shutdown_timeout=5)
        scheduler.add_observer(Seeing(seen))

        async def job(ctx: JobContext) -> None:
            runs[ctx.name, ctx.tick.timestamp()] += 1

        async def slow(ctx: JobContext) -> None:
            runs[ctx.name, ctx.tick.timestamp()] += 1
            await anyio.sleep(0.7)

        for name in grouped:
            scheduler.every(seconds=0.5, name=name)(job)
        scheduler.every(seconds=0.7, name="alone")(job)
        scheduler.every(seconds=0.5, name="kept", overlap="queue_one")(slow)
        return scheduler

    def last_run(job: str) -> float:
        return max((tick for name, tick in runs if name == job), default=0.0)

    instances = [an_instance() for _ in range(2)]
    async with engine_for(url) as engine, AsyncExitStack() as stack:
        for scheduler in instances:
            await stack.enter_async_context(scheduler.running({"db": engine}))
        await poll(lambda: last_run("alone") > 0 and last_run("set-0") > 0, within=15)
        await anyio.sleep(1.0)
        server.step_clock(-4)
        stepped = {job: last_run(job) for job in ["alone", "kept", *grouped]}
        # Back to the tick after the last one run: 4 s, and 5 s of ticks after.
        await poll(lambda: all(last_run(j) >= t + 5 for j, t in stepped.items()), within=40)
        statuses = [scheduler.status() for scheduler in instances]
    assert max(runs.values()) == 1, [key for key, count in runs.items() if count > 1]
    for job, every in [("alone", 0.7), *((name, 0.5) for name in grouped)]:
        ticks = sorted(tick for name, tick in runs if name == job)
        due, _ = Every(seconds=every).ticks_between(ticks[0], ticks[-1])
        skipped = [(e.instance, e.tick, e.reason, e.ticks) for e in seen if e.job == job]
        assert len(ticks) == due + 1, (job, stepped[job], ticks, skipped)  # none missing
    for jobs in statuses:
        for status in jobs:
            assert "store_unavailable" not in status.skipped, status
            assert "missed" not in status.skipped, status
    # A tick kept for after a run (queue_one) and claimed ahead of the database's
    # clock is the one tick counted, by its true reason; the job goes on.
    kept = [status.skipped for jobs in statuses for status in jobs if status.name == "kept"]
    assert any("ahead_of_database" in skipped for skipped in kept), kept
    assert last_run("kept") >= stepped["kept"] + 5
    # Each instance said what happened, once it learned it.
    said = [r.getMessage() for r in caplog.records if "ahead of its clock" in r.getMessage()]
    assert said, [r.getMessage() for r in caplog.records]


@pytest.mark.looptime
async def test_a_database_clock_stepped_back_counts_no_tick_that_ran_as_claimed_elsewhere() -> None:
    """The database's clock steps back 30 s while two instances share 12 jobs
    every second, each tick run by whichever claims it. The instance that claimed
    none of a job's latest ticks learns of the step at its next claim, refused as
    ahead: it waits for the database to come back to that tick, as the other
    one does. It used to go back to the tick after its own last run and claim
    again each tick the other had run, counting every one as claimed elsewhere."""
    database_clock = SteppingClock(START)
    database = MemoryDatabase(database_clock)
    clock = LoopClock(START)
    runs: Counter[tuple[str, float]] = Counter()
    instances = [Scheduler(clock=clock, store=MemoryStore(database, heartbeat=7)) for _ in "ab"]
    for scheduler in instances:
        for n in range(12):

            @scheduler.every(seconds=1, name=f"job{n}")
            async def job(ctx: JobContext) -> None:
                runs[ctx.name, ctx.tick.timestamp()] += 1

    async with AsyncExitStack() as stack:
        for scheduler in instances:
            await stack.enter_async_context(scheduler.running())
        await anyio.sleep(20.5)
        database_clock.step(-30)
        await anyio.sleep(60)
        statuses = [job for scheduler in instances for job in scheduler.status()]
    assert max(runs.values()) == 1
    elsewhere = sum(status.skipped.get("claimed_elsewhere", 0) for status in statuses)
    # Each tick run on one instance is claimed elsewhere on the other, and no more.
    assert elsewhere == sum(runs.values()), (elsewhere, sum(runs.values()))
    for n in range(12):
        ticks = sorted(tick for name, tick in runs if name == f"job{n}")
        assert ticks == [ticks[0] + k for k in range(len(ticks))]  # none left out
        assert ticks[-1] - START.timestamp() >= 50
