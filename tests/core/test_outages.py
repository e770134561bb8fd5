"""The store unreachable or blocked: ticks are skipped, counted and logged, and
the scheduler recovers by itself once the database is back. Real time, a real
PostgreSQL server stopped and started, SQLite files locked or missing."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path

import anyio
import pytest

from fastapi_jobs import JobContext

from ..support.instances import engine_for, hold_lock, instance, ticking
from ..support.postgres import PostgresServer
from ..support.waiting import poll


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_database_down_skips_ticks_and_recovers_by_itself(
    postgres: PostgresServer, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL stopped: ticks are skipped, logged and counted; once it is back,
    runs resume with no help, and no tick ran twice."""
    url = postgres.url(postgres.create_database(), driver=driver)
    ticks: list[datetime] = []
    async with engine_for(url) as engine:
        scheduler = ticking(engine, ticks, lease=3, timeout=0.5)
        async with scheduler.running({"db": engine}):
            await poll(lambda: len(ticks) >= 2)
            await anyio.to_thread.run_sync(postgres.stop)  # ticks run until it is down
            before = len(ticks)
            await poll(lambda: scheduler.job_status("job").skipped.get("store_unavailable", 0) >= 2)
            during = len(ticks)
            await anyio.to_thread.run_sync(postgres.start)
            await poll(lambda: len(ticks) - during >= 3)  # recovered by itself
    assert during - before <= 1  # at most the run claimed just before the stop
    assert len(ticks) == len(set(ticks))
    assert "store unreachable, tick skipped" in caplog.text


async def test_a_release_the_database_missed_is_sent_again_when_it_is_back(
    postgres: PostgresServer,
) -> None:
    """PostgreSQL is down when a run ends, so its release fails: once the database
    is back, the release goes first and the job runs on its next ticks, instead of
    waiting out its own 30 s lease."""
    url = postgres.url(postgres.create_database(), driver="asyncpg")
    started, gate = anyio.Event(), anyio.Event()
    ticks: list[datetime] = []
    async with engine_for(url) as engine:
        scheduler = instance(engine, lease=30, timeout=0.5)

        @scheduler.every(seconds=0.1)
        async def job(ctx: JobContext) -> None:
            ticks.append(ctx.tick)
            started.set()
            await gate.wait()

        async with scheduler.running({"db": engine}):
            await started.wait()
            await anyio.to_thread.run_sync(postgres.stop)
            gate.set()  # the run ends while the database is down
            await anyio.sleep(0.2)
            await anyio.to_thread.run_sync(postgres.start)
            # Well before the first run's 30 s lease would have freed the job.
            await poll(lambda: len(ticks) >= 1 + 3, within=15)
    assert len(ticks) == len(set(ticks))


async def test_sqlite_unreachable_file_skips_ticks_and_recovers(tmp_path: Path) -> None:
    """A SQLite file that cannot be opened: ticks are skipped until it can."""
    folder = tmp_path / "not-yet"
    ticks: list[datetime] = []
    async with engine_for(f"sqlite+aiosqlite:///{folder / 'jobs.sqlite3'}") as engine:
        scheduler = ticking(engine, ticks, lease=3, timeout=0.5)
        async with scheduler.running({"db": engine}):
            await poll(lambda: scheduler.job_status("job").skipped.get("store_unavailable", 0) >= 3)
            assert ticks == []
            await anyio.Path(folder).mkdir()
            await poll(lambda: len(ticks) >= 3)  # a wide margin: the tables are made first


async def test_statements_blocked_past_the_timeout_leave_nothing_behind(
    database_url: str,
) -> None:
    """Store statements held up by a lock longer than the store timeout: the ticks
    are skipped, runs resume once the lock goes, a claim that came back late does
    not hold the job, and once stopped no task or connection is left behind
    (a statement cut mid-way once left the aiosqlite shim's close pending forever,
    so the event loop could not shut down)."""
    ticks: list[datetime] = []
    async with engine_for(database_url) as engine:
        scheduler = ticking(engine, ticks, lease=9, timeout=0.2)

        def unavailable() -> int:
            return scheduler.job_status("job").skipped.get("store_unavailable", 0)

        async with scheduler.running({"db": engine}):
            # Lock halfway between two ticks: the last run has released its claim
            # (a release the lock held up would keep the job for its 3 s lease).
            await poll(lambda: len(ticks) >= 1)
            await anyio.sleep((0.05 - time.time()) % 0.1)
            # Locked until three ticks are skipped, however long that takes;
            # the runs counted from the moment the lock is held (a stalled
            # thread may take more than a tick to get it).
            at_lock: list[int] = []
            await hold_lock(
                database_url,
                engine,
                10.0,
                until=lambda: unavailable() >= 3,
                locked=lambda: at_lock.append(len(ticks)),
            )
            before, during = at_lock[0], len(ticks)
            # Well within the 9 s lease: claims that came back late were freed.
            await poll(lambda: len(ticks) - during >= 3, within=6.0)
        skipped = unavailable()
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == []
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert during - before <= 1  # at most the run claimed just before the lock
    assert skipped >= 3
    assert len(ticks) == len(set(ticks))
