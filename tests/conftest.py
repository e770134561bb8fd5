"""Shared helpers. Lifespans are entered in the test body (see `serve`), never in
async fixtures: a task group must be entered and left by the same task."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import sqlalchemy as sa
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from fastapi_jobs import Outcome, Scheduler
from fastapi_jobs.stores import Ended, Instance, SQLAlchemyStore, Store
from fastapi_jobs.testing import LoopClock

from .support.browser import chromium
from .support.cluster import App
from .support.pgbouncer import PgBouncer
from .support.postgres import PostgresServer
from .support.redis import RedisServer
from .support.tools import missing

# pytest-asyncio 1.3 asks asyncio for "the current loop" around each test; with
# none set, asyncio makes one that nobody closes, and its garbage collection
# later fails a random test (pytest-asyncio #724). Hold one for the session.
_SESSION_LOOP = asyncio.new_event_loop()
asyncio.set_event_loop(_SESSION_LOOP)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _SESSION_LOOP.close()


# Markers follow the fixtures a test uses, so a new test is marked by using them:
# .ci/run selects by marker (`-m "not postgres and not processes and not browser"`
# on the newer Pythons), and a test cannot slip through by its name.
# A PostgreSQL server: the fixture itself, or these fixtures' PostgreSQL params
# (which reach the server through request.getfixturevalue, out of fixturenames' sight).
POSTGRES_PARAMS = {"database_url": {"asyncpg", "psycopg"}, "cluster_url": {"postgresql"}}
# The queue contract's params (tests/queues/test_queue_contract.py): the server each needs.
QUEUE_PARAMS = {
    "arq": "redis",
    "celery": "redis",
    "procrastinate-asyncpg": "postgres",
    "procrastinate-psycopg": "postgres",
}
MARKED_BY = {
    "postgres": "postgres",  # a real PostgreSQL server
    # A server whose clock the test steps (tests/core/test_clock_steps.py).
    "stepped_postgres": "postgres",
    "apps": "processes",  # app processes in uvicorn sharing a database (tests/support/cluster.py)
    "newcomer": "processes",  # the tutorial's app on three workers (tests/project/test_tutorial.py)
    "browser": "browser",  # headless Chromium (tests/web/test_page_browser.py)
    "redis": "redis",  # a real Redis server (tests/support/redis.py)
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params: dict[str, object] = callspec.params if callspec is not None else {}
        for fixture, marker in MARKED_BY.items():
            if fixture in fixtures:
                item.add_marker(marker)
        if any(params.get(fixture) in values for fixture, values in POSTGRES_PARAMS.items()):
            item.add_marker("postgres")
        queue = params.get("queue")
        if isinstance(queue, str) and queue in QUEUE_PARAMS:
            item.add_marker(QUEUE_PARAMS[queue])


@pytest.fixture(autouse=True, scope="module")
def _short_collections() -> None:
    """Each module starts with what is alive moved out of the collector's sight.
    A full collection stops this process for as long as it takes to walk every
    object; with all that the session had imported and kept it took up to 0.3 s,
    longer than what the real-time tests allow for a claim to reach SQLite.
    Garbage is collected first, so only what lives on is frozen."""
    gc.collect()
    gc.freeze()


# A Monday, midnight UTC: virtual time in the tests starts here.
START = datetime(2026, 3, 2, tzinfo=UTC)
HOUR = 3600.0


def virtual_scheduler(start: datetime = START, **kwargs: object) -> Scheduler:
    """A scheduler whose wall clock moves with the (looptime) event loop."""
    return Scheduler(clock=LoopClock(start), **kwargs)  # type: ignore[arg-type]


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and give a client for it, in one task."""
    async with LifespanManager(app, startup_timeout=None, shutdown_timeout=None) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


Server = TypeVar("Server", PostgresServer, RedisServer, PgBouncer)


def serving(make: Callable[[], Server], what: str) -> Iterator[Server]:
    """A server made and started for the session (a pytest worker's), destroyed
    after. Skips locally where none can start (not even be made: no binaries); in
    CI (CI=true) that is a failure, never a skip (tests/support/tools.py)."""
    try:
        server = make()
        server.start()
    except Exception as exc:  # noqa: BLE001 - reported as the skip/failure reason
        missing(f"a {what} server", f"none could start: {exc}")
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session."""
    yield from serving(PostgresServer, "PostgreSQL")


@pytest.fixture(scope="session")
def redis() -> Iterator[RedisServer]:
    """A real Redis server for the session."""
    yield from serving(RedisServer, "Redis")


@pytest.fixture
def on_statement() -> Iterator[Callable[[Callable[..., None]], None]]:
    """Call ``listen(fn)`` to have ``fn`` see every statement any engine sends (the
    store opens an engine of its own on SQLite); removed after the test."""
    added: list[Callable[..., None]] = []

    def listen(fn: Callable[..., None]) -> None:
        event.listen(sa.engine.Engine, "before_cursor_execute", fn)
        added.append(fn)

    yield listen
    for fn in added:
        event.remove(sa.engine.Engine, "before_cursor_execute", fn)


BACKENDS = ["sqlite", "asyncpg", "psycopg"]


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database on each backend: a SQLite file, or a new
    PostgreSQL database reached through asyncpg or psycopg."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.url(server.create_database(), driver=request.param)


@asynccontextmanager
async def open_store(engine: AsyncEngine, **options: Any) -> AsyncIterator[SQLAlchemyStore]:
    """A store opened on ``engine`` (a peer, a seed, a watcher), closed even when
    the test fails: an unclosed SQLite store leaves its connections to the
    garbage collector, whose ResourceWarning then fails some later test."""
    store = SQLAlchemyStore(engine, **options)
    await store.open({}, Instance())
    try:
        yield store
    finally:
        await store.close()


async def pause_in_store(url: str, job: str) -> None:
    """Pause ``job`` in the store at ``url`` until resumed (as an operator did
    before the app started)."""
    store = SQLAlchemyStore(url)
    await store.open({}, Instance())
    try:
        await store.pause(job, None)
    finally:
        await store.close()


async def claim1(store: Store, job: str, tick: float) -> int | None:
    """One claim through the store's batch call: the fence, or None if held elsewhere."""
    fence = (await store.claim([(job, tick)])).get(job)
    if isinstance(fence, Exception):
        raise fence
    return fence


async def release1(
    store: Store, job: str, fence: int, outcome: Outcome, error: str | None, duration: float
) -> None:
    """One release through the store's batch call; a refused row raises."""
    refused = await store.release([Ended(job, fence, outcome, error, duration)])
    if job in refused:
        raise refused[job]


@pytest.fixture(params=["postgresql", "sqlite"])
def cluster_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database for the multi-process tests: a PostgreSQL database, or a
    SQLite file the processes share."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'cluster.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.url(server.create_database())


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium, one a module (the status page's tests, the docs site's)."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def apps() -> Iterator[list[App]]:
    """Every process a test starts; all killed at the end, whatever happened."""
    started: list[App] = []
    yield started
    for app in started:
        app.stop()
