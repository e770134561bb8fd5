"""`fastapi_jobs.testing.virtual`: the app's own scheduler, built with a real
clock and store, run in virtual time on a memory store for a block."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from fastapi_jobs import ConfigurationError, Every, JobContext, Scheduler, SystemClock
from fastapi_jobs.queues import HandoffRequest
from fastapi_jobs.stores import SQLAlchemyStore
from fastapi_jobs.testing import LoopClock, MemoryDatabase, MemoryStore, virtual

pytestmark = pytest.mark.looptime
START = datetime(2026, 3, 2, tzinfo=UTC)


def an_app(path: Path, ticks: list[datetime]) -> tuple[Scheduler, SQLAlchemyStore]:
    store = SQLAlchemyStore(f"sqlite+aiosqlite:///{path}", lease=12, timeout=3, heartbeat=7)
    scheduler = Scheduler(store=store)

    @scheduler.every(minutes=1)
    async def job(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    return scheduler, store


async def test_the_block_runs_on_a_loop_clock_and_a_memory_store_then_gives_them_back(
    tmp_path: Path,
) -> None:
    """Inside, the jobs tick on virtual time from the start given, claimed in a
    memory store with the real store's lease, timeout and heartbeat (the SQLite
    file is never made); after, the scheduler has its own clock and store."""
    ticks: list[datetime] = []
    scheduler, store = an_app(tmp_path / "jobs.sqlite3", ticks)
    with virtual(scheduler, START) as clock:
        assert isinstance(clock, LoopClock) and scheduler.clock is clock
        memory = scheduler.store
        assert isinstance(memory, MemoryStore)
        assert (memory.lease, memory.timeout, memory.heartbeat) == (12, 3, 7)
        async with scheduler.running():
            await anyio.sleep(3 * 60 + 1)
        assert scheduler.job_status("job").claims
    assert ticks == [datetime(2026, 3, 2, 0, m, tzinfo=UTC) for m in (1, 2, 3)]
    assert scheduler.store is store and isinstance(scheduler.clock, SystemClock)
    assert not (tmp_path / "jobs.sqlite3").exists()


async def test_each_block_starts_the_jobs_afresh_and_may_share_a_database() -> None:
    """A second block starts with no runs, no counts and no operator's pause;
    given a database, the memory store keeps its rows between blocks."""
    scheduler = Scheduler(store=MemoryStore())

    @scheduler.every(minutes=1)
    async def job() -> None: ...

    database = MemoryDatabase()
    with virtual(scheduler, START, database=database):
        async with scheduler.running():
            await anyio.sleep(61)
            await scheduler.pause("job")
            await anyio.sleep(60)
        assert scheduler.job_status("job").runs == 1
    with virtual(scheduler, START, database=database):
        status = scheduler.job_status("job")
        assert (status.runs, status.paused, status.skipped) == (0, False, {})
        async with scheduler.running():
            await anyio.sleep(61)  # the pause is the store's: read at the start
            assert scheduler.job_status("job").paused
    assert database.pauses


async def test_wrong_arguments_and_a_running_scheduler_are_refused() -> None:
    """Not a scheduler, a naive or missing start, and a scheduler already
    running are refused, each saying what to do."""
    scheduler = Scheduler()

    @scheduler.every(minutes=1)
    async def job() -> None: ...

    with (
        pytest.raises(ConfigurationError, match="pass the app's Scheduler"),
        virtual("scheduler", START),  # type: ignore[arg-type]
    ):
        pass
    for start in (datetime(2026, 3, 2), "2026-03-02", None):
        with (
            pytest.raises(ConfigurationError, match="aware datetime"),
            virtual(scheduler, start),  # type: ignore[arg-type]
        ):
            pass
    async with scheduler.running():
        with (
            pytest.raises(ConfigurationError, match="before the app starts"),
            virtual(scheduler, START),
        ):
            pass


class Recorded:
    """A queue that keeps each request it is given (its outbox among them)."""

    name = "recorded queue"

    def __init__(self) -> None:
        self.requests: list[HandoffRequest] = []

    async def enqueue(self, request: HandoffRequest) -> str:
        self.requests.append(request)
        return request.key


async def test_a_hand_off_in_the_block_uses_the_memory_stores_outbox_none(tmp_path: Path) -> None:
    """A hand-off job declared with a SQL store (whose outbox Celery's hand-off
    uses) runs in the block with the store it has there, which keeps no
    outbox: its request says none, instead of failing on the SQL store's."""
    queue = Recorded()
    scheduler = Scheduler(store=SQLAlchemyStore(f"sqlite+aiosqlite:///{tmp_path / 'j.sqlite3'}"))

    @scheduler.every(minutes=1, enqueue=queue)
    def digest() -> dict[str, object]:
        return {"audience": "all"}

    with virtual(scheduler, START):
        async with scheduler.running():
            await anyio.sleep(61)
    [request] = queue.requests
    assert request.outbox is None and request.kwargs == {"audience": "all"}


async def test_a_sync_jobs_thread_holds_virtual_time_back() -> None:
    """looptime cannot see anyio's worker threads; the scheduler shows it a
    sync job's: virtual time waits for each run (without that, it ran past the
    threads, and an every-minute job ran 11 to 52 times in an hour, its other
    ticks skipped as overlap)."""
    scheduler = Scheduler()
    runs: list[float] = []

    @scheduler.every(minutes=1)
    def tick() -> None:
        runs.append(time.monotonic())

    with virtual(scheduler, START):
        async with scheduler.running():
            await anyio.sleep(3630)
            [status] = scheduler.status()
    assert (len(runs), status.runs, status.skipped_ticks) == (60, 60, 0)


async def test_sync_jobs_by_the_dozen_leave_the_loops_threads_free() -> None:
    """Forty sync jobs at once, each asking the loop for work in its default
    executor (as a DNS lookup does): none waits behind the others. Virtual
    time once parked a thread of that executor per running sync job, and six
    of them took every thread (on two cores)."""
    scheduler = Scheduler()
    runs: list[str] = []

    async def lookup() -> int:
        return await asyncio.get_running_loop().run_in_executor(None, int, "1")

    for n in range(40):

        def job(ctx: JobContext) -> None:
            assert anyio.from_thread.run(lookup) == 1
            runs.append(ctx.name)

        scheduler.add_job(job, Every(minutes=1), name=f"sync{n}")

    with virtual(scheduler, START):
        async with scheduler.running():
            await anyio.sleep(3 * 60 + 30)
    assert Counter(runs) == {f"sync{n}": 3 for n in range(40)}
