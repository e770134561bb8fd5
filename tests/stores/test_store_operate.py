"""The store's side of operating jobs, on every backend: pauses that claims
obey, manual claims that ignore them, the run history written by the release,
and its retention."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from fastapi_jobs import Every, JobContext, Scheduler, StoreError
from fastapi_jobs._core import heartbeat as _heartbeat
from fastapi_jobs.stores import Ended, SQLAlchemyStore

from ..conftest import claim1, serve
from ..support.waiting import poll
from .test_store import opened

NOW = 1_000.0  # ticks far in the database clock's past: claimable


async def test_a_paused_job_is_not_claimed_until_resumed_and_a_manual_claim_ignores_it(
    database_url: str,
) -> None:
    async with opened(database_url) as (store, _):
        paused = await store.pause("digest", None)
        assert await store.pauses() == {"digest": (math.inf, paused)}
        assert await claim1(store, "digest", NOW) is None  # the scheduled claim is refused
        assert await claim1(store, "other", NOW) == 1  # other jobs are not
        fence = (await store.claim([("digest", NOW + 1)], manual=True))["digest"]
        assert fence == 1
        await store.release([Ended("digest", 1, "ok", None, 0.5, 1, True)])
        resumed = await store.resume("digest")
        assert await store.pauses() == {"digest": (0.0, resumed)}  # kept: overrides a default
        assert await claim1(store, "digest", NOW + 2) == 2


async def test_a_pause_with_an_end_holds_until_then_on_the_databases_clock(
    database_url: str,
) -> None:
    async with opened(database_url) as (store, _):
        await store.pause("digest", 1.0)  # ended long ago
        assert await claim1(store, "digest", NOW) == 1
        await store.release([Ended("digest", 1, "ok", None, 0.1)])
        version = await store.pause("digest", 4_000_000_000.0)  # the year 2096
        assert await store.pauses() == {"digest": (4_000_000_000.0, version)}
        assert await claim1(store, "digest", NOW + 1) is None


async def test_release_writes_one_history_row_once_and_runs_reads_newest_first(
    database_url: str,
) -> None:
    async with opened(database_url) as (store, _):
        for n in range(1, 4):
            fence = await claim1(store, "digest", NOW + n)
            assert fence == n
            ended = Ended("digest", n, "failed" if n == 2 else "ok", None, 0.25 * n, n, n == 3)
            if n == 2:
                ended = ended._replace(error="ConnectionError: smtp refused")
            await store.release([ended])
            await store.release([ended])  # sent again (its first reply lost): no second row
        runs = await store.runs("digest", 10)
        assert [r.fence for r in runs] == [3, 2, 1]
        newest, failed, _ = runs
        assert newest.manual is True and newest.attempts == 3 and newest.outcome == "ok"
        assert newest.tick is not None and newest.tick.timestamp() == NOW + 3
        assert newest.id == "3" and newest.duration_s == pytest.approx(0.75)
        assert newest.instance == store._owner
        assert newest.finished_at is not None and newest.started_at is not None
        assert failed.error is not None and failed.error.type == "ConnectionError"
        assert failed.error.message == "smtp refused"
        assert [r.fence for r in await store.runs("digest", 1)] == [3]
        assert await store.runs("nope", 5) == []


async def test_a_release_of_a_superseded_claim_writes_no_history(database_url: str) -> None:
    async with opened(database_url, lease=3, timeout=0.5) as (store, engine):
        assert await claim1(store, "digest", NOW) == 1
        async with engine.begin() as conn:  # the lease ran out; a peer claimed the job
            await conn.execute(sa.text("UPDATE fastapi_jobs_claims SET lease_until = 0"))
        assert await claim1(store, "digest", NOW + 1) == 2
        await store.release([Ended("digest", 1, "ok", None, 0.1)])
        assert await store.runs("digest", 10) == []


async def test_history_is_pruned_by_count_per_job_and_by_age(database_url: str) -> None:
    async with opened(database_url, history=3) as (store, engine):
        for job in ("a", "b"):
            for n in range(1, 6):
                assert await claim1(store, job, NOW + n) == n
                await store.release([Ended(job, n, "ok", None, 0.0)])
        assert len(await store.runs("a", 100)) == 5  # kept until the background prune
        await store.prune()
        assert [r.fence for r in await store.runs("a", 100)] == [5, 4, 3]
        assert [r.fence for r in await store.runs("b", 100)] == [5, 4, 3]
        async with engine.begin() as conn:  # "b"'s rows are 60 days old
            await conn.execute(
                sa.text(
                    "UPDATE fastapi_jobs_runs SET finished_at = finished_at - 5184000 "
                    "WHERE job = 'b'"
                )
            )
        await store.prune()
        assert await store.runs("b", 100) == []
        assert len(await store.runs("a", 100)) == 3


async def test_history_zero_writes_no_history(database_url: str) -> None:
    async with opened(database_url, history=0) as (store, _):
        assert await claim1(store, "digest", NOW) == 1
        await store.release([Ended("digest", 1, "ok", None, 0.1)])
        assert await store.runs("digest", 10) == []
        await store.prune()


@pytest.mark.parametrize("history", [-1, 100_001, 2.5, True])
def test_history_out_of_range_is_refused(history: object) -> None:
    with pytest.raises(Exception, match="from 0"):
        SQLAlchemyStore("sqlite+aiosqlite:///x.db", history=history)  # type: ignore[arg-type]


async def test_operations_on_a_store_not_opened_fail_clearly() -> None:
    store = SQLAlchemyStore("sqlite+aiosqlite:///never.db")
    with pytest.raises(StoreError, match="not open"):
        await store.pause("digest", None)


async def test_with_the_database_down_control_calls_answer_503_and_change_nothing() -> None:
    store = SQLAlchemyStore(
        "postgresql+asyncpg://nobody:x@127.0.0.1:1/none", lease=3, timeout=0.5, heartbeat=1
    )
    scheduler = Scheduler(store=store)

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    app.include_router(scheduler.control_router(public=True))
    async with serve(app) as client:
        for action in ("pause", "resume", "run"):
            answer = await client.post(f"/jobs/digest/{action}")
            assert answer.status_code == 503, action
            assert "nothing" in answer.json()["detail"], answer.json()
        history = await client.get("/jobs/digest/runs")
        assert history.status_code == 503
        assert "cannot read the run history" in history.json()["detail"]
        status = await client.get("/jobs/digest")
        assert status.status_code == 200
        assert status.json()["paused"] is False and status.json()["running"] is False


async def test_a_retried_run_holds_its_claim_and_its_history_row_counts_the_attempts(
    database_url: str,
) -> None:
    scheduler = Scheduler(store=SQLAlchemyStore(database_url))
    calls: list[int | None] = []

    async def flaky(ctx: JobContext) -> None:
        calls.append(ctx.fence)
        if len(calls) == 1:
            raise ConnectionError("first try fails")

    scheduler.add_job(flaky, Every(seconds=2), retries=2, retry_backoff=0.05)
    async with scheduler.running():

        async def released() -> bool:
            return any(run.outcome for run in await scheduler.runs("flaky"))

        await poll(released)
        runs = await scheduler.runs("flaky")
    assert calls[0] is not None and calls[0] == calls[1]  # one claim, one fence
    assert runs[-1].attempts == 2 and runs[-1].outcome == "ok"
    assert runs[-1].fence == calls[0]


async def test_the_heartbeat_prunes_the_history(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with opened(database_url, history=2) as (store, _):
        for n in range(1, 6):
            assert await claim1(store, "digest", NOW + n) == n
            await store.release([Ended("digest", n, "ok", None, 0.0)])
    monkeypatch.setattr(_heartbeat, "PRUNE_EVERY", 0.2)
    scheduler = Scheduler(
        store=SQLAlchemyStore(database_url, history=2, heartbeat=0.1, lease=3, timeout=0.5)
    )

    @scheduler.every(days=3650)  # no tick during the test: it would add a run
    async def digest() -> None: ...

    async with scheduler.running():

        async def pruned() -> bool:
            return len(await scheduler.runs("digest")) == 2

        await poll(pruned)
        assert [r.fence for r in await scheduler.runs("digest")] == [5, 4]


async def add_runs(store: SQLAlchemyStore, jobs: list[str], count: int) -> None:
    """``count`` more runs of each of ``jobs`` in the history, as a peer makes them."""
    for _ in range(count):
        ticks = {job: (await store.last_tick(job) or NOW) + 1 for job in jobs}
        fences = await store.claim(list(ticks.items()))
        made = {job: fence for job, fence in fences.items() if isinstance(fence, int)}
        assert list(made) == jobs
        await store.release([Ended(job, fence, "ok", None, 0.0) for job, fence in made.items()])


async def history_sizes(store: SQLAlchemyStore, jobs: list[str]) -> dict[str, int]:
    return {job: len(runs) for job, runs in (await store.recent_runs(jobs, 1000)).items()}


async def test_instances_that_live_a_few_seconds_keep_the_history_to_its_bound(
    database_url: str,
) -> None:
    """Instances restarted long before the ten minutes between two prunes (a
    deploy, a crash loop) each prune at start: the history stays at `history`
    runs per job instead of growing with every life."""
    jobs = ["a", "b"]
    async with opened(database_url, history=3) as (peer, _):
        for _life in range(4):
            await add_runs(peer, jobs, 5)
            store = SQLAlchemyStore(database_url, history=3, lease=3, timeout=0.5)
            scheduler = Scheduler(store=store)

            @scheduler.every(days=3650)  # no tick during the test: it would add a run
            async def digest() -> None: ...

            async with scheduler.running():

                async def pruned() -> bool:
                    return await history_sizes(peer, jobs) == dict.fromkeys(jobs, 3)

                await poll(pruned)


class HeldPrune(SQLAlchemyStore):
    """A store whose prune waits until the test lets it go on."""

    entered: asyncio.Event
    go: asyncio.Event

    async def prune(self) -> None:
        self.entered.set()
        await self.go.wait()
        await super().prune()


async def test_the_prune_at_start_does_not_hold_the_first_ticks(database_url: str) -> None:
    """The prune at start runs beside the jobs: while it is held, a job every
    0.2 s runs and the instance beats."""
    store = HeldPrune(database_url, history=2, lease=3, timeout=0.5, heartbeat=0.1)
    store.entered, store.go = asyncio.Event(), asyncio.Event()
    scheduler = Scheduler(store=store)

    @scheduler.every(seconds=0.2)
    async def tick() -> None: ...

    async with scheduler.running():
        await poll(store.entered.is_set)
        await poll(lambda: scheduler.job_status("tick").runs >= 3)

        async def beaten() -> bool:
            return [i.id for i in (await store.read()).instances] == [store._owner]

        await poll(beaten)
        store.go.set()


async def test_a_store_from_before_the_history_gets_its_new_tables(database_url: str) -> None:
    """Upgrading: a database with only the claims and instances tables (as the
    previous release made them, with rows) gets the pauses and runs tables on
    first use, and its claims go on from their fences."""
    async with opened(database_url) as (store, engine):
        assert await claim1(store, "digest", NOW) == 1
        await store.release([Ended("digest", 1, "ok", None, 0.1)])
        async with engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE fastapi_jobs_runs"))
            await conn.execute(sa.text("DROP TABLE fastapi_jobs_pauses"))
    async with opened(database_url) as (store, _):
        assert await claim1(store, "digest", NOW + 1) == 2
        await store.release([Ended("digest", 2, "ok", None, 0.1)])
        assert [r.fence for r in await store.runs("digest", 5)] == [2]
        version = await store.pause("digest", None)
        assert await store.pauses() == {"digest": (math.inf, version)}


async def test_a_database_error_reaches_the_answer_without_its_sql(tmp_path: Path) -> None:
    """The 503 says what failed as the status does: type and first line, never the
    statement nor its parameters."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    scheduler = Scheduler(store=SQLAlchemyStore(url, lease=3, timeout=0.5))

    @scheduler.every(days=3650)
    async def digest() -> None: ...

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    async with serve(app) as client:
        assert (await client.get("/jobs/digest/runs")).json() == []
        with closing(sqlite3.connect(tmp_path / "jobs.sqlite3")) as conn:
            conn.execute("DROP TABLE fastapi_jobs_runs")
            conn.commit()
        answer = await client.get("/jobs/digest/runs")
    assert answer.status_code == 503
    detail = answer.json()["detail"]
    assert "OperationalError" in detail and "no such table" in detail
    assert "[SQL" not in detail and "SELECT" not in detail
