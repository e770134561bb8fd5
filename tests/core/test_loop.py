"""The loop of one job, driven by virtual time (looptime): ticks, overlap, misses,
isolation, timeouts and sync jobs."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs.testing import LoopClock

from ..conftest import HOUR, START, virtual_scheduler

pytestmark = pytest.mark.looptime


def at(hours: float) -> datetime:
    return START + timedelta(hours=hours)


async def test_hourly_job_runs_on_each_full_hour() -> None:
    """24 virtual hours of an hourly job: 24 runs, each on its grid tick."""
    scheduler = virtual_scheduler(start=START + timedelta(minutes=17, seconds=23))
    ticks: list[datetime] = []

    @scheduler.every(hours=1)
    async def hourly(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    async with scheduler.running():
        await anyio.sleep(24 * HOUR)
    assert ticks == [at(h) for h in range(1, 25)]


async def test_next_tick_comes_from_the_grid_not_from_the_end_of_the_run() -> None:
    """A run that takes 10 minutes does not push the following ticks back."""
    scheduler = virtual_scheduler()
    started: list[float] = []

    @scheduler.every(hours=1)
    async def slow() -> None:
        started.append(scheduler.clock.now())
        await anyio.sleep(600)

    async with scheduler.running():
        await anyio.sleep(5 * HOUR + 1)
    assert started == [at(h).timestamp() for h in range(1, 6)]


async def test_tick_during_a_run_is_dropped_and_counted() -> None:
    """A run of 90 minutes on an hourly job: the tick that came meanwhile is dropped."""
    scheduler = virtual_scheduler()
    ticks: list[datetime] = []

    @scheduler.every(hours=1)
    async def long(ctx: JobContext) -> None:
        ticks.append(ctx.tick)
        await anyio.sleep(1.5 * HOUR)

    async with scheduler.running():
        await anyio.sleep(6 * HOUR + 1)
        status = scheduler.job_status("long")
    # Ran at 1h (to 2.5h), 2h dropped, ran at 3h (to 4.5h), 4h dropped, ran at 5h
    # (to 6.5h), 6h dropped: counted as it is dropped, not when the run ends.
    assert ticks == [at(1), at(3), at(5)]
    assert status.skipped == {"overlap": 3}
    assert status.skipped_ticks == 3
    assert status.runs == 3


class JumpingClock(LoopClock):
    """A LoopClock whose wall time can jump ahead while the loop sleeps, as
    when the machine is suspended (the monotonic clock stops) or the loop is
    blocked."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.jump = 0.0

    def now(self) -> float:
        return super().now() + self.jump


async def test_after_the_machine_slept_only_the_latest_due_tick_runs() -> None:
    """Waking hours late runs the latest tick once and counts the ones it missed."""
    clock = JumpingClock(START)
    scheduler = Scheduler(clock=clock)
    ticks: list[datetime] = []

    @scheduler.every(hours=1)
    async def hourly(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    async with scheduler.running():
        await anyio.sleep(1.5 * HOUR)  # ran at 1h, now sleeping until 2h
        clock.jump = 4.2 * HOUR  # "suspended": 1.5h loop time is now 5.7h wall
        # The clock's watch sees the jump within a minute (not at 2h loop time, when
        # the timer would have woken): 5h runs at once, then 6h and 7h (2.8h loop).
        await anyio.sleep(1.5 * HOUR)
        status = scheduler.job_status("hourly")
    assert ticks == [at(1), at(5), at(6), at(7)]
    assert status.skipped == {"missed": 3}


async def test_run_on_startup_runs_once_at_start_then_on_the_grid() -> None:
    """run_on_startup=True adds one run when the scheduler starts."""
    scheduler = virtual_scheduler(start=START + timedelta(minutes=20))
    ticks: list[datetime] = []

    @scheduler.every(hours=1, run_on_startup=True)
    async def warm(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    async with scheduler.running():
        await anyio.sleep(2 * HOUR)
    assert ticks == [START + timedelta(minutes=20), at(1), at(2)]


async def test_cron_job_runs_on_weekday_mornings_in_its_timezone() -> None:
    """A week of virtual time: '0 7 * * mon-fri' Lisbon runs five times at 07:00 local."""
    scheduler = virtual_scheduler()
    ticks: list[datetime] = []

    @scheduler.cron("0 7 * * mon-fri", tz="Europe/Lisbon")
    async def digest(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    async with scheduler.running():
        await anyio.sleep(7 * 24 * HOUR)
    # March 2026, before DST: Lisbon is UTC+0.
    assert ticks == [START + timedelta(days=d, hours=7) for d in range(5)]


async def test_failing_job_is_logged_recorded_and_runs_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception is logged with name, error, duration and traceback; the next tick runs."""
    scheduler = virtual_scheduler()
    calls = 0

    @scheduler.every(hours=1)
    async def flaky() -> None:
        nonlocal calls
        calls += 1
        await anyio.sleep(2)
        if calls == 1:
            raise ValueError("bad row 42")

    with caplog.at_level(logging.ERROR, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(1 * HOUR + 10)
            failed = scheduler.job_status("flaky")
            await anyio.sleep(1 * HOUR)
            recovered = scheduler.job_status("flaky")

    assert failed.last_outcome == "failed"
    assert failed.last_error is not None
    assert (failed.last_error.type, failed.last_error.message) == ("ValueError", "bad row 42")
    assert failed.failures == 1
    assert recovered.last_outcome == "ok"
    assert recovered.runs == 2 and recovered.failures == 1
    [record] = caplog.records
    assert record.name == "fastapi_jobs.flaky"
    assert "'flaky' failed after 2.000s" in record.getMessage()
    assert "bad row 42" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert "raise ValueError" in caplog.text  # the traceback


async def test_failing_job_does_not_affect_other_jobs() -> None:
    """One job raising on every tick leaves another job's runs untouched."""
    scheduler = virtual_scheduler()
    good_runs = 0

    @scheduler.every(minutes=1)
    async def broken() -> None:
        raise RuntimeError("always")

    @scheduler.every(minutes=1)
    async def good() -> None:
        nonlocal good_runs
        good_runs += 1

    async with scheduler.running():
        await anyio.sleep(10 * 60 + 1)
    assert good_runs == 10
    assert scheduler.job_status("broken").failures == 10


async def test_timeout_cancels_the_run_and_records_it() -> None:
    """A run that passes its timeout is cancelled, recorded as timed out, and the next tick runs."""
    scheduler = virtual_scheduler()
    finished = 0

    @scheduler.every(hours=1, timeout=timedelta(minutes=1))
    async def stuck() -> None:
        nonlocal finished
        await anyio.sleep(2 * HOUR)
        finished += 1

    async with scheduler.running():
        await anyio.sleep(HOUR + 61)
        status = scheduler.job_status("stuck")
        assert status.last_outcome == "timed_out"
        assert status.last_duration_s == pytest.approx(60)
        assert status.last_error is not None and status.last_error.type == "TimeoutError"
        await anyio.sleep(HOUR)
        assert scheduler.job_status("stuck").runs == 2
    assert finished == 0


async def test_outside_cancellation_is_recorded_and_never_swallowed() -> None:
    """A run cancelled from outside records 'cancelled' and lets the cancellation through."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def slow() -> None:
        await anyio.sleep(HOUR)

    with anyio.move_on_after(5) as scope:
        await scheduler.run_now("slow")
        pytest.fail("the cancellation was swallowed")
    assert scope.cancelled_caught
    assert scheduler.job_status("slow").last_outcome == "cancelled"
    assert scheduler.job_status("slow").running is False


async def test_sync_job_runs_in_a_worker_thread_and_leaves_the_loop_free() -> None:
    """A sync job blocks only its thread: the loop keeps running while it waits."""
    # Under looptime, virtual time flies while a thread works: no deadline here.
    scheduler = virtual_scheduler(shutdown_timeout=None)
    started, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    @scheduler.every(hours=1)
    def blocking(ctx: JobContext) -> None:
        seen["thread"] = threading.get_ident()
        seen["tick"] = ctx.tick
        started.set()
        # If this ran on the event loop, nothing could set `release`.
        seen["released"] = release.wait(timeout=10)

    async with scheduler.running():
        await anyio.to_thread.run_sync(started.wait)
        assert scheduler.job_status("blocking").running
        release.set()  # set from the loop, while the job is blocked
    # Leaving the block waited for the run in flight (no shutdown deadline).
    assert seen["thread"] != threading.get_ident()
    assert seen["released"] is True
    assert seen["tick"] == at(1)
    assert scheduler.job_status("blocking").last_outcome == "ok"


async def test_async_job_runs_on_the_event_loop() -> None:
    """An async job runs on the loop's own thread."""
    scheduler = virtual_scheduler()
    threads: list[int] = []

    @scheduler.every(hours=1)
    async def on_loop() -> None:
        threads.append(threading.get_ident())

    async with scheduler.running():
        await anyio.sleep(HOUR + 1)
    assert threads == [threading.get_ident()]


async def test_many_jobs_each_keep_their_own_schedule() -> None:
    """Jobs of different intervals interleave without affecting each other."""
    scheduler = virtual_scheduler()
    counts = dict.fromkeys(["a", "b", "c"], 0)

    def make(name: str) -> None:
        async def job() -> None:
            counts[name] += 1

        minutes = {"a": 1, "b": 5, "c": 60}[name]
        scheduler.add_job(job, __import__("fastapi_jobs").Every(minutes=minutes), name=name)

    for name in counts:
        make(name)
    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 1)
    assert counts == {"a": 120, "b": 24, "c": 2}


async def test_status_next_run_at_follows_the_loop() -> None:
    """next_run_at is the tick the job waits for; null when stopped, also for a
    job that never came due while the scheduler ran."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def hourly() -> None:
        pass

    @scheduler.every(days=1)
    async def daily() -> None:
        pass

    assert scheduler.job_status("hourly").next_run_at is None
    async with scheduler.running():
        await anyio.sleep(10)
        assert scheduler.job_status("hourly").next_run_at == at(1)
        assert scheduler.job_status("daily").next_run_at == at(24)
        await anyio.sleep(HOUR)
        assert scheduler.job_status("hourly").next_run_at == at(2)
    assert scheduler.job_status("hourly").next_run_at is None
    assert scheduler.job_status("daily").next_run_at is None


async def test_loop_clock_reads_virtual_wall_time() -> None:
    """LoopClock maps loop time to wall time from its start."""
    clock = LoopClock(START)
    first = clock.now()
    await anyio.sleep(HOUR)
    assert clock.now() - first == pytest.approx(HOUR)
    assert first == START.timestamp()
    assert datetime.fromtimestamp(first, UTC) == START
