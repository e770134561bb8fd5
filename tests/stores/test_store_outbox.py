"""The store's outbox (``<prefix>handoffs``), on every backend: a tick is
recorded as handed off once, with the queue's insert in the same transaction
(``once``) or after a send that went through (``sending``/``sent``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from fastapi_jobs.queues import Outbox
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import open_store

TICK = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _queue(conn: AsyncConnection) -> None:
    """A stand-in for a queue's own table in the same database (procrastinate's
    jobs): what ``once`` inserts beside its row, in one statement."""
    await conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS queue_jobs (id INTEGER, key TEXT)")


async def _jobs(conn: AsyncConnection) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in (await conn.exec_driver_sql("SELECT id, key FROM queue_jobs"))]


def _insert(id: int, key: str, *, sleep: float = 0.0) -> Any:
    """The queue's insert as ``once`` takes it: a statement returning ``id``."""
    sql = "INSERT INTO queue_jobs SELECT :id, :key FROM pg_sleep(:sleep) RETURNING id"
    statement = sa.text(sql).columns(sa.column("id", sa.Integer))
    return statement.bindparams(id=id, key=key, sleep=sleep)


@pytest.fixture
def postgres_url(database_url: str) -> str:
    if database_url.startswith("sqlite"):
        pytest.skip("a queue in the store's database is PostgreSQL's (SQLite: no INSERT in WITH)")
    return database_url


async def test_the_store_is_an_outbox(database_url: str) -> None:
    store = SQLAlchemyStore(database_url)
    assert isinstance(store.outbox, Outbox)


async def test_once_on_sqlite_records_what_the_statement_returns(database_url: str) -> None:
    engine = create_async_engine(database_url)
    select = sa.text("SELECT 7 AS id").columns(sa.column("id", sa.Integer))
    try:
        async with open_store(engine) as store:
            first = await store.outbox.once("digest", TICK, "q", select)
            second = await store.outbox.once("digest", TICK, "q", select)
    finally:
        await engine.dispose()
    assert (first, second) == (("7", True), ("7", False))


async def test_once_inserts_the_task_with_its_row_and_refuses_a_second(postgres_url: str) -> None:
    engine = create_async_engine(postgres_url)
    try:
        async with engine.begin() as conn:
            await _queue(conn)
        async with open_store(engine) as store:
            first = await store.outbox.once("digest", TICK, "q task", _insert(7, "a"))
            second = await store.outbox.once("digest", TICK, "q task", _insert(8, "b"))
            other = await store.outbox.once("digest", TICK.replace(hour=2), "q", _insert(9, "c"))
            assert store.outbox.dialect == engine.dialect.name
        async with engine.connect() as conn:
            jobs = await _jobs(conn)
    finally:
        await engine.dispose()
    assert first == ("7", True)
    assert second == ("7", False)  # recorded: the queue's second insert undone
    assert other == ("9", True)  # another tick is another row
    assert sorted(jobs) == [(7, "a"), (9, "c")]


async def test_once_makes_neither_when_the_insert_fails(postgres_url: str) -> None:
    engine = create_async_engine(postgres_url)
    fails = sa.text("SELECT CAST('x' AS INTEGER) AS id").columns(sa.column("id", sa.Integer))
    try:
        async with engine.begin() as conn:
            await _queue(conn)
        async with open_store(engine) as store:
            with pytest.raises(sa.exc.DBAPIError):
                await store.outbox.once("digest", TICK, "q", fails)
            # Nothing recorded: the retry enqueues.
            assert await store.outbox.once("digest", TICK, "q", _insert(2, "k")) == ("2", True)
        async with engine.connect() as conn:
            jobs = await _jobs(conn)
    finally:
        await engine.dispose()
    assert jobs == [(2, "k")]


async def test_two_concurrent_onces_enqueue_one_task(postgres_url: str) -> None:
    """Two instances hand off the same tick at the same moment (a claimer that
    was thought dead, and its peer): whichever records the tick first has its
    job in the queue; the other's insert is undone, and it gets that job's id."""
    engine = create_async_engine(postgres_url)
    try:
        async with engine.begin() as conn:
            await _queue(conn)
        async with open_store(engine) as a, open_store(engine) as b:
            results: list[tuple[str, bool]] = []

            async def second() -> None:
                await anyio.sleep(0.1)  # a's statement sleeps in the database meanwhile
                results.append(await b.outbox.once("digest", TICK, "q", _insert(2, "b")))

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
                results.append(await a.outbox.once("digest", TICK, "q", _insert(1, "a", sleep=1)))
        async with engine.connect() as conn:
            jobs = await _jobs(conn)
    finally:
        await engine.dispose()
    assert len(jobs) == 1
    [(winner, _)] = jobs
    assert sorted(results) == [(str(winner), False), (str(winner), True)]


async def test_once_takes_over_a_tick_recorded_as_sending(database_url: str) -> None:
    """A tick recorded as about to be sent elsewhere (``sending``) and never
    marked sent is not a tick handed off: ``once`` records its own insert."""
    engine = create_async_engine(database_url)
    select = sa.text("SELECT 5 AS id").columns(sa.column("id", sa.Integer))
    try:
        async with open_store(engine) as store:
            assert await store.outbox.sending("digest", TICK, "other") is None
            assert await store.outbox.once("digest", TICK, "q", select) == ("5", True)
            assert await store.outbox.sending("digest", TICK, "other") == "5"
    finally:
        await engine.dispose()


async def test_sending_then_sent_refuses_later_sends(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        async with open_store(engine) as store:
            outbox = store.outbox
            assert await outbox.sending("digest", TICK, "celery task x") is None
            # Not recorded as sent (the send failed, or the sender died): sent again.
            assert await outbox.sending("digest", TICK, "celery task x") is None
            await outbox.sent("digest", TICK, "celery task x", "digest@2026-03-02T01:00:00Z")
            assert await outbox.sending("digest", TICK, "celery task x") == (
                "digest@2026-03-02T01:00:00Z"
            )
            h = store.tables.handoffs
            async with engine.connect() as conn:
                rows = (await conn.execute(sa.select(h.c.job, h.c.queue, h.c.queue_id))).all()
    finally:
        await engine.dispose()
    assert [tuple(r) for r in rows] == [("digest", "celery task x", "digest@2026-03-02T01:00:00Z")]


async def test_prune_keeps_the_outbox_a_day_even_without_history(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        async with open_store(engine, history=0, history_max_age=60) as store:
            await store.outbox.sending("old", TICK, "q")
            await store.outbox.sending("new", TICK, "q")
            h = store.tables.handoffs
            async with engine.begin() as conn:
                # "old" was recorded two days ago.
                await conn.execute(
                    sa.update(h).where(h.c.job == "old").values(created_at=h.c.created_at - 172800)
                )
            await store.prune()
            async with engine.connect() as conn:
                jobs = (await conn.execute(sa.select(h.c.job))).scalars().all()
    finally:
        await engine.dispose()
    assert jobs == ["new"]


async def test_a_store_made_before_the_outbox_works_without_it(database_url: str) -> None:
    """``create_tables=False`` on the four tables of a release before the outbox:
    claims go on; only a hand-off that needs the outbox fails, naming the table."""
    engine = create_async_engine(database_url)
    try:
        async with open_store(engine) as made:
            pass
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f"DROP TABLE {made.tables.handoffs.name}")
        async with open_store(engine, create_tables=False) as store:
            assert await store.claim([("digest", 1.0)]) == {"digest": 1}
            with pytest.raises(sa.exc.DBAPIError, match="fastapi_jobs_handoffs"):
                await store.outbox.sending("digest", TICK, "q")
    finally:
        await engine.dispose()


async def test_a_queue_name_longer_than_its_column_is_cut_not_refused(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        async with open_store(engine) as store:
            assert await store.outbox.sending("digest", TICK, "celery task " + "x" * 500) is None
            h = store.tables.handoffs
            async with engine.connect() as conn:
                queue = await conn.scalar(sa.select(h.c.queue))
    finally:
        await engine.dispose()
    assert queue == ("celery task " + "x" * 500)[:200]


async def test_sent_records_a_tick_never_looked_up(database_url: str) -> None:
    """The first attempt of a tick just claimed sends without a lookup: its
    record is made by ``sent`` alone, and a later lookup finds it."""
    engine = create_async_engine(database_url)
    try:
        async with open_store(engine, lease=12, timeout=2) as store:
            assert store.outbox.lease == 12
            await store.outbox.sent("digest", TICK, "celery task x", "digest@t")
            assert await store.outbox.sending("digest", TICK, "celery task x") == "digest@t"
    finally:
        await engine.dispose()
