"""Overlap policies on a store, on every backend: a replace job's claim takes
over a held lease and records the run it replaces; two schedulers sharing a
database run queue_one's kept tick once, after the release, and replace's
new tick with a higher fence (the old holder's run cancelled)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import anyio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs._store import Ended
from fastapi_jobs.stores import SQLAlchemyStore

from ..support.waiting import poll
from .test_store import opened


async def test_a_replace_claim_takes_over_a_held_lease_and_records_the_run_it_replaces(
    database_url: str,
) -> None:
    async with opened(database_url) as (store, engine):
        claimed = await store.claim([("job", 10.0)])
        fence = claimed["job"]
        assert isinstance(fence, int)
        # Held: an ordinary claim of a newer tick is refused; a replace claim is not.
        assert await store.claim([("job", 20.0)]) == {}
        taken = await store.claim([("job", 20.0), ("other", 20.0)], replace=["job"])
        assert set(taken) == {"job", "other"}
        assert taken["job"] == fence + 1
        # Never an older or the same tick, even for replace.
        assert await store.claim([("job", 20.0)], replace=["job"]) == {}
        assert await store.claim([("job", 15.0)], replace=["job"]) == {}
        # The old holder's renewal sees the new fence; its release changes nothing.
        assert not await store.renew("job", fence)
        runs = await store.runs("job", 10)
        assert [(r.id, r.outcome, r.tick) for r in runs] == [
            (str(fence), "cancelled", datetime.fromtimestamp(10.0, UTC))
        ]
        assert runs[0].error is not None
        assert runs[0].error.type == "RunReplacedError"
        assert "replaced by the newer tick claimed by" in runs[0].error.message
        # A replace claim of a free job records nothing.
        new = taken["job"]
        assert isinstance(new, int)
        await store.release([Ended("job", new, "ok", None, 0.1)])
        assert set(await store.claim([("job", 30.0)], replace=["job"])) == {"job"}
        async with engine.connect() as conn:
            count = await conn.scalar(sa.select(sa.func.count()).select_from(store.tables.runs))
        assert count == 2  # the replaced run and the released one


async def test_a_paused_replace_job_takes_nothing_over(database_url: str) -> None:
    async with opened(database_url) as (store, _):
        assert set(await store.claim([("job", 10.0)])) == {"job"}
        await store.pause("job", None)
        assert await store.claim([("job", 20.0)], replace=["job"]) == {}
        assert await store.runs("job", 10) == []


def _scheduler(url: str, **options: object) -> Scheduler:
    store = SQLAlchemyStore(url, lease=6, timeout=1.5, heartbeat=0.5)
    return Scheduler(store=store, shutdown_timeout=5, **options)  # type: ignore[arg-type]


Row = tuple[int, float, str, float, float]  # fence, tick, outcome, started_at, finished_at


async def _history(url: str) -> list[Row]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                sa.text(
                    "SELECT fence, tick, outcome, started_at, finished_at FROM fastapi_jobs_runs "
                    "WHERE job = 'long' ORDER BY fence"
                )
            )
            return [(int(f), float(t), str(o), float(s), float(e)) for f, t, o, s, e in result]
    finally:
        await engine.dispose()


async def test_queue_one_on_two_schedulers_runs_the_kept_tick_once_after_the_release(
    database_url: str,
) -> None:
    """A's first run takes ~2.2 ticks; the ticks during it are refused to B
    (lease held) and one is kept by A, which claims it after its release."""
    starts: Counter[str] = Counter()
    long_done = anyio.Event()

    def declare(scheduler: Scheduler, who: str) -> None:
        @scheduler.every(seconds=1, overlap="queue_one")
        async def long(ctx: JobContext) -> None:
            starts[who] += 1
            if sum(starts.values()) == 1:
                await anyio.sleep(2.2)
                long_done.set()

    a, b = _scheduler(database_url), _scheduler(database_url)
    declare(a, "a")
    declare(b, "b")
    async with a.running():
        await poll(lambda: sum(starts.values()) == 1, within=10)
        first = "a" if starts["a"] else "b"
        async with b.running():
            await long_done.wait()
            await poll(lambda: sum(starts.values()) >= 2, within=10)
            await anyio.sleep(0.3)
    rows = await _history(database_url)
    ticks = [row[1] for row in rows]
    assert len(ticks) == len(set(ticks))  # each tick once in the cluster
    long_run, kept = rows[0], rows[1]
    assert kept[1] == long_run[1] + 1  # the tick right after the long run's
    assert kept[3] >= long_run[4]  # started after the long run ended
    assert kept[0] == long_run[0] + 1
    assert first  # the long run's instance kept it: see the starts
    assert starts[first] >= 2


async def test_replace_on_two_schedulers_cancels_the_run_and_runs_the_new_tick(
    database_url: str,
) -> None:
    started: list[tuple[str, datetime]] = []
    cancelled = anyio.Event()

    def declare(scheduler: Scheduler, who: str) -> None:
        @scheduler.every(seconds=1, overlap="replace")
        async def long(ctx: JobContext) -> None:
            started.append((who, ctx.tick))
            if len(started) == 1:
                try:
                    await anyio.sleep(30)
                finally:
                    cancelled.set()

    a, b = _scheduler(database_url), _scheduler(database_url)
    declare(a, "a")
    declare(b, "b")
    async with a.running(), b.running():
        with anyio.fail_after(10):
            await cancelled.wait()
        await poll(lambda: len(started) >= 2, within=10)
        await anyio.sleep(0.5)
    rows = await _history(database_url)
    assert rows[0][2] == "cancelled"
    later = [row for row in rows[1:] if row[1] > rows[0][1]]
    assert later and later[0][0] > rows[0][0]  # a higher fence, a newer tick
    assert len([row for row in rows if row[0] == rows[0][0]]) == 1  # recorded once
    assert started[1][1] > started[0][1]
    assert all(t.tzinfo is UTC for _, t in started)
