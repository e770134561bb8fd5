"""What the store tells of a job's last run: the last run that ended, shown while
the next one goes, and never a run that did not start."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing

import anyio
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import Scheduler
from fastapi_jobs.stores import Instance, SQLAlchemyStore

from ..conftest import claim1, serve
from ..support.waiting import poll


def control_app(scheduler: Scheduler) -> FastAPI:
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    app.include_router(scheduler.control_router(public=True))
    return app


async def test_a_running_job_shows_its_last_finished_run(database_url: str) -> None:
    """A job failed, and its next run is going: `cluster` keeps the failed run's
    outcome, error and end (with `running_on` saying a run goes), and so does the
    page, instead of nulls and "Last run —"."""
    store = SQLAlchemyStore(database_url, heartbeat=60)
    scheduler = Scheduler(store=store)
    gate = anyio.Event()
    calls: list[int] = []

    @scheduler.every(days=3650)
    async def digest() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("smtp refused")
        await gate.wait()

    async with serve(control_app(scheduler)) as client:
        failed = await client.post("/jobs/digest/run?wait=true")
        assert failed.json()["outcome"] == "failed"
        assert (await client.post("/jobs/digest/run")).status_code == 202
        await poll(lambda: scheduler.job_status("digest").running)
        cluster = (await client.get("/jobs/digest")).json()["cluster"]
        page = (await client.get("/jobs/ui")).text
        gate.set()
        await poll(lambda: not scheduler.job_status("digest").running)
    assert cluster["running_on"] == scheduler.instance.id
    assert cluster["last_outcome"] == "failed"
    assert cluster["last_error"] == {"type": "ConnectionError", "message": "smtp refused"}
    assert cluster["last_finished_at"] is not None and cluster["fence"] == 2
    row = page[page.index('data-job="digest"') :]
    row = row[: row.index("</tr>")]
    assert ">running<" in row and "outcome failed" in row and "smtp refused" in row


@asynccontextmanager
async def claims_locked(url: str, seconds: float) -> AsyncIterator[None]:
    """The claims table locked by another connection for ``seconds`` from now."""
    if url.startswith("sqlite"):
        path = sa.make_url(url).database
        assert path is not None
        with closing(sqlite3.connect(path, isolation_level=None)) as lock:
            lock.execute("BEGIN EXCLUSIVE")
            async with anyio.create_task_group() as tg:

                async def unlock() -> None:
                    await anyio.sleep(seconds)
                    lock.execute("COMMIT")

                tg.start_soon(unlock)
                yield
        return
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text("LOCK TABLE fastapi_jobs_claims IN ACCESS EXCLUSIVE MODE"))
            async with anyio.create_task_group() as tg:

                async def unlock() -> None:
                    await anyio.sleep(seconds)
                    await conn.rollback()

                tg.start_soon(unlock)
                yield
    finally:
        await engine.dispose()


async def test_a_trigger_whose_claim_came_too_late_leaves_no_run(database_url: str) -> None:
    """The claims table is locked past the store's timeout while a run is asked for:
    the answer is 503 "nothing ran", and once the lock goes the late claim (made or
    refused) leaves no history row and does not change the job's last run, which
    was ok: a run that never started is no run."""
    timeout = 0.5
    store = SQLAlchemyStore(database_url, lease=3, timeout=timeout, heartbeat=60)
    scheduler = Scheduler(store=store)

    @scheduler.every(days=3650)
    async def digest() -> None: ...

    async with serve(control_app(scheduler)) as client:

        async def ran_ok() -> bool:  # the first claims may pass the timeout: tables made
            answer = await client.post("/jobs/digest/run?wait=true")
            return bool(answer.json().get("outcome") == "ok")

        await poll(ran_ok)
        before = (await client.get("/jobs/digest")).json()["cluster"]
        async with claims_locked(database_url, 1.5 * timeout):
            late = await client.post("/jobs/digest/run")
        await poll(lambda: not store._operations.in_flight)  # the late claim and its release ended
        after = (await client.get("/jobs/digest")).json()["cluster"]
        history = (await client.get("/jobs/digest/runs")).json()
    assert late.status_code == 503 and "nothing ran" in late.json()["detail"]
    assert [run["outcome"] for run in history] == ["ok"]
    assert after["running_on"] is None
    for field in ("last_outcome", "last_error", "last_finished_at", "last_duration_s"):
        assert after[field] == before[field]


async def test_a_claim_held_behind_a_table_lock_past_the_timeout_is_not_made(
    database_url: str,
) -> None:
    """A claim that waited behind a lock on the claims table for longer than the
    store's timeout is refused by its own statement (its caller has given up), on
    every driver: the tick is still free afterwards. (On asyncpg the statement's
    own timestamp is taken after a table lock's wait, so the claim was made.)"""
    timeout = 0.3
    store = SQLAlchemyStore(database_url, lease=1, timeout=timeout)
    await store.open({}, Instance())
    try:
        # Tables made, connection open: on a loaded machine the first claims may
        # take longer than the short timeout, so warm until one is made in time.
        warm = [await claim1(store, "warm0", 1.0)]
        while warm[-1] != 1 and len(warm) < 20:
            warm.append(await claim1(store, f"warm{len(warm)}", 1.0))
        assert warm[-1] == 1, warm
        async with claims_locked(database_url, 1.5 * timeout):
            try:
                late = await claim1(store, "digest", 100.0)
            # SQLite: its busy timeout ends the wait first; any driver: the
            # operation's deadline, when the process stalled past the guard's.
            except (sa.exc.OperationalError, TimeoutError):
                late = None
        assert late is None
        assert await claim1(store, "digest", 100.0) == 1  # nothing was made
    finally:
        await store.close()


@pytest.mark.parametrize("database_url", ["asyncpg", "psycopg"], indirect=True)
async def test_a_value_the_database_refused_is_not_shown(database_url: str) -> None:
    """A job's query fails on a bound value (a password where a number goes): the
    drivers and PostgreSQL repeat the value in the error's first line. /jobs, the
    run history and the page show the error's type and what went wrong, never
    the value; the log keeps it all."""
    store = SQLAlchemyStore(database_url, heartbeat=60)
    scheduler = Scheduler(store=store)
    engine = create_async_engine(database_url)

    @scheduler.every(days=3650)
    async def typed() -> None:  # asyncpg refuses the argument; psycopg sends it
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT CAST(:pw AS integer)"), {"pw": "hunter2-pass"})

    try:
        async with serve(control_app(scheduler)) as client:
            ran = await client.post("/jobs/typed/run?wait=true")
            shown = [
                ran.text,
                (await client.get("/jobs/typed")).text,
                (await client.get("/jobs/typed/runs")).text,
                (await client.get("/jobs/ui")).text,
            ]
    finally:
        await engine.dispose()
    assert ran.json()["outcome"] == "failed"
    assert "integer" in ran.json()["error"]["message"]  # what went wrong is said
    for text in shown:
        assert "hunter2" not in text
