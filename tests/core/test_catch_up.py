"""catch_up=: after downtime the latest missed tick runs once, across instances,
within its deadline, and a slow store or a stalled loop loses no tick to it."""

from __future__ import annotations

import logging
import re
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from fastapi_jobs import Every, JobContext, Scheduler
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import claim1, open_store, release1
from ..support.instances import accounted, engine_for, first_runs, instance
from ..support.waiting import poll


async def test_catch_up_runs_the_latest_missed_tick_once_within_the_deadline(
    database_url: str,
) -> None:
    """After downtime across many ticks, one catch-up run for the latest missed tick,
    and none for a job whose deadline is shorter than that tick's age."""
    grid = Every(minutes=10)
    latest = datetime.fromtimestamp(grid.last_at_or_before(time.time()), tz=UTC)
    async with engine_for(database_url) as engine, open_store(engine) as seed:
        for name in ("digest", "late"):
            fence = await claim1(seed, name, (latest - timedelta(hours=5)).timestamp())
            assert fence == 1
            await release1(seed, name, fence, "ok", None, 1.0)

        ticks: dict[str, list[datetime]] = {"digest": [], "late": []}
        scheduler = instance(engine)

        # The latest tick is at most 10 minutes old: within the hour, never
        # within a microsecond.
        @scheduler.every(minutes=10, catch_up=timedelta(hours=1))
        async def digest(ctx: JobContext) -> None:
            ticks["digest"].append(ctx.tick)

        @scheduler.every(minutes=10, catch_up=timedelta(microseconds=1))
        async def late(ctx: JobContext) -> None:
            ticks["late"].append(ctx.tick)

        async with scheduler.running({"db": engine}):
            await poll(lambda: bool(ticks["digest"]) and bool(scheduler.job_status("late").skipped))
        view = await seed.read()
    assert ticks["digest"] == [latest]  # 5 h down: 30 ticks missed, one run
    assert scheduler.job_status("digest").skipped == {"missed": 29}
    assert ticks["late"] == []
    assert scheduler.job_status("late").skipped == {"missed": 30}
    assert view.jobs["digest"].last_tick == latest


async def test_catch_up_never_reruns_a_tick_a_peer_ran(database_url: str) -> None:
    """Two instances starting together catch up on the missed tick once between them."""
    async with engine_for(database_url) as engine, open_store(engine) as seed:
        await release1(seed, "digest", await claim1(seed, "digest", 0.0) or 0, "ok", None, 0.0)
        runs: list[datetime] = []
        async with AsyncExitStack() as stack:
            for _ in range(2):
                scheduler = Scheduler(store=SQLAlchemyStore(engine), shutdown_timeout=5)

                @scheduler.every(hours=1, catch_up=timedelta(hours=2))
                async def digest(ctx: JobContext) -> None:
                    runs.append(ctx.tick)

                await stack.enter_async_context(scheduler.running({"db": engine}))
            await poll(lambda: bool(runs))
            await anyio.sleep(0.3)  # time for the other instance's catch-up
    assert len(runs) == 1


class SlowLastTick(SQLAlchemyStore):
    """A store whose read of a job's last tick takes 0.6 s (a slow database)."""

    read_at = 0.0

    async def last_tick(self, job: str) -> float | None:
        tick = await super().last_tick(job)
        await anyio.sleep(0.6)
        self.read_at = time.time()
        return tick


class Announced(logging.Handler):
    """Notes the tick each "catching up" line names; may then stall the event
    loop for ``stall`` s, as a slow synchronous handler would."""

    def __init__(self, stall: float = 0.0) -> None:
        super().__init__(logging.INFO)
        self.stall, self.ticks = stall, list[float]()

    def emit(self, record: logging.LogRecord) -> None:
        said = re.search(r"catching up on the latest, (\S+)", record.getMessage())
        if said:
            self.ticks.append(datetime.fromisoformat(said.group(1)).timestamp())
            time.sleep(self.stall)


async def run_after_downtime(
    url: str, store: SQLAlchemyStore, announced: Announced
) -> tuple[float, list[float], dict[str, int]]:
    """Seed a last tick 5 s ago, then run a job every 0.25 s (catch_up=10 s) on
    ``store`` until its third run: the seeded tick, the ticks run, the skips."""
    grid = Every(seconds=0.25)
    seeded = grid.last_at_or_before(time.time()) - 5
    async with engine_for(url) as engine:
        async with open_store(engine) as seed:
            await release1(seed, "job", await claim1(seed, "job", seeded) or 0, "ok", None, 0.0)
        logger = logging.getLogger("fastapi_jobs")
        logger.addHandler(announced)
        level, logger.level = logger.level, logging.INFO
        try:
            runs, skipped = await first_runs(engine, store, 3, 0.25, catch_up=10)
        finally:
            logger.removeHandler(announced)
            logger.setLevel(level)
    return seeded, [tick for tick, _ in runs], skipped


@pytest.mark.parametrize("database_url", ["sqlite", "asyncpg"], indirect=True)
async def test_a_slow_store_read_announces_and_runs_the_latest_missed_tick(
    database_url: str,
) -> None:
    """The store takes 0.6 s (over two ticks) to say when the job last ran: the
    catch-up is decided on the time after that read, and the tick announced runs."""
    announced = Announced()
    store = SlowLastTick(lambda state: state["db"])
    seeded, ticks, skipped = await run_after_downtime(database_url, store, announced)
    [tick] = announced.ticks
    assert tick > store.read_at - 0.25 - 0.05  # the latest at the end of the read
    assert ticks[0] == tick
    assert accounted(seeded, ticks, skipped)


@pytest.mark.parametrize("database_url", ["sqlite", "asyncpg"], indirect=True)
async def test_a_stall_after_the_catch_up_is_announced_still_runs_that_tick(
    database_url: str,
) -> None:
    """The event loop stalls 0.6 s right after the announcement, so the next ticks
    come due before the dispatcher gets to it: the announced tick runs, and the
    ticks due meanwhile count as missed."""
    announced = Announced(stall=0.6)
    store = SQLAlchemyStore(lambda state: state["db"])
    seeded, ticks, skipped = await run_after_downtime(database_url, store, announced)
    [tick] = announced.ticks
    assert ticks[0] == tick
    assert ticks[1] - ticks[0] > 0.5  # the ticks of the stall did not run
    assert accounted(seeded, ticks, skipped)


def test_catch_up_needs_a_store() -> None:
    """catch_up= without a store cannot remember anything: refused at declaration."""
    from fastapi_jobs import ConfigurationError

    with pytest.raises(ConfigurationError, match="catch_up= needs the store"):
        Scheduler().every(hours=1, catch_up=60)(_noop)


async def _noop() -> None:
    pass
