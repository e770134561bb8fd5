"""Schedulers on a real store standing for instances in one process, and what
the claims, leases, outages and catch-up tests share: an engine, a run of first
ticks, a lock held by another client, the check that every tick is accounted for."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

import anyio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fastapi_jobs import Every, JobContext, Scheduler
from fastapi_jobs.observers import TickSkipped
from fastapi_jobs.stores import SQLAlchemyStore

from .waiting import poll


@asynccontextmanager
async def engine_for(url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the test's database with the store's tables made and (on
    PostgreSQL, where the store uses the app's pool) a connection in its pool: a
    store's first claim is then one statement, within the short timeouts these
    tests use, even on a loaded machine. A database that cannot be reached is
    left as it is (some tests start that way)."""
    engine = create_async_engine(url)
    try:
        with contextlib.suppress(sa.exc.DBAPIError, OSError):
            async with engine.begin() as conn:
                await conn.run_sync(SQLAlchemyStore(engine).tables.metadata.create_all)
        yield engine
    finally:
        await engine.dispose()


def instance(engine: AsyncEngine, **store_options: object) -> Scheduler:
    store = SQLAlchemyStore(lambda state: state["db"], **store_options)  # type: ignore[arg-type]
    return Scheduler(store=store, shutdown_timeout=5)


def ticking(engine: AsyncEngine, ticks: list[datetime], **store_options: object) -> Scheduler:
    """An instance with one job every 100 ms that notes the ticks it runs."""
    scheduler = instance(engine, **store_options)

    @scheduler.every(seconds=0.1)
    async def job(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    return scheduler


async def hold_lock(
    url: str,
    engine: AsyncEngine,
    seconds: float,
    until: Callable[[], bool] | None = None,
    locked: Callable[[], None] | None = None,
) -> None:
    """Another client locks the claims for ``seconds``, or until ``until()`` holds
    (looked at every 10 ms, for ``seconds`` at most): store statements block.
    ``locked()`` is called once the lock is held (from another thread, on
    SQLite): what ran before the lock is told from what ran during it however
    long the lock took to come."""

    def over(deadline: float) -> bool:
        return time.monotonic() >= deadline or (until is not None and until())

    if url.startswith("sqlite"):
        path = url.split("///", 1)[1]

        def hold() -> None:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            if locked is not None:
                locked()
            deadline = time.monotonic() + seconds
            while not over(deadline):
                time.sleep(0.01)
            conn.execute("COMMIT")
            conn.close()

        await anyio.to_thread.run_sync(hold)
    else:
        async with engine.begin() as conn:
            await conn.execute(sa.text("LOCK TABLE fastapi_jobs_claims IN ACCESS EXCLUSIVE MODE"))
            if locked is not None:
                locked()
            with anyio.move_on_after(seconds):
                await poll(lambda: until is not None and until(), within=math.inf, every=0.01)


class Seeing:
    """An observer that keeps every skip."""

    def __init__(self, seen: list[TickSkipped]) -> None:
        self.seen = seen

    def tick_skipped(self, event: TickSkipped) -> None:
        self.seen.append(event)


async def first_runs(
    engine: AsyncEngine,
    store: SQLAlchemyStore,
    n: int,
    every: float,
    *,
    catch_up: float | None = None,
    run_seconds: float = 0.0,
    seen: list[TickSkipped] | None = None,
) -> tuple[list[tuple[float, float]], dict[str, int]]:
    """Run one job every ``every`` s on ``store`` (each run ``run_seconds`` long)
    until its ``n``th run starts: each run's tick and start, and the job's skips
    until then (a tick that comes while the scheduler stops is not one of them);
    each skip as it came, in ``seen``, for a failure to show."""
    scheduler = Scheduler(store=store, shutdown_timeout=5)
    if seen is not None:
        scheduler.add_observer(Seeing(seen))
    runs: list[tuple[float, float]] = []
    skipped: dict[str, int] = {}
    nth = anyio.Event()

    @scheduler.every(seconds=every, catch_up=catch_up)
    async def job(ctx: JobContext) -> None:
        runs.append((ctx.tick.timestamp(), time.time()))
        if len(runs) == n:
            skipped.update(scheduler.job_status("job").skipped)
            nth.set()
        await anyio.sleep(run_seconds)

    async with scheduler.running({"db": engine}):
        with anyio.fail_after(10):
            await nth.wait()
    return runs, skipped


def accounted(
    seeded: float, ticks: list[float], skipped: dict[str, int], every: float = 0.25
) -> bool:
    """Every tick after ``seeded`` up to the last run either ran once or was counted
    as skipped."""
    due, _ = Every(seconds=every).ticks_between(seeded, ticks[-1])
    return len(set(ticks)) == len(ticks) and len(ticks) + sum(skipped.values()) == due
