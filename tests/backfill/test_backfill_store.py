"""Backfill with a store, on every backend: the claim of a past tick (a tick
that ran is refused, a held lease is said, ``last_tick`` never moves back),
and two schedulers sharing a database backfilling one range at once, beside
live ticks: each tick once in the history, with its own tick recorded."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from fastapi_jobs import BackfillResult, ConfigurationError, Every, JobContext, Scheduler
from fastapi_jobs.stores import Ended, SQLAlchemyStore

from ..conftest import claim1, release1
from ..stores.test_store import opened
from ..support.waiting import poll


async def test_the_claim_of_a_past_tick(database_url: str) -> None:
    async with opened(database_url) as (store, _):
        backfills = store.backfills
        assert await backfills.claim("digest", 100.0) == 1  # no row yet: made, fence 1
        assert await backfills.claim("digest", 90.0) == "held"  # the lease of 100
        await release1(store, "digest", 1, "ok", None, 0.1)
        assert await backfills.claim("digest", 100.0) == "ran"  # its last tick claimed
        assert await backfills.claim("digest", 90.0) == 2  # an older tick
        assert await store.last_tick("digest") == 100.0  # never moved back
        refused = await store.release([store_ended("digest", 2, 90.0)])
        assert refused == {}
        assert await backfills.claim("digest", 90.0) == "ran"  # in the history now
        runs = await store.runs("digest", 10)
        assert sorted(r.tick.timestamp() for r in runs if r.tick is not None) == [90.0, 100.0]
        # A live claim of a newer tick goes on as before; an older one stays refused.
        assert await claim1(store, "digest", 110.0) == 3
        await release1(store, "digest", 3, "ok", None, 0.1)
        assert await claim1(store, "digest", 95.0) is None
        assert await backfills.claim("digest", 95.0) == 4


def store_ended(job: str, fence: int, tick: float) -> Ended:
    """A backfilled run's release: it says its tick (older than the claim's last)."""
    return Ended(job, fence, "ok", None, 0.1, 1, True, tick)


def scheduler_on(url: str, ran: Counter[float]) -> Scheduler:
    scheduler = Scheduler(store=SQLAlchemyStore(url, lease=10, timeout=2, heartbeat=1))

    @scheduler.every(seconds=1)
    async def tick(ctx: JobContext) -> None:
        ran[ctx.tick.timestamp()] += 1
        await anyio.sleep(0.01)

    return scheduler


async def test_two_backfills_of_one_range_beside_live_ticks_run_each_tick_once(
    database_url: str,
) -> None:
    ran: Counter[float] = Counter()
    a, b = scheduler_on(database_url, ran), scheduler_on(database_url, ran)
    now = time.time()
    since = datetime.fromtimestamp(int(now) - 12, UTC)
    results: list[BackfillResult] = []
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(a.running())  # live ticks too
        await stack.enter_async_context(b.running(ticking=False))
        await anyio.sleep(1.5)
        until = datetime.fromtimestamp(time.time() - 0.2, UTC)

        async def backfill(scheduler: Scheduler) -> None:
            results.append(await scheduler.backfill("tick", since, until))

        async with anyio.create_task_group() as tg:
            tg.start_soon(backfill, a)
            tg.start_soon(backfill, b)
        history = await a.runs("tick", limit=100)
    expected = ticks(since.timestamp(), until.timestamp())
    assert {t: n for t, n in ran.items() if since.timestamp() <= t <= until.timestamp()} == {
        t: 1 for t in expected
    }
    recorded = Counter(r.tick.timestamp() for r in history if r.tick is not None)
    assert {t: recorded[t] for t in expected} == {t: 1 for t in expected}
    assert all(result.ok for result in results), results
    assert sum(r.ran for r in results) + sum(r.skipped_ran_already for r in results) == 2 * len(
        expected
    )
    backfilled = {r.tick.timestamp() for r in history if r.manual and r.tick is not None}
    assert backfilled and backfilled <= set(expected)


def ticks(since: float, until: float) -> list[float]:
    schedule = Every(seconds=1)
    found, tick = [], schedule.next_after(since - 1e-6)
    while tick <= until:
        found.append(tick)
        tick = schedule.next_after(tick)
    return found


class WithoutBackfills(SQLAlchemyStore):
    """A store of the app's own making that cannot claim past ticks."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        del self.backfills


async def test_a_store_that_cannot_claim_past_ticks_is_refused_but_not_for_every_instance(
    tmp_path: Path,
) -> None:
    scheduler = Scheduler(store=WithoutBackfills(f"sqlite+aiosqlite:///{tmp_path / 'j.db'}"))
    ran: list[float] = []

    @scheduler.every(seconds=1)
    async def claimed() -> None: ...

    @scheduler.every(seconds=1, every_instance=True)
    async def everywhere(ctx: JobContext) -> None:
        ran.append(ctx.tick.timestamp())

    since = datetime.fromtimestamp(int(time.time()) - 3, UTC)
    until = datetime.fromtimestamp(since.timestamp() + 2, UTC)
    async with scheduler.running(ticking=False):
        with pytest.raises(ConfigurationError, match="this store cannot claim past ticks"):
            await scheduler.backfill("claimed", since, until)
        result = await scheduler.backfill("everywhere", since, until)  # no claims
    assert result.ran == 3 and ran == [since.timestamp() + k for k in range(3)]


async def test_a_lease_held_elsewhere_for_a_whole_lease_skips_the_tick(tmp_path: Path) -> None:
    """Another instance's run holds the job's lease (claimed, never released):
    the backfill waits a lease (its own store's) for it, then skips the tick as
    held, and goes on with the next."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'j.db'}"
    scheduler = Scheduler(store=SQLAlchemyStore(url, lease=1.5, timeout=0.4, heartbeat=1))

    @scheduler.every(seconds=1)
    async def tick() -> None: ...

    now = int(time.time())
    since, until = datetime.fromtimestamp(now - 4, UTC), datetime.fromtimestamp(now - 3, UTC)
    async with opened(url) as (elsewhere, _), scheduler.running(ticking=False):
        # A run going elsewhere, under that store's lease (30 s): held throughout.
        assert await claim1(elsewhere, "tick", float(now - 2)) == 1
        result = await scheduler.backfill("tick", since, until)
    assert [t.outcome for t in result.outcomes] == ["held", "held"]
    assert (result.skipped_held, result.ran, result.ok) == (2, 0, False)
    assert result.outcomes[0].describe() == "held: its lease stayed held elsewhere"


async def test_the_claim_of_a_past_tick_follows_the_stored_schedules_version(
    database_url: str,
) -> None:
    """A backfill's claim carries the stored schedule's version, as a live one
    does: refused ("changed") once the schedule is changed or removed, and for
    a declared job while a live stored schedule has its name."""
    async with opened(database_url) as (store, _):
        row = await store.schedules.create("s", "report", '{"x":1}')
        assert row is not None
        backfills = store.backfills
        assert await backfills.claim("s", 100.0, row.version) == 1
        await release1(store, "s", 1, "ok", None, 0.1)
        changed = await store.schedules.change("s", "report", '{"x":2}', row.version)
        assert changed is not None
        assert await backfills.claim("s", 90.0, row.version) == "changed"
        assert await backfills.claim("s", 90.0, None) == "changed"  # a declared "s"
        assert await backfills.claim("s", 90.0, changed.version) == 2
        await release1(store, "s", 2, "ok", None, 0.1)
        await store.schedules.remove("s")
        assert await backfills.claim("s", 80.0, changed.version) == "changed"
        assert await backfills.claim("s", 80.0, None) == 3  # the name is free again


def _reporting(url: str, runs: list[tuple[str, float, float]], heartbeat: float) -> Scheduler:
    """An instance with the task "report", which notes each run's tenant, tick
    and when it started (the loop's clock), and takes 50 ms."""
    scheduler = Scheduler(store=SQLAlchemyStore(url, lease=10, timeout=2, heartbeat=heartbeat))

    @scheduler.task()
    async def report(ctx: JobContext, tenant: str) -> None:
        runs.append((tenant, ctx.tick.timestamp(), anyio.current_time()))
        await anyio.sleep(0.05)

    return scheduler


@pytest.mark.parametrize("where", ["elsewhere", "here"])
@pytest.mark.parametrize("change", ["update", "remove"])
async def test_a_change_of_the_schedule_stops_its_backfill_saying_so(
    database_url: str, change: str, where: str
) -> None:
    """A 40-tick backfill of a stored schedule runs on A; the schedule is changed
    or removed (on B, whose change A hears of only at its heartbeat a minute
    away, or on A itself). Once the change returned, A runs no tick under the
    old spec; the backfill stops, and its result and log say why (not "the app
    is stopping")."""
    runs: list[tuple[str, float, float]] = []
    a = _reporting(database_url, runs, heartbeat=60)
    b = _reporting(database_url, [], heartbeat=60)
    until = datetime.fromtimestamp(int(time.time()) - 1, UTC)
    since = datetime.fromtimestamp(until.timestamp() - 39, UTC)
    async with a.running(ticking=False), b.running(ticking=False):
        await a.add_schedule("t1", "report", Every(seconds=1), kwargs={"tenant": "old"})
        await b.schedules()  # B runs it too
        result: list[BackfillResult] = []

        async def backfill() -> None:
            result.append(await a.backfill("t1", since, until))

        async with anyio.create_task_group() as tg:
            tg.start_soon(backfill)
            await poll(lambda: len(runs) >= 5, within=20)
            changer = b if where == "elsewhere" else a
            if change == "update":
                await changer.update_schedule("t1", kwargs={"tenant": "new"})
            else:
                await changer.remove_schedule("t1")
            answered = anyio.current_time()
    [done] = result
    late = [(tenant, tick) for tenant, tick, started in runs if started >= answered]
    assert late == [], f"ran under the old spec after the change returned: {late}"
    assert 5 <= done.ran < 40 and done.stopped is not None
    assert "schedule was changed or removed since the backfill began" in done.stopped
    assert "stopping" not in done.stopped
