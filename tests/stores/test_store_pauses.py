"""Pauses through a store, when the store is slow: an answer that says what
became of the change, and readings that never take this process back in time."""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import ClusterView, Scheduler, StoreError
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import claim1, pause_in_store, serve
from ..support.waiting import poll
from .test_store import opened


class Held:
    """A lock held by another client: ``released`` once it is gone; ``release()``
    lets it go before its time."""

    def __init__(self) -> None:
        self.released = anyio.Event()
        self.wanted = anyio.Event()

    def release(self) -> None:
        self.wanted.set()


@asynccontextmanager
async def pauses_locked(url: str, seconds: float) -> AsyncIterator[Held]:
    """The pauses table locked by another connection from now for ``seconds``
    (PostgreSQL: ACCESS EXCLUSIVE; SQLite: the whole file, BEGIN EXCLUSIVE); the
    block is entered at once, and left once the lock is gone."""
    if url.startswith("sqlite"):
        path = sa.make_url(url).database
        assert path is not None
        with closing(sqlite3.connect(path, isolation_level=None)) as lock:
            lock.execute("BEGIN EXCLUSIVE")
            held = Held()
            async with anyio.create_task_group() as tg:

                async def unlock() -> None:
                    with anyio.move_on_after(seconds):
                        await held.wanted.wait()
                    lock.execute("COMMIT")
                    held.released.set()

                tg.start_soon(unlock)
                try:
                    yield held
                except BaseException:
                    held.release()  # a failed test does not wait out the lock
                    raise
        return
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text("LOCK TABLE fastapi_jobs_pauses IN ACCESS EXCLUSIVE MODE"))
            held = Held()
            async with anyio.create_task_group() as tg:

                async def unlock() -> None:
                    with anyio.move_on_after(seconds):
                        await held.wanted.wait()
                    await conn.rollback()
                    held.released.set()

                tg.start_soon(unlock)
                try:
                    yield held
                except BaseException:
                    held.release()
                    raise
    finally:
        await engine.dispose()


async def pause_row(url: str) -> tuple[bool, float | None] | None:
    """The pauses table's row of the job ``digest``, as (paused, until)."""
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.text("SELECT paused, until FROM fastapi_jobs_pauses WHERE job = 'digest'")
                )
            ).first()
    finally:
        await engine.dispose()
    return None if row is None else (bool(row[0]), row[1])


def control_app(scheduler: Scheduler) -> FastAPI:
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    app.include_router(scheduler.control_router(public=True))
    return app


@pytest.mark.parametrize("action", ["pause", "resume"])
async def test_a_change_held_behind_a_lock_is_answered_as_it_ended(
    database_url: str, action: str
) -> None:
    """The pauses table locked for 1.5 times the store's timeout while a pause or
    resume is asked for: the answer tells what became of the change (made;
    "nothing changed"; or "may have been made"), and once the store is done the
    table, this process and GET /jobs/{name} all agree with it. Before, the answer
    was "nothing changed" at the timeout while the statement went on and made it."""
    timeout = 1.0
    store = SQLAlchemyStore(database_url, lease=3.5, timeout=timeout, heartbeat=60)
    scheduler = Scheduler(store=store)

    @scheduler.every(days=3650)
    async def digest() -> None: ...

    async with serve(control_app(scheduler)) as client:
        if action == "resume":
            assert (await client.post("/jobs/digest/pause")).json()["paused"] is True
        before = action == "resume"  # paused, before the change
        async with pauses_locked(database_url, 1.5 * timeout):
            answer = await client.post(f"/jobs/digest/{action}")
        await poll(lambda: not store._operations.in_flight)  # the store's statement has ended
        row = await pause_row(database_url)
        status = (await client.get("/jobs/digest")).json()
    paused = row is not None and row[0]
    if answer.status_code == 200:
        assert answer.json()["paused"] is paused is not before
    else:
        assert answer.status_code == 503, answer.text
        detail = answer.json()["detail"]
        if "nothing changed" in detail:
            assert paused is before, (detail, row)
        else:
            assert "may have been made" in detail and "GET /jobs/digest" in detail
    assert status["paused"] is paused, (status, row)


async def test_a_change_whose_answer_comes_too_late_may_have_been_made(database_url: str) -> None:
    """A pause (and a resume from the status page) whose statement goes on past
    the store's deadline after it wrote its row (here a trigger sleeps): the
    answer cannot tell, and says so (503, "may have been made"; the page's notice
    too), never "nothing changed"; once the database is done, GET /jobs/{name}
    shows what the table holds."""
    if database_url.startswith("sqlite"):
        pytest.skip("a SQLite trigger cannot make a statement wait")
    store = SQLAlchemyStore(database_url, lease=2, timeout=0.5, heartbeat=60)
    scheduler = Scheduler(store=store)

    @scheduler.every(days=3650)
    async def digest() -> None: ...

    engine = create_async_engine(database_url)
    try:
        async with serve(control_app(scheduler)) as client:
            assert (await client.get("/jobs/digest")).json()["paused"] is False
            async with engine.begin() as conn:
                await conn.execute(
                    sa.text(
                        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS "
                        "$$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$"
                    )
                )
                await conn.execute(
                    sa.text(
                        "CREATE TRIGGER slow AFTER INSERT OR UPDATE ON fastapi_jobs_pauses "
                        "FOR EACH ROW EXECUTE FUNCTION slow()"
                    )
                )
            answer = await client.post("/jobs/digest/pause")
            from_page = await client.post("/jobs/digest/resume", headers={"accept": "text/html"})
            page = await client.get(from_page.headers["location"])
            async with engine.begin() as conn:
                await conn.execute(sa.text("DROP TRIGGER slow ON fastapi_jobs_pauses"))

            async def done() -> bool:  # no statement of the store's goes on
                async with engine.connect() as conn:
                    active = await conn.scalar(
                        sa.text(
                            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                            "AND datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    )
                return not store._operations.in_flight and active == 0

            await poll(done)
            row = await pause_row(database_url)
            status = (await client.get("/jobs/digest")).json()
    finally:
        await engine.dispose()
    assert answer.status_code == 503
    assert "may have been made; GET /jobs/digest shows" in answer.json()["detail"]
    assert "nothing changed" not in answer.json()["detail"]
    assert from_page.status_code == 303 and "notice=unsure" in from_page.headers["location"]
    assert "it may have been made" in page.text
    assert status["paused"] is (row is not None and row[0]), (status, row)


class HeldReading(SQLAlchemyStore):
    """A store whose reading of the pauses (``pauses()``, the heartbeat's; or
    ``read()``, GET /jobs's), once it has its answer from the database, waits
    for the test to let it return: a slow reading, made exact."""

    hold: asyncio.Event | None = None  # the next reading waits for it
    read_jobs = None  # type: ignore[assignment]  # GET /jobs reads through read()
    reading: asyncio.Event  # set when a held reading has its answer
    answered: asyncio.Event  # set when it returns it

    async def _held(self, got: Any) -> Any:
        hold = self.hold
        if hold is not None:
            self.hold = None
            self.reading.set()
            await hold.wait()
            self.answered.set()
        return got

    async def pauses(self) -> dict[str, tuple[float, int]]:
        return await self._held(await super().pauses())  # type: ignore[no-any-return]

    async def read(self) -> ClusterView:
        return await self._held(await super().read())  # type: ignore[no-any-return]


@pytest.mark.parametrize("reading", ["heartbeat", "GET /jobs"])
@pytest.mark.parametrize("action", ["pause", "resume"])
async def test_a_reading_that_began_before_a_change_does_not_undo_it(
    database_url: str, action: str, reading: str
) -> None:
    """A reading of the store's pauses that has its answer from before a pause (or
    a resume) made in this process, and returns after it, leaves the change as it
    is: readings are applied in the order the store made their rows' changes.
    Before, it put the job back as it was until the next heartbeat (a paused
    every-instance job ran; a resumed claimed job skipped its ticks as paused)."""
    store = HeldReading(
        database_url,
        lease=6,
        timeout=1.5,
        heartbeat=0.2 if reading == "heartbeat" else 60,
    )
    store.reading, store.answered = asyncio.Event(), asyncio.Event()
    scheduler = Scheduler(store=store)

    @scheduler.every(days=3650, every_instance=action == "pause")
    async def digest() -> None: ...

    async with serve(control_app(scheduler)) as client:
        if action == "resume":
            assert (await client.post("/jobs/digest/pause")).json()["paused"] is True
        hold = store.hold = asyncio.Event()
        async with anyio.create_task_group() as tg:
            if reading == "GET /jobs":
                tg.start_soon(client.get, "/jobs")
            await store.reading.wait()  # it has read the pauses as they were
            changed = await client.post(f"/jobs/digest/{action}")
            assert changed.status_code == 200, changed.text
            hold.set()
            await store.answered.wait()  # and is applied, or not, by now
        local = scheduler.job_status("digest").paused
        shown = (await client.get("/jobs/digest")).json()["paused"]
    assert changed.json()["paused"] is (action == "pause")
    assert local is shown is (action == "pause")


async def test_pauses_and_their_versions_as_the_store_reads_them(database_url: str) -> None:
    """Each change of a job's pause has a version greater than the one before it,
    returned by the change and given by every reading; also across the table
    dropped and made again, whose new rows must not look older to the processes
    that read the old ones."""
    async with opened(database_url) as (store, engine):
        first = await store.pause("digest", None)
        assert await store.pauses() == {"digest": (math.inf, first)}
        second = await store.resume("digest")
        third = await store.pause("digest", 4_000_000_000.0)
        assert first < second < third
        assert await store.pauses() == {"digest": (4_000_000_000.0, third)}
        view = await store.read()
        async with engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE fastapi_jobs_pauses"))
        with pytest.raises(StoreError, match="could not make it"):
            await store.resume("digest")  # and the table is made again
        fourth = await store.resume("digest")
    assert view.pauses == {"digest": 4_000_000_000.0}
    assert view.pause_versions == {"digest": third}
    assert fourth > third


async def test_a_pauses_table_from_before_versions_gets_its_column(database_url: str) -> None:
    """Upgrading: the pauses table as the previous release made it (no version
    column), with a pause in it. Without create_tables the store says which
    ALTER TABLE to run; with it, the column is added on first use, the pause
    holds, and the next change goes on from there."""
    engine = create_async_engine(database_url)
    previous = sa.Table(
        "fastapi_jobs_pauses",
        sa.MetaData(),
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("until", sa.Double, nullable=True),
        sa.Column("changed_at", sa.Double, nullable=False),
        sa.Column("changed_by", sa.String(200), nullable=False),
    )
    try:
        async with opened(database_url, engine=engine):
            pass  # every table, as this release makes them
        async with engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE fastapi_jobs_pauses"))
            await conn.run_sync(previous.create)
            await conn.execute(
                previous.insert().values(
                    job="digest", paused=True, until=None, changed_at=1.0, changed_by="old"
                )
            )
        async with opened(database_url, engine=engine, create_tables=False) as (store, _):
            with pytest.raises(
                StoreError,
                match="add it with ALTER TABLE fastapi_jobs_pauses ADD COLUMN version BIGINT",
            ):
                await store.pauses()
        async with opened(database_url, engine=engine) as (store, _):
            assert await store.pauses() == {"digest": (math.inf, 0)}
            assert await claim1(store, "digest", 1_000.0) is None  # still paused
            resumed = await store.resume("digest")
            assert resumed > 0
            assert await store.pauses() == {"digest": (0.0, resumed)}
            assert await claim1(store, "digest", 1_000.0) == 1
    finally:
        await engine.dispose()


async def test_an_every_instance_pause_holds_while_the_store_cannot_be_read(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An every_instance job paused in the store, an instance that starts while the
    pauses cannot be read (their table locked past the timeout): no claim guards
    that job, so it fails closed, skipping its ticks as store_unavailable until
    the store's pauses are read, then as paused. It never runs. Its start-up line
    says it waits for the pauses (it once said "paused", before anything was read)."""
    await pause_in_store(database_url, "refresh")
    store = SQLAlchemyStore(database_url, lease=3, timeout=0.5, heartbeat=0.3)
    scheduler = Scheduler(store=store, shutdown_timeout=2)
    ran: list[int] = []

    @scheduler.every(seconds=0.1, every_instance=True)
    async def refresh() -> None:
        ran.append(1)

    with caplog.at_level(logging.INFO, logger="fastapi_jobs"):
        async with pauses_locked(database_url, 1.5), scheduler.running():
            await poll(
                lambda: scheduler.job_status("refresh").skipped.get("store_unavailable", 0) > 2
            )
            unknown = scheduler.job_status("refresh")
            started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job ")]
            await poll(
                lambda: scheduler.job_status("refresh").skipped.get("paused", 0) > 2, within=15
            )
            known = scheduler.job_status("refresh")
    assert ran == []
    [line] = started
    assert line.endswith(", in every instance, waiting for the store's pauses to be read"), line
    assert unknown.paused is False  # the status does not claim a pause it has not read
    assert known.paused is True


async def test_a_stop_is_bounded_by_the_timeout_not_by_someone_elses_lock(
    database_url: str,
) -> None:
    """The pauses table stays locked by another client for far longer than the
    store's timeout: the scheduler still stops (and closes its store) while the
    lock is held, instead of waiting for the lock with the operations queued
    behind it."""
    store = SQLAlchemyStore(database_url, lease=3, timeout=0.5, heartbeat=0.3)
    scheduler = Scheduler(store=store, shutdown_timeout=1)

    @scheduler.every(seconds=0.2)
    async def job() -> None: ...

    async with scheduler.running():
        await poll(lambda: scheduler.job_status("job").runs >= 1)
    # The same store, started again while its table is locked for 30 s.
    async with pauses_locked(database_url, 30) as lock:
        async with scheduler.running():
            await anyio.sleep(1.0)
        stopped_while_locked = not lock.released.is_set()
        lock.release()
    assert stopped_while_locked
