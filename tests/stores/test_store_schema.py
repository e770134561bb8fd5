"""The store's tables among the app's own: names the store refuses, a table of
the app's under a store name (never altered), what ``include_tables`` takes,
and what is said when the tables cannot be used (the log, the run's 503)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase

from fastapi_jobs import ConfigurationError, Scheduler, StoreError
from fastapi_jobs.stores import SQLAlchemyStore, include_tables

from ..conftest import claim1, open_store, serve
from ..support.ports import free_port
from ..support.postgres import PostgresServer
from ..support.waiting import poll


def test_an_empty_prefix_is_refused() -> None:
    """table_prefix='' would name the store's tables claims, runs, ...: refused by
    the store, include_tables and ddl, saying to keep a prefix."""
    said = r"table_prefix='': the store's tables would be named claims, instances, pauses, runs"
    with pytest.raises(ConfigurationError, match=rf"^SQLAlchemyStore\(\): {said}.*keep a prefix"):
        SQLAlchemyStore("sqlite+aiosqlite:///x.db", table_prefix="")
    with pytest.raises(ConfigurationError, match=rf"^include_tables\(\): {said}"):
        include_tables(sa.MetaData(), table_prefix="")
    with pytest.raises(ConfigurationError, match="fastapi_jobs_"):
        SQLAlchemyStore.ddl("sqlite", table_prefix="")


# Tables of an app under the names the store takes with table_prefix="app_": one
# that shares nothing with the store's, one with its key column (job) but not the rest.
APP_TABLES = {
    "app_claims": (
        "CREATE TABLE app_claims (claim_no INTEGER PRIMARY KEY, insurer TEXT)",
        "INSERT INTO app_claims VALUES (7, 'acme')",
    ),
    "app_runs": (
        "CREATE TABLE app_runs (id INTEGER PRIMARY KEY, job TEXT, status TEXT)",
        "INSERT INTO app_runs VALUES (7, 'acme', 'done')",
    ),
}


async def columns(engine: AsyncEngine) -> dict[str, list[str]]:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: {
                name: [column["name"] for column in sa.inspect(sync).get_columns(name)]
                for name in sa.inspect(sync).get_table_names()
            }
        )


NOT_THE_STORES = (
    r"^table {} is not the store's \(it has no column {}\): it is left as it is; give "
    r"SQLAlchemyStore\(\.\.\.\) another table_prefix="
)


@pytest.mark.parametrize(
    ("theirs", "create_tables", "refused"),
    [
        # No key column: not the store's, whether or not the store would make tables.
        ("app_claims", True, NOT_THE_STORES.format("app_claims", "job")),
        ("app_claims", False, NOT_THE_STORES.format("app_claims", "job")),
        # The key, but columns no table the store made ever lacked.
        ("app_runs", True, NOT_THE_STORES.format("app_runs", "fence, tick, manual, .*")),
        # Nothing is made or altered: what it lacks is named, and the other way out.
        (
            "app_runs",
            False,
            r"^column\(s\) app_runs\.fence, .* do not exist \(a migration left them out; or "
            r"the table is the app's own: then give the store another table_prefix=\)",
        ),
    ],
)
async def test_a_table_of_the_app_under_a_store_name_is_left_alone(
    database_url: str, theirs: str, create_tables: bool, refused: str
) -> None:
    """A table of the app's where the store's would be: the store refuses to use
    it (StoreError naming it, and to pick another prefix), alters nothing and
    creates none of its other tables, with or without create_tables."""
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as conn:
            for statement in APP_TABLES[theirs]:
                await conn.execute(sa.text(statement))
        before = await columns(engine)
        async with open_store(engine, table_prefix="app_", create_tables=create_tables) as store:
            for _ in range(2):  # checked again, never altered
                with pytest.raises(StoreError, match=refused):
                    await claim1(store, "digest", 1.0)
        assert await columns(engine) == before
        async with engine.connect() as conn:
            rows = (await conn.execute(sa.text(f"SELECT * FROM {theirs}"))).all()
        assert [tuple(row)[:2] for row in rows] == [(7, "acme")]
    finally:
        await engine.dispose()


async def test_the_store_tables_are_still_completed(database_url: str) -> None:
    """The rule that tells a foreign table keeps the store's own: a table made by
    an earlier release, lacking a column a release added (the pauses' version, a
    run's error), gets it and is used."""
    engine = create_async_engine(database_url)
    try:
        async with open_store(engine) as store:
            assert await claim1(store, "digest", 1.0) == 1
        async with engine.begin() as conn:
            await conn.execute(sa.text("ALTER TABLE fastapi_jobs_pauses DROP COLUMN version"))
            await conn.execute(sa.text("ALTER TABLE fastapi_jobs_runs DROP COLUMN error"))
        async with open_store(engine) as store:
            assert await claim1(store, "report", 2.0) == 1
            assert await store.pause("digest", None) >= 1
        found = await columns(engine)
        assert "version" in found["fastapi_jobs_pauses"]
        assert "error" in found["fastapi_jobs_runs"]
    finally:
        await engine.dispose()


class Base(DeclarativeBase):
    pass


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (None, "None"),
        ({}, "{}"),
        (Base, "pass its .metadata), not <class 'tests.stores.test_store_schema.Base'>"),
        ("metadata", "'metadata'"),
    ],
)
def test_include_tables_takes_a_metadata(given: Any, named: str) -> None:
    """Anything but a MetaData (the declarative base itself, a likely mistake): a
    ConfigurationError saying what it takes and what it got."""
    with pytest.raises(ConfigurationError) as caught:
        include_tables(given)
    assert str(caught.value).startswith("include_tables(): it takes a sqlalchemy.MetaData (")
    assert str(caught.value).endswith(named)


def test_include_tables_refuses_an_index_of_the_app_under_the_store_index_name() -> None:
    """An app index named like the store's (one schema-wide name on PostgreSQL)
    is refused like a table of the same name, and nothing is added."""
    metadata = sa.MetaData()
    notes = sa.Table("notes", metadata, sa.Column("id", sa.Integer, primary_key=True))
    sa.Index("ix_fastapi_jobs_runs_job", notes.c.id)
    with pytest.raises(
        ConfigurationError,
        match=r"an index of its own named 'ix_fastapi_jobs_runs_job' \(on 'notes'\): give the "
        r"store another table_prefix=",
    ):
        include_tables(metadata)
    assert list(metadata.tables) == ["notes"]
    include_tables(metadata, table_prefix="jobs_")  # another prefix: another index name


def app_of(scheduler: Scheduler) -> FastAPI:
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    app.include_router(scheduler.control_router(public=True))
    return app


async def test_missing_tables_are_logged_as_not_usable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """create_tables=False and no tables: each skipped tick is logged with the
    store's reason, not as an unreachable store (the database answered)."""
    store = SQLAlchemyStore(
        f"sqlite+aiosqlite:///{tmp_path / 'app.db'}", create_tables=False, heartbeat=60
    )
    scheduler = Scheduler(store=store)

    @scheduler.every(seconds=0.1)
    async def job() -> None: ...

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running({}):
            await poll(lambda: scheduler.job_status("job").skipped.get("store_unavailable", 0) >= 2)
    assert (
        "store not usable, tick skipped for 1 job(s) ('job'): table(s) fastapi_jobs_claims, "
        "fastapi_jobs_instances, fastapi_jobs_pauses, fastapi_jobs_runs, fastapi_jobs_handoffs "
        "(the hand-offs' outbox), fastapi_jobs_instants (the instants claimed for sets of jobs), "
        "fastapi_jobs_schedules (the schedules made at run time) do not exist, and "
        "create_tables=False" in caplog.text
    )
    assert "unreachable" not in caplog.text


@pytest.mark.parametrize("reachable", [True, False])
async def test_a_run_that_cannot_claim_says_why_without_the_password(
    postgres: PostgresServer, reachable: bool
) -> None:
    """POST /jobs/{name}/run?wait=true while the store cannot be used: 503 with the
    store's reason (missing tables; or the database's error), as /pause gives
    it, and never the password of the store's URL."""
    password = "s3cret-Pa55word"
    port = postgres.port if reachable else free_port()
    url = f"postgresql+asyncpg://postgres:{password}@127.0.0.1:{port}/{postgres.create_database()}"
    store = SQLAlchemyStore(url, create_tables=False, timeout=1, heartbeat=60)
    scheduler = Scheduler(store=store)

    @scheduler.every(days=3650)
    async def digest() -> None: ...

    async with serve(app_of(scheduler)) as client:
        ran = await client.post("/jobs/digest/run?wait=true")
        paused = await client.post("/jobs/digest/pause")
    assert ran.status_code == paused.status_code == 503
    detail = ran.json()["detail"]
    assert password not in detail and password not in paused.json()["detail"]
    assert detail.startswith("cannot trigger 'digest': ") and detail.endswith("; nothing ran")
    if reachable:
        assert "fastapi_jobs_claims, fastapi_jobs_instances" in detail
        assert "do not exist, and create_tables=False" in detail
        assert "do not exist, and create_tables=False" in paused.json()["detail"]
    else:
        assert "the store cannot be reached (" in detail
