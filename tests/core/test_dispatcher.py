"""The dispatcher, driven by virtual time: bursts woken in slices, jobs that share
an instant, schedules that fail, and jobs that get their task when first due."""

from __future__ import annotations

import asyncio
import itertools
import logging
from datetime import timedelta

import anyio
import pytest

from fastapi_jobs import Every, Schedule, Scheduler

from ..conftest import HOUR, START, virtual_scheduler

pytestmark = pytest.mark.looptime

SLICE = 50  # what the docs promise (Performance): a request waits behind at most this many jobs


async def test_a_burst_is_woken_in_slices_with_turns_of_the_loop_between() -> None:
    """500 jobs due at one instant: something else waiting on the event loop (a
    request) gets a turn after every slice of 50 jobs, on the first tick (when the
    jobs get their tasks) and on the next ones (tasks parked between runs)."""
    scheduler = virtual_scheduler()
    runs: list[int] = []
    turns: list[int] = []  # how many jobs had run, at each turn the probe got
    probing = False

    async def probe(until: int) -> None:
        # Stands for a request: it only needs the loop to turn.
        while len(runs) < until:
            turns.append(len(runs))
            await asyncio.sleep(0)
        turns.append(len(runs))

    for n in range(500):

        async def job(n: int = n) -> None:
            nonlocal probing
            if not probing:  # the burst's first job starts the probe
                probing = True
                asyncio.get_running_loop().create_task(probe(len(runs) + 500))
            runs.append(n)

        scheduler.add_job(job, Every(seconds=1), name=f"job{n}")

    async with scheduler.running():
        await anyio.sleep(1.5)  # the first tick, when the jobs get their tasks
        first = turns.copy()
        turns.clear()
        probing = False
        await anyio.sleep(1)  # the second, with tasks parked between runs
    for seen in (first, turns):
        assert seen[-1] - seen[0] >= 500 - SLICE  # the probe saw the burst from its first slice
        steps = [b - a for a, b in itertools.pairwise(seen)]
        assert max(steps) <= SLICE
        assert len(steps) >= 500 // SLICE - 1
    assert len(runs) == 1000


async def test_jobs_on_different_grids_share_instants_and_each_keeps_its_own() -> None:
    """Jobs at 1 s, 2 s and 3 s (and one off the grid by 0.5 s) over 12 virtual
    seconds: each runs on its own ticks, exactly, and none is run twice."""
    scheduler = virtual_scheduler()
    runs: dict[str, list[float]] = {"s1": [], "s2": [], "s3": [], "half": []}
    grids = {"s1": (1, 0), "s2": (2, 0), "s3": (3, 0), "half": (2, 0.5)}
    for name, (seconds, offset) in grids.items():

        async def job(name: str = name) -> None:
            runs[name].append(scheduler.clock.now() - START.timestamp())

        scheduler.add_job(job, Every(seconds=seconds, offset=offset), name=name)
    async with scheduler.running():
        await anyio.sleep(12.2)
    for name, (seconds, offset) in grids.items():
        expected = [k * seconds + offset for k in range(13) if 0 < k * seconds + offset <= 12.2]
        assert runs[name] == pytest.approx(expected, abs=1e-3), name


async def test_a_schedule_that_fails_stops_its_job_only(caplog: pytest.LogCaptureFixture) -> None:
    """A schedule of the user's that raises after a while: its job stops ticking,
    with the error logged and no next run shown; every other job goes on."""

    class Breaks(Schedule):
        def __init__(self) -> None:
            self.asked = 0

        def next_after(self, ts: float) -> float:
            self.asked += 1
            if self.asked > 3:
                raise ZeroDivisionError("the schedule's own bug")
            return (int(ts // HOUR) + 1) * HOUR

        def describe(self) -> str:
            return "breaks"

    scheduler = virtual_scheduler()
    runs: list[str] = []

    @scheduler.every(hours=1)
    async def steady() -> None:
        runs.append("steady")

    async def fragile() -> None:
        runs.append("fragile")

    scheduler.add_job(fragile, Breaks())

    @scheduler.every(hours=1)  # after the fragile one, at the same instants
    async def later() -> None:
        runs.append("later")

    with caplog.at_level(logging.ERROR):
        async with scheduler.running():
            await anyio.sleep(6 * HOUR + 1)
            status = scheduler.job_status("fragile")
    assert runs.count("steady") == runs.count("later") == 6
    assert 1 <= runs.count("fragile") <= 3
    assert status.next_run_at is None
    assert "job 'fragile': its schedule failed (ZeroDivisionError" in caplog.text


async def test_hourly_jobs_have_no_task_before_their_first_tick() -> None:
    """1,000 hourly jobs cost no task until they first come due; then each keeps
    one, parked between runs, and all end with the scheduler."""
    scheduler = virtual_scheduler(start=START + timedelta(minutes=30))
    ran = 0

    for n in range(1000):

        async def job() -> None:
            nonlocal ran
            ran += 1

        scheduler.add_job(job, Every(hours=1), name=f"job{n}")
    before = len(asyncio.all_tasks())
    async with scheduler.running():
        await anyio.sleep(60)
        idle = len(asyncio.all_tasks()) - before
        await anyio.sleep(HOUR)
        after_first = len(asyncio.all_tasks()) - before
    assert idle < 10  # the scheduler's own few tasks
    assert after_first >= 1000
    assert ran == 1000
    assert len(asyncio.all_tasks()) == before


async def test_a_scheduler_started_twice_ticks_the_same_both_times() -> None:
    """Stopped and started again, the jobs tick from scratch, with fresh tasks."""
    scheduler = virtual_scheduler()
    runs: list[float] = []

    @scheduler.every(hours=1)
    async def hourly() -> None:
        runs.append(scheduler.clock.now())

    for _ in range(2):
        async with scheduler.running():
            await anyio.sleep(2 * HOUR + 1)
    assert len(runs) == 4
    assert isinstance(scheduler, Scheduler)
