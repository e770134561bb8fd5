"""The store behind a real PgBouncer (Debian's package), as managed PostgreSQL is
often reached: in transaction mode each transaction, or each statement outside
one, may run on another server connection shared with other clients, so a
prepared statement kept by one client meets another client's parameters."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine

from fastapi_jobs import ConfigurationError, Scheduler
from fastapi_jobs.stores import Instance, SQLAlchemyStore

from ..conftest import claim1, release1, serve, serving
from ..support.cluster import App, rows
from ..support.pgbouncer import PgBouncer
from ..support.postgres import PostgresServer
from ..support.ticks import assert_none_left_out, warnings
from ..support.waiting import wait_until

DRIVERS = ["asyncpg", "psycopg"]


@pytest.fixture(scope="session")
def pgbouncer(postgres: PostgresServer) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the session's PostgreSQL."""
    yield from serving(lambda: PgBouncer(postgres, "transaction"), "PgBouncer")


@pytest.fixture
def statement_pooler(postgres: PostgresServer) -> Iterator[PgBouncer]:
    """A PgBouncer in statement mode, for one test."""
    yield from serving(lambda: PgBouncer(postgres, "statement"), "PgBouncer")


@pytest.fixture(params=DRIVERS)
def pooled(
    request: pytest.FixtureRequest, postgres: PostgresServer, pgbouncer: PgBouncer
) -> tuple[str, str]:
    """A fresh database: its URL through the pooler (the driver of the param),
    and the server's own URL, for the test's reads."""
    database = postgres.create_database()
    return pgbouncer.url(database, driver=request.param), postgres.url(database)


Run = tuple[str, float, int, str]


def _runs(direct_url: str) -> list[Run]:
    return rows(direct_url, "SELECT job, tick, fence, instance FROM runs")


@pytest.mark.slow  # 7-8 s a driver of three app processes: .ci/run's slow pass
def test_three_instances_behind_a_transaction_pooler_run_every_tick_once(
    pooled: tuple[str, str], apps: list[App]
) -> None:
    """Given the pooler's plain URL, 3 instances run each (job, tick) once and
    leave none out; no claim fails and no row of the store holds junk."""
    url, direct = pooled
    for _ in range(3):
        apps.append(App(url, JOBS=12, INTERVAL=0.5, TIMEOUT=2, STORE_URL=1))
    for app in apps:
        app.wait_started()

    def shared() -> bool:
        # Eight runs of each job, however long a loaded machine takes, shared by
        # two instances at least.
        found = _runs(direct)
        each = Counter(r[0] for r in found)
        return len({r[3] for r in found}) >= 2 and all(each[f"job{n}"] >= 8 for n in range(12))

    wait_until(shared, timeout=30)
    for app in apps:
        app.terminate()
    said = warnings(apps)
    assert "store unreachable" not in said and "prepared statement" not in said, said
    all_runs = _runs(direct)
    keys = [(job, tick) for job, tick, *_ in all_runs]
    assert len(keys) == len(set(keys)), "a tick ran twice"
    for job in (f"job{n}" for n in range(12)):
        ticks = [tick for j, tick, *_ in all_runs if j == job]
        assert len(ticks) >= 8, (job, ticks, said)
        assert_none_left_out(direct, job, ticks, 0.5, apps)
    # The instants' rows are keyed by a digest of a set of jobs, never by an
    # instance's id: one instance's values bound to another's statement did that.
    instances = {r[0] for r in rows(direct, "SELECT id FROM fastapi_jobs_instances")}
    keys_of_instants = {r[0] for r in rows(direct, "SELECT key FROM fastapi_jobs_instants")}
    assert not keys_of_instants & instances


@pytest.mark.parametrize("driver", DRIVERS)
async def test_statement_mode_is_refused_at_startup_naming_the_fix(
    postgres: PostgresServer, statement_pooler: PgBouncer, driver: str
) -> None:
    """A pooler in statement mode cannot run a transaction: the app does not
    start, and the error says which mode to use."""
    url = statement_pooler.url(postgres.create_database(), driver=driver)
    scheduler = Scheduler(store=SQLAlchemyStore(url))
    with pytest.raises(ConfigurationError, match="pool_mode = transaction"):
        async with serve(FastAPI(lifespan=scheduler.lifespan)):
            pass


async def test_an_app_engine_that_keeps_prepared_statements_is_refused_behind_a_pooler(
    pooled: tuple[str, str],
) -> None:
    """The app's own engine, made from the pooler's plain URL, keeps prepared
    statements: the store refuses it at startup and names the connect argument."""
    url, _ = pooled
    engine = create_async_engine(url)
    fix = "prepare_threshold" if "psycopg" in url else "statement_cache_size"
    try:
        scheduler = Scheduler(store=SQLAlchemyStore(engine))
        with pytest.raises(ConfigurationError, match=fix):
            async with serve(FastAPI(lifespan=scheduler.lifespan)):
                pass
    finally:
        await engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(2))
def test_instances_started_at_once_with_an_engine_that_keeps_statements_are_all_refused(
    pooled: tuple[str, str], apps: list[App], round_: int
) -> None:
    """Three app processes started at once behind the pooler, each giving the
    store its own engine left at the driver's defaults: every one of them
    refuses to start, naming the fix, though their statements meet each other's
    on the pooler's shared connections before the store's check can tell (2 of
    3 used to start, then skip every tick as store_unavailable)."""
    url, _ = pooled
    fix = "prepare_threshold" if "psycopg" in url else "statement_cache_size"
    apps.extend(App(url, JOBS=2, INTERVAL=0.5, APP_TABLES=0) for _ in range(3))
    wait_until(lambda: all(app.proc.poll() is not None for app in apps), timeout=60)
    for app in apps:
        assert app.proc.returncode != 0, app.output()
        assert "ConfigurationError" in app.output() and fix in app.output(), app.output()
        assert "Application startup complete" not in app.output()


async def test_an_app_engine_without_prepared_statements_is_used_behind_a_pooler(
    pooled: tuple[str, str],
) -> None:
    """The app's own engine, made as a pooler needs, is shared by the store: a
    claim goes through it, and the next claim of the tick is refused."""
    url, _ = pooled
    safe = {"prepare_threshold": None} if "psycopg" in url else {"statement_cache_size": 0}
    engine = create_async_engine(url, connect_args=safe)
    stores = [SQLAlchemyStore(engine), SQLAlchemyStore(engine)]
    try:
        for store in stores:
            await store.open({}, Instance())
        assert await claim1(stores[0], "job", 10.0) is not None
        assert await claim1(stores[1], "job", 10.0) is None
    finally:
        for store in stores:
            await store.close()
        await engine.dispose()


async def test_the_statements_of_many_stores_through_one_pooler_never_mix(
    pooled: tuple[str, str],
) -> None:
    """8 stores, each with its own engine, claim the same ticks at once through
    the pooler's 4 server connections: each tick is claimed by one of them, and
    no statement fails or meets another store's parameters."""
    url, direct = pooled
    stores = [SQLAlchemyStore(url) for _ in range(8)]
    try:
        for store in stores:
            await store.open({}, Instance())
        for tick in range(1, 41):
            for job in (f"j{n}" for n in range(5)):
                got = await asyncio.gather(*(claim1(s, job, float(tick)) for s in stores))
                won = [
                    (store, fence)
                    for store, fence in zip(stores, got, strict=True)
                    if fence is not None
                ]
                assert len(won) == 1, (job, tick, got)
                store, fence = won[0]
                await release1(store, job, fence, "ok", None, 0.0)
    finally:
        for store in stores:
            await store.close()
    claims = rows(direct, "SELECT job, fence FROM fastapi_jobs_claims ORDER BY job")
    assert claims == [(f"j{n}", 40) for n in range(5)]


@pytest.mark.parametrize("driver", DRIVERS)
async def test_straight_to_postgresql_the_stores_own_engine_keeps_its_statements(
    postgres: PostgresServer, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No pooler in between: once the store has checked, the connections of the
    engine it made keep prepared statements (each claim is then parsed once),
    and nothing about a pooler is said."""
    url = postgres.url(postgres.create_database(), driver=driver)
    store = SQLAlchemyStore(url)
    await store.open({}, Instance())
    try:
        assert await claim1(store, "job", 10.0) == 1

        async def keeps(conn: Any) -> bool:
            raw = conn.sync_connection.connection.driver_connection
            if driver == "asyncpg":
                return bool(raw._stmt_cache_enabled)
            return raw.prepare_threshold is not None

        assert await store._operations.run(keeps)
    finally:
        await store.close()
    assert "pooler" not in caplog.text
