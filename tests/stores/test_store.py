"""SQLAlchemyStore against real databases: SQLite files and PostgreSQL (asyncpg, psycopg)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from fastapi_jobs import (
    ConfigurationError,
    ErrorInfo,
    JobContext,
    LeaseLostError,
    StoreError,
    TickAheadError,
)
from fastapi_jobs.stores import Ended, Instance, SQLAlchemyStore

from ..conftest import START, claim1, open_store, release1
from ..support.waiting import poll


@asynccontextmanager
async def opened(
    url: str, engine: AsyncEngine | None = None, **options: object
) -> AsyncIterator[tuple[SQLAlchemyStore, AsyncEngine]]:
    engine = engine or create_async_engine(url)
    store = SQLAlchemyStore(engine, **options)  # type: ignore[arg-type]
    await store.open({}, Instance())
    try:
        yield store, engine
    finally:
        await store.close()
        await engine.dispose()


async def test_first_claim_of_a_tick_wins_with_fence_1(database_url: str) -> None:
    """A new job's first claim creates its row and returns fence 1."""
    async with opened(database_url) as (store, _):
        assert await claim1(store, "digest", 100.0) == 1
        assert await store.last_tick("digest") == 100.0


async def test_a_tick_is_claimed_once(database_url: str) -> None:
    """Claiming the same tick again fails, even after the first claim was released."""
    async with opened(database_url) as (store, _):
        fence = await claim1(store, "digest", 100.0)
        assert fence == 1
        await release1(store, "digest", fence, "ok", None, 0.1)
        assert await claim1(store, "digest", 100.0) is None
        assert await claim1(store, "digest", 99.0) is None  # older ticks never run


async def test_a_newer_tick_waits_for_the_lease(database_url: str) -> None:
    """While a run holds its lease, the next tick is not claimed (no overlap across instances)."""
    async with opened(database_url) as (a, engine), open_store(engine) as peer:
        assert await claim1(a, "digest", 100.0) == 1
        assert await claim1(peer, "digest", 200.0) is None
        await release1(a, "digest", 1, "ok", None, 1.0)
        assert await claim1(peer, "digest", 200.0) == 2


async def test_an_expired_lease_lets_a_peer_claim_and_the_fence_grows(database_url: str) -> None:
    """A holder that stops renewing loses the job after its lease; its renewals then fail."""
    # The timeout is what a claim may wait in the database, and this process may
    # pause (a garbage collection) between stamping a claim and SQLite running it:
    # a short timeout (0.15 s; it must stay under a third of the lease) refused
    # the peer's claim in CI.
    async with (
        opened(database_url, lease=1.5, timeout=0.45) as (holder, engine),
        open_store(engine, lease=1.5, timeout=0.45) as peer,
    ):
        assert await claim1(holder, "digest", 100.0) == 1
        assert await holder.renew("digest", 1)
        await anyio.sleep(1.8)  # the lease (on the database's clock) runs out
        assert await claim1(peer, "digest", 200.0) == 2
        assert not await holder.renew("digest", 1)
        await release1(holder, "digest", 1, "ok", None, 1.0)  # a stale release changes nothing
        view = await peer.read()
        assert view.jobs["digest"].fence == 2
        assert view.jobs["digest"].running_on == peer._owner
        assert view.jobs["digest"].last_outcome is None


async def test_release_records_the_outcome_cluster_wide(database_url: str) -> None:
    """A released run shows its outcome, error, duration and instance to every peer."""
    async with opened(database_url) as (store, _):
        await store.beat()
        fence = await claim1(store, "digest", START.timestamp())
        assert fence == 1
        await release1(store, "digest", fence, "failed", "ConnectionError: smtp", 2.5)
        view = await store.read()
    job = view.jobs["digest"]
    assert job.last_tick == START
    assert job.last_outcome == "failed"
    assert job.last_error == ErrorInfo(type="ConnectionError", message="smtp")
    # In JSON (GET /jobs' `cluster`), the same shape as the top-level last_error.
    shown = view.model_dump(mode="json")["jobs"]["digest"]["last_error"]
    assert shown == {"type": "ConnectionError", "message": "smtp"}
    assert job.last_duration_s == pytest.approx(2.5)
    assert job.running_on is None
    assert job.last_instance == store._owner
    assert job.last_finished_at is not None and job.last_started_at is not None
    assert job.last_finished_at >= job.last_started_at
    [me] = view.instances
    assert me.id == store._owner


async def test_releases_sent_together_share_a_statement_and_keep_their_own_outcome(
    database_url: str, on_statement: Callable[[Callable[..., None]], None]
) -> None:
    """Three releases in one call: one statement, each row its own outcome, error
    and duration; a release naming a stale fence changes nothing."""
    statements: list[str] = []
    async with opened(database_url) as (store, _):

        def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
            statements.append(statement)

        on_statement(seen)
        fences = await store.claim([("a", 100.0), ("b", 100.0), ("c", 100.0)])
        assert fences == {"a": 1, "b": 1, "c": 1}
        assert await claim1(store, "c", 101.0) is None  # c is still held
        statements.clear()
        refused = await store.release(
            [
                Ended("a", 1, "ok", None, 0.5),
                Ended("b", 1, "failed", "KeyError: 'x'", 1.5),
                Ended("c", 99, "timed_out", "TimeoutError: late", 9.0),
            ]
        )
        view = await store.read()
    assert refused == {}
    assert len([s for s in statements if "UPDATE fastapi_jobs_claims" in s]) == 1
    a, b, c = (view.jobs[job] for job in ("a", "b", "c"))
    assert (a.last_outcome, a.last_error, a.last_duration_s) == ("ok", None, 0.5)
    assert (b.last_outcome, str(b.last_error), b.last_duration_s) == (
        "failed",
        "KeyError: 'x'",
        1.5,
    )
    assert (c.last_outcome, c.running_on) == (None, store._owner)  # stale fence: still held
    assert a.running_on is None and b.running_on is None


@pytest.mark.parametrize("listened", [True, False], ids=["listened", "driver"])
async def test_batches_of_many_sizes_are_answered_right(
    database_url: str, on_statement: Callable[[Callable[..., None]], None], listened: bool
) -> None:
    """Batches of 1 to 40 rows (more sizes than the store keeps compiled), each in
    one statement: every claim gets the right fence and every release frees the
    right claim; a batch may mix ticks. Through SQLAlchemy (something listens to
    the statements), and on asyncpg, without a listener, to the driver itself."""
    claims_sent: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "INSERT INTO fastapi_jobs_claims" in statement:
            claims_sent.append(statement)

    async with opened(database_url) as (store, _):
        if listened:
            on_statement(seen)
        for size in range(1, 41):
            jobs = [f"j{k}" for k in range(size)]
            # j{k} joined at batch k + 1; one row a tick later than the others.
            wanted = [(job, float(size) + (0.5 if k == 0 else 0.0)) for k, job in enumerate(jobs)]
            fences = await store.claim(wanted)
            assert fences == {f"j{k}": size - k for k in range(size)}
            assert (
                await store.release(
                    [Ended(job, size - k, "ok", None, 0.0) for k, job in enumerate(jobs)]
                )
                == {}
            )
        view = await store.read()
    assert len(claims_sent) == (40 if listened else 0)
    assert all(view.jobs[f"j{k}"].running_on is None for k in range(40))
    last = view.jobs["j0"].last_tick
    assert last is not None and last.timestamp() == 40.5


async def test_claims_go_to_asyncpg_itself_unless_something_listens(
    database_url: str,
    on_statement: Callable[[Callable[..., None]], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On asyncpg, the claims and releases skip SQLAlchemy's cursor (~200 µs a
    statement): unless something listens to the engine's statements (a tracing
    instrumentation, SQL logging), which then sees them as it would any other."""
    through: list[str] = []
    exec_driver_sql = AsyncConnection.exec_driver_sql

    async def spied(self: AsyncConnection, statement: str, *args: Any, **kwargs: Any) -> Any:
        through.append(statement)
        return await exec_driver_sql(self, statement, *args, **kwargs)

    monkeypatch.setattr(AsyncConnection, "exec_driver_sql", spied)
    listened: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        listened.append(statement)

    def claims(statements: list[str]) -> int:
        """The claim's and the release's statements (on SQLite, with its history
        row written by a statement of its own, that one too)."""
        kinds = ("INSERT INTO fastapi_jobs_claims", "UPDATE fastapi_jobs_claims")
        return len([s for s in statements if any(kind in s for kind in kinds)])

    async with opened(database_url) as (store, _):
        await release1(store, "a", await claim1(store, "a", 1.0) or 0, "ok", None, 0.1)
        direct = database_url.startswith("postgresql+asyncpg")
        assert claims(through) == (0 if direct else 2)
        through.clear()
        on_statement(seen)
        await release1(store, "a", await claim1(store, "a", 2.0) or 0, "ok", None, 0.1)
    assert claims(through) == claims(listened) == 2
    if direct:  # and with SQLAlchemy's echo on, through SQLAlchemy too (it logs them)
        through.clear()
        async with opened(database_url, create_async_engine(database_url, echo=True)) as (
            store,
            _,
        ):
            await release1(store, "b", await claim1(store, "b", 3.0) or 0, "ok", None, 0.1)
        assert claims(through) == 2


async def test_a_claim_whose_caller_gave_up_is_released(database_url: str) -> None:
    """The caller stops waiting before the claim is even sent; the claim is made all
    the same, then released at once, so the job is free for the next tick instead of
    held for a lease by a run that never happens. A run that never started is no
    run: the job's last run stays what it was, and the history has no row for it."""
    async with opened(database_url) as (store, _):
        fence = await claim1(store, "digest", 99.0)
        assert fence == 1
        await release1(store, "digest", fence, "ok", None, 0.5)
        with anyio.move_on_after(0):  # gave up before the statement could even be sent
            await claim1(store, "digest", 100.0)
            pytest.fail("the claim should not have been waited for")

        async def released() -> bool:  # the release is sent by the store on its own
            job = (await store.read()).jobs.get("digest")
            return job is not None and job.running_on is None

        await poll(released)
        job = (await store.read()).jobs["digest"]
        assert (job.last_outcome, job.last_error, job.last_duration_s) == ("ok", None, 0.5)
        assert [run.fence for run in await store.runs("digest", 10)] == [1]
        assert await claim1(store, "digest", 101.0) == 3  # free at once, not after 30 s


class AnswerLost(SQLAlchemyStore):
    """A store whose claim operations outlast their deadline after the database
    made the claims: the answer is lost, as when this process stalls (a long
    garbage collection, a suspended VM) or the reply crawls back."""

    async def _claim_all(self, *args: Any) -> dict[str, int | Exception]:
        fences = await super()._claim_all(*args)
        await asyncio.sleep(10)  # cut by the operation's deadline (twice the timeout)
        return fences


async def test_a_claim_whose_answer_was_lost_is_released(database_url: str) -> None:
    """The database made the claims but the operation hit its deadline before it
    had the answer: the store looks up which of the ticks it asked for it holds and
    releases them, so the jobs are free for their next ticks instead of held for
    a lease by runs that never happen. A claim of the same instance it did not give
    up on is left alone."""
    async with opened(database_url) as (store, engine):
        assert await claim1(store, "running", 1.0) == 1  # a run of this instance goes on
        # The same instance, its claims made through a stalled call.
        # A timeout wide enough for the claim to be made on a loaded machine (the
        # operation's deadline, twice it, then cuts the 10 s stall).
        lossy, same = AnswerLost(engine, lease=30, timeout=1.0), store._instance
        assert same is not None
        await lossy.open({}, same)
        try:
            with pytest.raises(TimeoutError):
                await lossy.claim([("digest", 100.0), ("report", 100.0), ("running", 2.0)])

            async def released() -> bool:
                jobs = (await store.read()).jobs
                return all(jobs[job].running_on is None for job in ("digest", "report"))

            await poll(released)
        finally:
            await lossy.close()
        view = await store.read()
        assert view.jobs["digest"].last_outcome is None  # never ran: no run recorded
        assert await store.runs("digest", 10) == []
        assert view.jobs["running"].running_on == store._owner  # not asked for: still held
        assert view.jobs["running"].last_tick.timestamp() == 1.0  # type: ignore[union-attr]
        assert await claim1(store, "digest", 101.0) == 2  # free now, not after 30 s
        assert await claim1(store, "report", 101.0) == 2


async def test_close_removes_the_instance_row(database_url: str) -> None:
    """A graceful stop takes this instance off the list at once."""
    async with opened(database_url) as (watcher, engine):
        store = SQLAlchemyStore(engine)
        await store.open({}, Instance())
        await store.beat()
        assert [i.id for i in (await watcher.read()).instances] == [store._owner]
        await store.close()
        assert (await watcher.read()).instances == []


async def test_tables_are_created_on_first_use_and_user_tables_are_untouched(
    database_url: str,
) -> None:
    """Only the store's tables are created; a user table of a similar name is left alone."""
    engine = create_async_engine(database_url)
    async with engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE claims (job TEXT, note TEXT)"))
        await conn.execute(sa.text("INSERT INTO claims VALUES ('mine', 'keep me')"))
    async with opened(database_url, engine=engine) as (store, _):
        assert await claim1(store, "digest", 1.0) == 1
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: sorted(sa.inspect(c).get_table_names()))
            rows = (await conn.execute(sa.text("SELECT job, note FROM claims"))).all()
    assert names == [
        "claims",
        "fastapi_jobs_claims",
        "fastapi_jobs_handoffs",
        "fastapi_jobs_instances",
        "fastapi_jobs_instants",
        "fastapi_jobs_pauses",
        "fastapi_jobs_runs",
        "fastapi_jobs_schedules",
    ]
    assert [tuple(r) for r in rows] == [("mine", "keep me")]


async def test_missing_table_without_create_tables_says_how_to_create_it(database_url: str) -> None:
    """create_tables=False and no table: a clear error naming the DDL."""
    async with opened(database_url, create_tables=False) as (store, _):
        with pytest.raises(StoreError, match=r"fastapi_jobs_claims.*SQLAlchemyStore\.ddl\(\)"):
            await claim1(store, "digest", 1.0)


async def test_shipped_ddl_creates_working_tables(database_url: str) -> None:
    """The DDL from ddl() is what the store needs."""
    engine = create_async_engine(database_url)
    dialect = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    async with engine.begin() as conn:
        for statement in SQLAlchemyStore.ddl(dialect).split(";"):
            if statement.strip():
                await conn.execute(sa.text(statement))
    async with opened(database_url, engine=engine, create_tables=False) as (store, _):
        assert await claim1(store, "digest", 1.0) == 1


async def test_fenced_write_is_rejected_after_a_newer_claim(database_url: str) -> None:
    """A job guarding its write with store.fenced(ctx) cannot write once a newer run claimed."""
    async with opened(database_url, lease=1.5, timeout=0.45) as (store, engine):
        async with engine.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE ledger (id INTEGER PRIMARY KEY, note TEXT)"))
            await conn.execute(sa.text("INSERT INTO ledger VALUES (1, 'initial')"))
        ledger = sa.table("ledger", sa.column("id"), sa.column("note"))
        old = JobContext(
            "digest", START, {}, store_logger(), fence=await claim1(store, "digest", 1.0)
        )
        await anyio.sleep(1.7)  # the old run's lease runs out
        new = JobContext(
            "digest", START, {}, store_logger(), fence=await claim1(store, "digest", 2.0)
        )
        assert (old.fence, new.fence) == (1, 2)

        async def write(ctx: JobContext, note: str) -> int:
            async with engine.begin() as conn:
                result = await conn.execute(
                    sa.update(ledger).where(ledger.c.id == 1, store.fenced(ctx)).values(note=note)
                )
            return result.rowcount

        assert await write(old, "stale") == 0
        assert await write(new, "fresh") == 1
        with pytest.raises(LeaseLostError, match="no fence"):
            store.fenced(JobContext("digest", START, {}, store_logger()))


def store_logger() -> logging.Logger:
    return logging.getLogger("test")


def test_bad_store_options_fail_at_declaration() -> None:
    """Options are checked when the store is made."""
    with pytest.raises(ConfigurationError, match="AsyncEngine, a database URL, or a callable"):
        SQLAlchemyStore(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="lease"):
        SQLAlchemyStore("sqlite+aiosqlite:///jobs.db", lease=0)
    with pytest.raises(ConfigurationError, match="shorter than a third of the lease"):
        SQLAlchemyStore("sqlite+aiosqlite:///jobs.db", lease=3, timeout=2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease": float("inf")}, "lease=inf: must be a finite"),
        ({"lease": 10**6}, "lease=1000000: too long"),
        ({"heartbeat": 1e-9}, "heartbeat=1e-09: must be >= 0.1"),
        ({"timeout": True}, "timeout=True: not a duration"),
        ({"lease": "30"}, "lease='30': not a duration"),
        ({"create_tables": "no"}, "create_tables='no': pass True or False"),
        ({"table_prefix": 5}, "table_prefix=5: not a string"),
        ({"table_prefix": "jobs\n"}, "printable characters"),
    ],
)
def test_store_settings_that_cannot_work_are_refused(
    options: dict[str, object], message: str
) -> None:
    """A lease no crash would ever free, a heartbeat that loops on the database, a
    bool for a duration: refused with what is wrong."""
    with pytest.raises(ConfigurationError, match=message):
        SQLAlchemyStore("sqlite+aiosqlite:///jobs.db", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "sqlite+aiosqlite://",
        "sqlite+aiosqlite:///:memory:",
        "sqlite+aiosqlite:///file:j?mode=memory&uri=true",
    ],
)
async def test_an_in_memory_sqlite_store_is_refused(url: str) -> None:
    """Each process would have its own in-memory database and claim every tick:
    refused as a URL, and as an engine when the store opens."""
    with pytest.raises(ConfigurationError, match="in-memory SQLite"):
        SQLAlchemyStore(url)
    engine = create_async_engine(url, poolclass=sa.pool.StaticPool)
    try:
        with pytest.raises(StoreError, match="in-memory SQLite"):
            await SQLAlchemyStore(engine).open({}, Instance())
    finally:
        await engine.dispose()


@pytest.mark.parametrize("pool", [sa.pool.StaticPool, sa.pool.AssertionPool])
async def test_a_postgresql_engine_of_one_shared_connection_is_refused(pool: type) -> None:
    """The scheduler's statements run beside the app's: on a PostgreSQL engine whose
    pool hands one connection to everyone, the app's queries would fail while a
    claim runs. Refused when the store opens (creating the engine connects to
    nothing), naming the pool."""
    engine = create_async_engine("postgresql+asyncpg://u@localhost/none", poolclass=pool)
    try:
        with pytest.raises(StoreError, match=f"has a {pool.__name__}: one connection"):
            await SQLAlchemyStore(engine).open({}, Instance())
    finally:
        await engine.dispose()


async def test_engine_callable_must_return_an_engine() -> None:
    """A callable that picks something else out of the state fails clearly at start."""
    store = SQLAlchemyStore(lambda state: state["db"])
    with pytest.raises(StoreError, match="not an AsyncEngine"):
        await store.open({"db": "postgresql://not-an-engine"}, Instance())


def test_ddl_for_an_unknown_dialect_is_refused() -> None:
    """ddl() knows the two supported databases only."""
    with pytest.raises(ConfigurationError, match="'postgresql' or 'sqlite'"):
        SQLAlchemyStore.ddl("mysql")


async def test_a_renewal_after_the_release_does_not_take_the_lease_back(database_url: str) -> None:
    """Once released, a late renewal of the same claim fails and leaves the job free."""
    async with opened(database_url) as (store, _):
        fence = await claim1(store, "digest", 1.0)
        assert fence == 1
        await release1(store, "digest", fence, "ok", None, 0.1)
        assert not await store.renew("digest", fence)
        assert await claim1(store, "digest", 2.0) == 2


async def test_a_row_the_database_refuses_fails_alone_in_its_batch(database_url: str) -> None:
    """Claims due together share one statement; one that the database refuses (a
    name longer than the column, on PostgreSQL) fails for its job only, and a
    release whose error text the database refuses (a NUL) fails for its job only."""
    async with opened(database_url) as (store, _):
        too_long = "x" * 300
        fences = await store.claim([("good", 10.0), (too_long, 10.0), ("also_good", 10.0)])
        if database_url.startswith("sqlite"):
            assert fences == {"good": 1, too_long: 1, "also_good": 1}  # SQLite keeps any length
        else:
            assert fences["good"] == 1 and fences["also_good"] == 1
            assert isinstance(fences[too_long], sa.exc.DBAPIError)
        refused = await store.release(
            [
                Ended("good", 1, "failed", "Bad\x00Error", 0.1),
                Ended("also_good", 1, "ok", None, 0.1),
            ]
        )
        view = await store.read()
    assert view.jobs["also_good"].last_outcome == "ok"
    if database_url.startswith("sqlite"):
        assert refused == {}
    else:
        assert list(refused) == ["good"]  # PostgreSQL text holds no NUL
        assert isinstance(refused["good"], sa.exc.DBAPIError)


async def test_a_row_the_database_refuses_alone_in_its_statement_fails_for_its_job(
    database_url: str,
) -> None:
    """A claim or a release of one row that the database refuses (on PostgreSQL: a
    name longer than the column, a NUL in a text) is that job's failure, as in a
    batch; the call goes through, so the scheduler does not take it for a store
    that cannot be reached, nor send the release again before every claim."""
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite keeps a name of any length and a NUL")
    async with opened(database_url) as (store, _):
        too_long = "x" * 300
        fences = await store.claim([(too_long, 10.0)])
        assert list(fences) == [too_long] and isinstance(fences[too_long], sa.exc.DBAPIError)
        assert await claim1(store, "good", 10.0) == 1
        refused = await store.release([Ended("good", 1, "failed", "Bad\x00Error", 0.1)])
        assert list(refused) == ["good"] and isinstance(refused["good"], sa.exc.DBAPIError)
        assert (await store.read()).jobs["good"].running_on == store._owner  # still held


@pytest.mark.parametrize("how", ["DROP TABLE", "DELETE FROM"])
async def test_claims_recover_after_the_table_is_dropped_or_emptied(
    database_url: str, how: str
) -> None:
    """The claims table dropped (or emptied) under a running store: the next claim
    after the failure finds it again (recreated), with no restart."""
    async with opened(database_url) as (store, engine):
        assert await claim1(store, "digest", 10.0) == 1
        await release1(store, "digest", 1, "ok", None, 0.1)
        async with engine.begin() as conn:
            await conn.execute(sa.text(f"{how} fastapi_jobs_claims"))
        fences: list[int | str | None] = []
        for tick in (11.0, 12.0, 13.0):
            try:
                fences.append(await claim1(store, "digest", tick))
            except sa.exc.DBAPIError:
                fences.append("failed")
            else:
                await release1(store, "digest", fences[-1], "ok", None, 0.1)  # type: ignore[arg-type]
    # At most the first claim after the drop fails; then the table is back.
    assert fences[-2:] in ([1, 2], [2, 3])
    assert fences[0] in ("failed", 1)


async def test_a_tick_in_the_future_on_the_database_clock_is_not_claimed(
    database_url: str,
) -> None:
    """A host whose clock jumped ahead cannot claim a tick the database has not
    reached (beyond a second), so it cannot block the tick the others claim next.
    The store says why (`TickAheadError`, with the database's reading of its
    clock), where a claim held elsewhere is only missing."""
    import time

    async def ahead(tick: float) -> TickAheadError:
        sent = time.time()
        refused = (await store.claim([("digest", tick)]))["digest"]
        assert isinstance(refused, TickAheadError), refused
        assert refused.tick == tick
        assert sent - 0.5 < refused.db_time < time.time() + 0.5  # the server's clock: this host's
        return refused

    async with opened(database_url) as (store, _):
        now = time.time()
        await ahead(now + 30)  # the jumped host
        assert await store.last_tick("digest") is None  # nothing recorded: first claim refused
        assert await claim1(store, "digest", now - 1) == 1  # the healthy host, on time
        await release1(store, "digest", 1, "ok", None, 0.1)
        assert "ahead of the database's clock" in str(await ahead(now + 30))  # as an update
        assert await claim1(store, "digest", now + 0.5) == 2  # within the margin
        assert await store.last_tick("digest") == pytest.approx(now + 0.5)
        # Held (here by this very claim), a tick due is refused without a word.
        assert await store.claim([("digest", now + 0.8)]) == {}
        # So is an instant (a set of jobs due together) claimed ahead of time.
        wanted = [("a", now + 30), ("b", now + 30), ("c", now - 1)]
        got = await store.claim(wanted, instant=("set", now + 30, {"a", "b"}))
        assert [type(got[job]) for job in "abc"] == [TickAheadError, TickAheadError, int]


async def test_creating_the_tables_is_not_held_to_an_operations_deadline(
    database_url: str,
) -> None:
    """The first claim waits for the tables however long their creation takes (here
    another worker's CREATE of the same table holds it 1 s); the claim's own
    deadline (twice the 0.3 s timeout) starts after."""
    if database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's catalog is where concurrent CREATEs wait on each other")
    engine = create_async_engine(database_url)
    other = await engine.connect()
    await other.begin()
    await other.execute(sa.text("CREATE TABLE fastapi_jobs_claims (job TEXT)"))

    async def roll_back_later() -> None:
        await anyio.sleep(1.0)
        await other.rollback()
        await other.close()

    async with (
        opened(database_url, engine=engine, lease=1.0, timeout=0.3) as (store, _),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(roll_back_later)
        assert await claim1(store, "digest", 100.0) == 1


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg2://app:s3cret@db/app",  # no asyncio
        "sqlite:///jobs.sqlite3",  # pysqlite
        "mysql+aiomysql://app:s3cret@db/app",
        "postgres://app:s3cret@db/app",  # a name SQLAlchemy has no dialect for (Heroku's)
    ],
)
def test_a_url_without_an_async_driver_of_a_supported_database_is_refused(url: str) -> None:
    """Said when the store is made, not at the first tick, with the URLs that work;
    the password is not repeated."""
    with pytest.raises(ConfigurationError, match=r"postgresql\+asyncpg://") as refused:
        SQLAlchemyStore(url)
    assert "s3cret" not in str(refused.value)


async def test_the_longest_table_prefix_keeps_every_name_whole(database_url: str) -> None:
    """PostgreSQL cuts a name past 63 bytes short: the longest prefix taken makes
    every table and index under its own name, and one byte more is refused."""
    prefix = "p" * 52
    async with opened(database_url, table_prefix=prefix) as (store, engine):
        assert await claim1(store, "digest", 10.0) == 1
        await release1(store, "digest", 1, "ok", None, 0.1)
        assert [run.outcome for run in await store.runs("digest", 10)] == ["ok"]
        async with engine.connect() as conn:
            tables, indexes = await conn.run_sync(
                lambda sync: (
                    sa.inspect(sync).get_table_names(),
                    [index["name"] for index in sa.inspect(sync).get_indexes(f"{prefix}runs")],
                )
            )
    assert {f"{prefix}{name}" for name in ("claims", "instances", "pauses", "runs")} <= set(tables)
    assert f"ix_{prefix}runs_job" in indexes
    with pytest.raises(ConfigurationError, match="use at most 52 bytes"):
        SQLAlchemyStore(database_url, table_prefix=prefix + "p")
    with pytest.raises(ConfigurationError, match="use at most 52 bytes"):
        SQLAlchemyStore.ddl("postgresql", table_prefix="é" * 27)  # 54 bytes
