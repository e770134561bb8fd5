"""The store calls of each instant: the releases a claim finds gathered go in its
own call, a release goes at once (it does not wait for a claim), and the claims
and releases keep one connection between them. Real time and a real database,
short intervals (the database's clock decides leases)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs._core.claims import Claims
from fastapi_jobs.stores import Ended, Instance, SQLAlchemyStore

from ..conftest import claim1, open_store
from ..support.instances import engine_for
from ..support.waiting import poll


class CountingStore(SQLAlchemyStore):
    """The SQLAlchemy store, counting the calls the scheduler makes of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: Counter[str] = Counter()

    async def claim(self, wanted: Sequence[tuple[str, float]], **given: Any) -> dict[str, Any]:
        self.calls["claim"] += 1
        return await super().claim(wanted, **given)

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        self.calls["release"] += 1
        return await super().release(ended)

    async def release_then_claim(
        self, ended: Sequence[Ended], wanted: Sequence[tuple[str, float]], **given: Any
    ) -> tuple[dict[str, Exception], dict[str, int | Exception]]:
        self.calls["release_then_claim"] += 1
        return await super().release_then_claim(ended, wanted, **given)


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[tuple[SQLAlchemyStore, AsyncEngine]]:
    async with engine_for(url) as engine, open_store(engine) as store:
        yield store, engine


async def released(url: str) -> list[tuple[Any, ...]]:
    async with engine_for(url) as engine, engine.connect() as conn:
        query = "SELECT job, outcome, lease_until, fence FROM fastapi_jobs_claims ORDER BY job"
        return [tuple(row) for row in (await conn.execute(sa.text(query))).all()]


async def history(url: str) -> Counter[str]:
    async with engine_for(url) as engine, engine.connect() as conn:
        query = "SELECT job FROM fastapi_jobs_runs"
        return Counter(row[0] for row in (await conn.execute(sa.text(query))).all())


async def test_release_then_claim_frees_the_runs_before_and_claims_in_one_call(
    database_url: str,
) -> None:
    """The releases a claim finds gathered go in its call, first: a job's next
    tick is claimed over its own previous claim (released just before), the run
    before is in the history once, and a peer's claim is still refused."""
    async with opened(database_url) as (store, engine), open_store(engine) as peer:
        assert await claim1(store, "a", 100.0) == 1
        assert await claim1(store, "b", 100.0) == 1
        assert await claim1(peer, "c", 100.0) == 1
        ended = [Ended("a", 1, "ok", None, 0.1), Ended("b", 1, "failed", "boom", 0.2, 1)]
        refused, fences = await store.release_then_claim(ended, [("a", 101.0), ("c", 101.0)])
        assert refused == {}
        assert fences == {"a": 2}  # c is held by the peer's run
        assert [r.outcome for r in await store.runs("b", 5)] == ["failed"]  # b: released
        assert await claim1(peer, "b", 101.0) == 2
        # Sent again (its first answer lost), a release changes nothing.
        refused, fences = await store.release_then_claim(ended, [])
        assert (refused, fences) == ({}, {})
        assert [r.outcome for r in await store.runs("a", 5)] == ["ok"]
        assert await store.last_tick("a") == 101.0


class CutRelease(SQLAlchemyStore):
    """A store whose first release waits for ``cut``, then fails (the connection
    lost under it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sending = anyio.Event()
        self.cut = anyio.Event()

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        if not self.sending.is_set():
            self.sending.set()
            await self.cut.wait()
            raise ConnectionError("the connection was lost under the release")
        return await super().release(ended)


async def test_a_release_that_fails_while_the_next_claim_waits_goes_with_it(
    database_url: str,
) -> None:
    """A job's next claim comes while its release is on its way (the releases'
    task sent it), and that release fails: the claim sends it first and claims
    the tick. Sent without it, the claim found the job held by this instance's
    own lease and the tick was lost everywhere (the hostile user's finding: a
    store locked a little longer than its timeout)."""
    async with engine_for(database_url) as engine:
        store = CutRelease(engine)
        await store.open({}, Instance())
        try:
            claims = Claims(store, logging.getLogger("tests.claim_rides"))
            assert await claims.claim([("a", 100.0)]) == {"a": 1}
            claims.release_soon(Ended("a", 1, "ok", None, 0.1))
            answers: list[Any] = []

            async def claim_next() -> None:
                answers.append(await claims.claim([("a", 101.0)]))

            async with anyio.create_task_group() as tg:
                tg.start_soon(claims.flush)
                await store.sending.wait()
                tg.start_soon(claim_next)
                await anyio.wait_all_tasks_blocked()  # the claim waits for the release
                store.cut.set()
            assert answers == [{"a": 2}]
            assert [r.outcome for r in await store.runs("a", 5)] == ["ok"]
        finally:
            await store.close()


async def test_a_release_with_no_claim_soon_is_sent_at_once(database_url: str) -> None:
    """A job at 3 s: its release does not wait for the next instant's claim: the
    lease is free (a trigger or a backfill on another instance may claim the
    job) and the run is in the history well before that tick."""
    store = CountingStore(lambda state: state["db"])
    scheduler = Scheduler(store=store, shutdown_timeout=5)
    ticks: list[datetime] = []

    @scheduler.every(seconds=3)
    async def digest(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    async with engine_for(database_url) as engine, scheduler.running({"db": engine}):
        await poll(lambda: bool(ticks))
        first = ticks[0].timestamp()

        async def freed() -> bool:
            rows = await released(database_url)
            return bool(rows) and rows[0][2] is None

        # Freed in milliseconds: not when the next tick is claimed.
        await poll(freed, within=1.0)
        assert len(ticks) == 1 and ticks[0].timestamp() == first
        assert store.calls["release"] == 1
    assert await history(database_url) == Counter({"digest": len(ticks)})


def ticking() -> tuple[Scheduler, list[datetime]]:
    """A scheduler with a store on the app's engine and one job at 200 ms; its runs."""
    scheduler = Scheduler(store=SQLAlchemyStore(lambda state: state["db"]), shutdown_timeout=5)
    runs: list[datetime] = []

    @scheduler.every(seconds=0.2)
    async def tick(ctx: JobContext) -> None:
        runs.append(ctx.tick)

    return scheduler, runs


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_claims_keep_one_connection_and_give_it_back_at_the_stop(
    postgres: Any, driver: str
) -> None:
    """While jobs tick, the store holds one connection of the app's pool between
    its claims; the stop gives it back."""
    url = postgres.url(postgres.create_database(), driver=driver)
    scheduler, runs = ticking()
    async with engine_for(url) as engine:
        async with scheduler.running({"db": engine}):
            await poll(lambda: len(runs) >= 2)
            held = []
            for _ in range(20):  # a second: five ticks, each a few ms of SQL
                held.append(engine.pool.checkedout())  # type: ignore[attr-defined]
                await anyio.sleep(0.05)
            assert min(held) >= 1, held  # kept between the ticks, not only during them
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(("size", "overflow"), [(1, 0), (3, 0), (2, 1), (5, 4)])
async def test_a_small_pool_is_never_kept_from_the_app(
    postgres: Any, size: int, overflow: int
) -> None:
    """An app whose pool is smaller than SQLAlchemy's default, and its requests
    holding all of it but one connection: the store keeps none between its
    claims, so the app's next checkout gets that one while jobs tick."""
    url = postgres.url(postgres.create_database())
    scheduler, runs = ticking()
    async with engine_for(url) as warm:
        await warm.dispose()  # the tables made
    engine = create_async_engine(url, pool_size=size, max_overflow=overflow, pool_timeout=3)
    try:
        async with scheduler.running({"db": engine}), AsyncExitStack() as held:
            await poll(lambda: len(runs) >= 2)
            for _ in range(size + overflow - 1):  # the app's long requests
                await held.enter_async_context(engine.connect())
            for _ in range(5):
                # A kept connection would make this wait the pool's timeout and fail.
                async with engine.connect() as conn:
                    assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
                await anyio.sleep(0.1)
            await poll(lambda: len(runs) >= 3)  # and jobs still tick
    finally:
        await engine.dispose()
