"""Claims in PostgreSQL or SQLite through SQLAlchemy's async engine.

Two tables, nothing else is touched:

- ``<prefix>claims``: one row per job. ``last_tick`` only moves forward;
  ``fence`` grows by one per claim; ``lease_until`` is NULL once released.
- ``<prefix>instances``: one row per live app process, for the status page.

Every time comparison uses the database's clock (``db_now()``); the app's clock
only computes ticks, which are the same in every process. Times are stored as
POSIX seconds (double precision) so that both databases compare them alike.

Each operation runs in an asyncio task of its own with its own deadline, and
callers only wait for it: see ``_run`` for why a statement is never cancelled
by its caller. SQLAlchemy's async engine runs on asyncio only, so this module
uses asyncio directly.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.expression import FunctionElement

from .._checks import seconds
from .._context import JobContext
from .._errors import ConfigurationError, LeaseLostError, StoreError
from .._status import ClusterJobStatus, ClusterView, InstanceStatus, Outcome, utc
from .._store import Instance

__all__ = ["SQLAlchemyStore"]

logger = logging.getLogger("fastapi_jobs.stores")

EngineSource = AsyncEngine | str | Callable[[Mapping[str, Any]], AsyncEngine]
T = TypeVar("T")


class db_now(FunctionElement[float]):
    """The database server's clock, as POSIX seconds."""

    type = sa.Double()
    inherit_cache = True


@compiles(db_now, "postgresql")
def _pg_now(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


class db_received(FunctionElement[float]):
    """When the statement reached the database, as POSIX seconds.

    A claim that waited behind a lock past the store timeout is not made: its
    caller has given up, and a claim nobody runs would hold the job for a lease.
    """

    type = sa.Double()
    inherit_cache = True


@compiles(db_received, "postgresql")
def _pg_received(element: db_received, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_received, "sqlite")
def _sqlite_received(element: db_received, compiler: Any, **kw: Any) -> str:
    # SQLite runs in this process and reads this host's clock: the time the
    # statement was sent is the time it was received.
    return str(compiler.process(sa.bindparam("b_sent", type_=sa.Double), **kw))


def _tables(prefix: str) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    metadata = sa.MetaData()
    claims = sa.Table(
        f"{prefix}claims",
        metadata,
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("last_tick", sa.Double, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("lease_until", sa.Double, nullable=True),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("finished_at", sa.Double, nullable=True),
        sa.Column("duration", sa.Double, nullable=True),
        sa.Column("outcome", sa.String(20), nullable=True),
        sa.Column("error", sa.Text, nullable=True),
    )
    instances = sa.Table(
        f"{prefix}instances",
        metadata,
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("seen_at", sa.Double, nullable=False),
    )
    return metadata, claims, instances


# A lease is what a killed holder costs its job; renewals keep long runs going,
# so a long lease buys nothing. Heartbeats faster than this only load the database.
_MAX_LEASE = 86400.0
_MIN_HEARTBEAT = 0.1


def _in_memory(url: sa.URL) -> bool:
    """An SQLite database that lives in one process's memory."""
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or url.query.get("mode") == "memory"
    )


_IN_MEMORY = (
    "is an in-memory SQLite database: each process would have its own, so every "
    "process would claim every tick. Use a file (sqlite+aiosqlite:///jobs.sqlite3) "
    "shared by the workers of one host, or PostgreSQL"
)


class SQLAlchemyStore:
    """Claims and run history in the app's own PostgreSQL or SQLite database.

    ``engine`` is an ``AsyncEngine``, a URL, or a callable that picks the
    engine out of the lifespan state (so claims share the app's pool)::

        store = SQLAlchemyStore(lambda state: state["db"])

    Each tick of each job then runs at most once across all instances that
    share the database, while leases are honoured: a run renews its lease
    every ``lease / 3`` and is cancelled if it cannot. The tables
    (``fastapi_jobs_claims``, ``fastapi_jobs_instances``) are created on first
    use unless ``create_tables=False``; :meth:`ddl` prints their DDL.

    Drivers: asyncpg or psycopg for PostgreSQL, aiosqlite for SQLite (3.35+:
    a file shared by the workers of one host).
    """

    def __init__(
        self,
        engine: EngineSource,
        *,
        lease: float | timedelta = 30,
        timeout: float | timedelta = 5,
        heartbeat: float | timedelta = 10,
        table_prefix: str = "fastapi_jobs_",
        create_tables: bool = True,
    ) -> None:
        if not (isinstance(engine, (AsyncEngine, str)) or callable(engine)):
            raise ConfigurationError(
                "SQLAlchemyStore takes an AsyncEngine, a database URL, or a callable "
                f"that returns the engine from the lifespan state; got {engine!r}"
            )
        if isinstance(engine, str):
            try:
                url = sa.make_url(engine)
            except sa.exc.ArgumentError:
                raise ConfigurationError(
                    "SQLAlchemyStore(...) got a string that is not a database URL, e.g. "
                    "postgresql+asyncpg://user:pass@host/app or sqlite+aiosqlite:///jobs.sqlite3"
                ) from None
            if _in_memory(url):
                raise ConfigurationError(f"SQLAlchemyStore({url!r}) {_IN_MEMORY}")
        said = "SQLAlchemyStore(): "
        self.lease = seconds("lease", lease, context=said, maximum=_MAX_LEASE)
        self.timeout = seconds("timeout", timeout, context=said)
        self.heartbeat = seconds(
            "heartbeat", heartbeat, context=said, minimum=_MIN_HEARTBEAT, allow_zero=True
        )
        if self.timeout >= self.lease / 3:
            raise ConfigurationError(
                f"SQLAlchemyStore: timeout ({self.timeout:g}s) must be shorter than a third "
                f"of the lease ({self.lease:g}s), so a renewal can fail and be retried in time"
            )
        self._source = engine
        self._create_tables = create_tables
        self.metadata, self.claims, self.instances = _tables(table_prefix)
        self._engine: AsyncEngine | None = None
        self._owned: AsyncEngine | None = None
        self._instance: Instance | None = None
        self._ready = False
        self._batches: dict[str, _Batch] = {}
        self._by_size: dict[tuple[str, int], tuple[str, tuple[str, ...] | None]] = {}
        self._insert: Any = None  # the dialect's insert(), with ON CONFLICT
        self._ensure_lock = asyncio.Lock()
        self._statements: dict[str, Any] = {}
        self._in_flight: set[asyncio.Task[Any]] = set()

    # -- life -------------------------------------------------------------

    async def open(self, state: Mapping[str, Any], instance: Instance) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise StoreError(
                "SQLAlchemyStore needs asyncio: SQLAlchemy's async engine does not run on trio"
            ) from None
        source = self._source
        if isinstance(source, str):
            engine = self._owned = create_async_engine(source)
        elif isinstance(source, AsyncEngine):
            engine = source
        else:
            engine = source(state)
            if not isinstance(engine, AsyncEngine):
                raise StoreError(f"the engine callable returned {engine!r}, not an AsyncEngine")
        dialect = engine.dialect.name
        if _in_memory(engine.url):
            raise StoreError(f"the store's engine ({engine.url}) {_IN_MEMORY}")
        if dialect not in ("postgresql", "sqlite"):
            raise StoreError(f"SQLAlchemyStore supports PostgreSQL and SQLite, not {dialect!r}")
        if dialect == "sqlite":
            # The same file through connections of the store's own, whose busy
            # timeout is the store's: a statement behind a lock then fails by
            # itself within `timeout`, before the operation's deadline could cut
            # it mid-statement. Cut there, aiosqlite's connections lingered, each
            # holding or waiting for the file's lock, and after a long outside
            # lock the workers of a host kept each other locked out (and the
            # app's pool, which the store borrowed, with them). SQLite has no
            # server connections to save by sharing the app's pool.
            if self._owned is not None:
                await self._owned.dispose()
            engine = self._owned = create_async_engine(
                engine.url, connect_args={"timeout": self.timeout}
            )
        # Each store statement stands alone: no BEGIN/COMMIT round trips, and
        # (on PostgreSQL) the pool is the app's own.
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._instance = instance
        self._ready = False
        self._by_size = {}
        self._statements = self._build(dialect)
        self._ensure_lock = asyncio.Lock()  # bound to this loop
        if self._create_tables:
            # Start on the tables now, so that the first tick does not wait for DDL;
            # a database that is down only delays it to the first operation.
            self._spawn(self._ensure_ready())

    async def close(self) -> None:
        try:
            while self._in_flight:
                # Operations whose callers gave up; each ends by its own deadline.
                await asyncio.wait(set(self._in_flight))
            if self._engine is not None and self._instance is not None and self._ready:
                instance = self.instances.c.id == self._instance.id
                await self._run(
                    lambda conn: conn.execute(sa.delete(self.instances).where(instance))
                )
        except Exception as exc:  # noqa: BLE001 - peers see the row go stale instead
            logger.warning("could not remove this instance's row: %r", exc)
        finally:
            if self._owned is not None:
                await self._owned.dispose()
                self._owned = None

    # -- claims -----------------------------------------------------------

    async def claim(self, job: str, tick: float) -> int | None:
        sent = self._join("claim", job, tick)
        try:
            fences: dict[str, int | Exception] = await asyncio.shield(sent)
        except BaseException:
            # The caller gave up (its deadline, shutdown). Should the claim be made
            # all the same, nobody runs it: free it, or the job waits out a lease.
            sent.add_done_callback(partial(self._abandoned, job))
            raise
        return _own(fences, job)

    def _abandoned(self, job: str, sent: asyncio.Task[dict[str, int | Exception]]) -> None:
        if sent.cancelled() or sent.exception() is not None:
            return
        fence = sent.result().get(job)
        if isinstance(fence, int):
            error = "StoreError: the claim came back after its deadline; the tick did not run"
            self._spawn(self.release(job, fence, "cancelled", error, 0.0))

    async def renew(self, job: str, fence: int) -> bool:
        params = {"b_job": job, "b_fence": fence, "b_lease": self.lease}
        result = await self._run(lambda conn: conn.execute(self._statements["renew"], params))
        return result.rowcount == 1

    async def release(
        self, job: str, fence: int, outcome: Outcome, error: str | None, duration: float
    ) -> None:
        sent = self._join("release", job, (fence, outcome, error, duration))
        _own(await asyncio.shield(sent), job)

    # -- batches ------------------------------------------------------------

    def _join(self, kind: str, job: str, row: Any) -> asyncio.Task[Any]:
        """Add ``row`` to the batch of ``kind`` being gathered; its sending task.

        Jobs on one grid come due at one instant, and trivial ones end at one
        instant: their claims, and their releases, share one multi-row statement.
        The first row starts the batch, which waits a couple of milliseconds for
        the others to join, then sends them all.
        """
        batch = self._batches.get(kind)
        if batch is None:
            batch = self._batches[kind] = _Batch()
            batch.sent = self._spawn(self._send(kind, batch))
        batch.rows.append((job, row))
        assert batch.sent is not None
        return batch.sent

    async def _send(self, kind: str, batch: _Batch) -> Any:
        try:
            await asyncio.sleep(_GATHER)  # the others due now join the batch
        finally:
            if self._batches.get(kind) is batch:
                del self._batches[kind]
        # Rows in one order for every instance: two batches never wait on
        # each other's row locks in opposite orders (no deadlock).
        rows = sorted(batch.rows, key=lambda row: row[0])
        chunks = [rows[start : start + _MAX_ROWS] for start in range(0, len(rows), _MAX_ROWS)]
        if kind == "claim":
            return await self._in_connection(partial(self._claim_all, chunks))
        return await self._in_connection(partial(self._release_all, chunks))

    async def _claim_all(
        self, chunks: list[list[tuple[str, Any]]], conn: AsyncConnection
    ) -> dict[str, int | Exception]:
        fences: dict[str, int | Exception] = {}

        async def claim_rows(rows: list[tuple[str, Any]]) -> None:
            params: dict[str, object] = {
                "b_owner": self._owner,
                "b_lease": self.lease,
                "b_timeout": self.timeout,
                "b_early": _FUTURE_MARGIN,
                "b_sent": time.time(),
            }
            for k, (job, tick) in enumerate(rows):
                params[f"b_job{k}"] = job
                params[f"b_tick{k}"] = tick
            result = await self._execute_sized(conn, "claim", len(rows), params)
            returned = cast("list[tuple[str, int]]", result.all())  # RETURNING job, fence
            fences.update((job, int(fence)) for job, fence in returned)

        for chunk in chunks:
            await _each_row_alone_on_error(claim_rows, chunk, fences)
        return fences

    async def _release_all(
        self, chunks: list[list[tuple[str, Any]]], conn: AsyncConnection
    ) -> dict[str, int | Exception]:
        failed: dict[str, int | Exception] = {}

        async def release_rows(rows: list[tuple[str, Any]]) -> None:
            params: dict[str, object] = {}
            for k, (job, (fence, outcome, error, duration)) in enumerate(rows):
                params[f"b_job{k}"] = job
                params[f"b_fence{k}"] = fence
                params[f"b_outcome{k}"] = outcome
                params[f"b_error{k}"] = error
                params[f"b_duration{k}"] = duration
            await self._execute_sized(conn, "release", len(rows), params)

        for chunk in chunks:
            await _each_row_alone_on_error(release_rows, chunk, failed)
        return failed

    async def last_tick(self, job: str) -> float | None:
        query = sa.select(self.claims.c.last_tick).where(self.claims.c.job == job)
        tick = await self._run(lambda conn: conn.scalar(query))
        return None if tick is None else float(tick)

    # -- instances and status -----------------------------------------------

    async def beat(self) -> float:
        assert self._instance is not None
        params = {
            "b_id": self._instance.id,
            "b_hostname": self._instance.hostname,
            "b_pid": self._instance.pid,
        }
        seen = await self._run(lambda conn: conn.scalar(self._statements["beat"], params))
        return float(seen)

    async def read(self) -> ClusterView:
        c, i = self.claims, self.instances

        async def query(conn: AsyncConnection) -> tuple[Any, Any, Any]:
            now = (await conn.execute(sa.select(db_now()))).scalar_one()
            rows = (await conn.execute(sa.select(c))).mappings().all()
            # Instances count as live for three missed heartbeats.
            live = await conn.execute(
                sa.select(i).where(i.c.seen_at > now - 3 * self.heartbeat).order_by(i.c.started_at)
            )
            return now, rows, live.mappings().all()

        now, rows, live = await self._run(query)
        return ClusterView(
            jobs={
                row["job"]: ClusterJobStatus(
                    last_tick=utc(row["last_tick"]),
                    fence=row["fence"],
                    last_started_at=utc(row["started_at"]),
                    last_finished_at=utc(row["finished_at"]),
                    last_duration_s=row["duration"],
                    last_outcome=row["outcome"],
                    last_error=row["error"],
                    last_instance=row["owner"],
                    running_on=row["owner"]
                    if row["lease_until"] is not None and row["lease_until"] > now
                    else None,
                )
                for row in rows
            },
            instances=[
                InstanceStatus(
                    id=row["id"],
                    hostname=row["hostname"],
                    pid=row["pid"],
                    started_at=datetime.fromtimestamp(row["started_at"], UTC),
                    seen_at=datetime.fromtimestamp(row["seen_at"], UTC),
                )
                for row in live
            ],
        )

    # -- fencing, for the jobs' own writes ---------------------------------

    def fenced(self, ctx: JobContext) -> sa.ColumnElement[bool]:
        """A condition that holds while ``ctx``'s claim is the job's latest.

        Add it to the WHERE clause of a job's own write, so that a run that
        lost its lease (paused, partitioned) cannot write after a newer run
        has claimed the job::

            await conn.execute(
                update(ledger).where(ledger.c.id == 1, store.fenced(ctx)).values(...)
            )
        """
        if ctx.fence is None:
            raise LeaseLostError(
                f"job {ctx.name!r} has no fence: it runs without a claim (no store, "
                "every_instance=True, or run_now)"
            )
        c = self.claims
        return sa.exists().where(c.c.job == ctx.name, c.c.fence == ctx.fence)

    @classmethod
    def ddl(cls, dialect: str = "postgresql", table_prefix: str = "fastapi_jobs_") -> str:
        """The CREATE TABLE statements, for migrations or ``create_tables=False``."""
        dialects: dict[str, sa.Dialect] = {
            "postgresql": PGDialect(),  # type: ignore[no-untyped-call]
            "sqlite": SQLiteDialect(),
        }
        if dialect not in dialects:
            raise ConfigurationError(f"ddl(): dialect is 'postgresql' or 'sqlite', not {dialect!r}")
        metadata, _, _ = _tables(table_prefix)
        return "\n".join(
            f"{str(CreateTable(table).compile(dialect=dialects[dialect])).strip()};\n"
            for table in metadata.sorted_tables
        )

    # -- internals --------------------------------------------------------

    @property
    def _owner(self) -> str:
        assert self._instance is not None
        return self._instance.id

    async def _run(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run ``op`` on a connection, in a task of its own; wait for its result.

        A caller that stops waiting (its deadline, shutdown) does not cancel the
        statement. Cancelled mid-statement, SQLAlchemy throws the connection away,
        and under anyio's cancellation, which strikes again at every await, the
        aiosqlite shim's close is cut in the middle and leaves a task that never
        ends: the event loop then cannot shut down. So the operation ends by its
        own deadline, which cancels it once (``asyncio.timeout``): a connection
        given up on is then closed whole, and otherwise goes back to the pool.
        """
        return await asyncio.shield(self._spawn(self._in_connection(op)))

    def _spawn(self, operation: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        if self._engine is None:
            operation.close()
            raise StoreError("the store is not open: it opens when the scheduler starts")
        task = asyncio.get_running_loop().create_task(operation)
        self._in_flight.add(task)
        task.add_done_callback(self._settled)
        return task

    def _settled(self, task: asyncio.Task[Any]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # seen by the callers still waiting; the others gave up

    async def _in_connection(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        assert self._engine is not None
        if not self._ready:
            await self._ensure_ready()
        try:
            # Callers wait `timeout`; the operation itself gets twice that, so that
            # a statement made just in time still reports back (a late claim is then
            # freed) and one stuck for good still ends.
            async with asyncio.timeout(2 * self.timeout), self._engine.connect() as conn:
                return await op(conn)
        except sa.exc.DBAPIError:
            # Never cache "the tables exist": someone may have dropped them. The
            # next operation checks again (two catalog reads, after errors only).
            self._ready = False
            raise

    async def _ensure_ready(self) -> None:
        """Check (and create) the tables once, under a deadline of their own: the
        first claim's short deadline is no measure of how long DDL may take."""
        assert self._engine is not None
        async with self._ensure_lock:
            if self._ready:
                return
            async with (
                asyncio.timeout(max(_DDL_TIMEOUT, 2 * self.timeout)),
                self._engine.connect() as conn,
            ):
                await self._ensure_tables(conn)
            self._ready = True

    async def _ensure_tables(self, conn: AsyncConnection) -> None:
        names = [self.claims.name, self.instances.name]

        def check(sync_conn: sa.Connection) -> list[str]:
            inspector = sa.inspect(sync_conn)
            return [n for n in names if not inspector.has_table(n)]

        missing = await conn.run_sync(check)
        if not missing:
            return
        if not self._create_tables:
            raise StoreError(
                f"table(s) {', '.join(missing)} do not exist: create them with the DDL "
                "from SQLAlchemyStore.ddl(), or pass create_tables=True"
            )
        for attempt in range(1, 6):
            try:
                await conn.run_sync(self.metadata.create_all, checkfirst=True)
                break
            except sa.exc.DatabaseError:
                # Other instances were creating them at the same moment
                # ("already exists", or a duplicate in PostgreSQL's catalog).
                if not await conn.run_sync(check):
                    break
                if attempt == 5:
                    raise
                await asyncio.sleep(random.uniform(0.02, 0.1) * attempt)
        logger.info("created table(s) %s", ", ".join(missing))

    def _build(self, dialect: str) -> dict[str, Any]:
        c, i = self.claims, self.instances
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        now = db_now()
        lease = sa.bindparam("b_lease", type_=sa.Double)

        ours = sa.and_(c.c.job == sa.bindparam("b_job"), c.c.fence == sa.bindparam("b_fence"))
        # A released claim stays released: a late renewal must not re-take it.
        renew = (
            sa.update(c).where(ours, c.c.lease_until.is_not(None)).values(lease_until=now + lease)
        )
        seen = insert(i).values(
            id=sa.bindparam("b_id"),
            hostname=sa.bindparam("b_hostname"),
            pid=sa.bindparam("b_pid"),
            started_at=now,
            seen_at=now,
        )
        beat = seen.on_conflict_do_update(
            index_elements=[i.c.id], set_={"seen_at": seen.excluded.seen_at}
        ).returning(i.c.seen_at)
        self._insert = insert
        return {"renew": renew, "beat": beat}

    async def _execute_sized(
        self, conn: AsyncConnection, kind: str, rows: int, params: dict[str, object]
    ) -> CursorResult[Any]:
        """Execute the ``rows``-row statement of ``kind``, compiled once per size.

        SQLAlchemy cannot cache a multi-row VALUES (it has no cache key): run as
        a construct, such a statement was compiled anew each time, ~80 ms of CPU
        for 300 rows. Compiled once here, it runs as the driver's own SQL.
        """
        key = (kind, rows)
        compiled = self._by_size.pop(key) if key in self._by_size else None
        sql, names = compiled or self._compile(kind, rows, conn.dialect)
        self._by_size[key] = sql, names  # the most recently used last
        if len(self._by_size) > _SIZES_KEPT:
            del self._by_size[next(iter(self._by_size))]
        args = params if names is None else tuple(params[name] for name in names)
        return await conn.exec_driver_sql(sql, args)

    def _compile(
        self, kind: str, rows: int, dialect: sa.Dialect
    ) -> tuple[str, tuple[str, ...] | None]:
        statement = (
            self._claim_statement(rows) if kind == "claim" else self._release_statement(rows)
        )
        compiled = statement.compile(dialect=dialect)
        # Run as driver SQL, a statement gets only the parameters we pass.
        assert all(name.startswith("b_") for name in compiled.binds), compiled.binds
        names = compiled.positiontup
        return compiled.string, None if names is None else tuple(names)

    def _claim_statement(self, rows: int) -> Any:
        """The claim of ``rows`` jobs in one statement; every bind is a named one."""
        c, now = self.claims, db_now()
        lease = sa.bindparam("b_lease", type_=sa.Double)
        wanted = (
            sa.values(sa.column("job", sa.String), sa.column("tick", sa.Double), name="wanted")
            .data(
                [
                    (
                        sa.bindparam(f"b_job{k}", type_=sa.String),
                        sa.bindparam(f"b_tick{k}", type_=sa.Double),
                    )
                    for k in range(rows)
                ]
            )
            .cte("wanted")
        )
        # Rows that may be claimed at all: the tick is not in the future on the
        # database's clock (a host whose clock jumped ahead must not move
        # `last_tick` past the ticks the others are about to claim), and the
        # statement did not wait past the timeout (its caller gave up).
        due = sa.select(
            wanted.c.job,
            wanted.c.tick,
            sa.literal_column("1", sa.BigInteger),
            sa.bindparam("b_owner", type_=sa.String),
            now + lease,
            now,
        ).where(
            wanted.c.tick <= now + sa.bindparam("b_early", type_=sa.Double),
            now < db_received() + sa.bindparam("b_timeout", type_=sa.Double),
        )
        new = self._insert(c).from_select(
            ["job", "last_tick", "fence", "owner", "lease_until", "started_at"], due
        )
        # A tick must be newer than the last one claimed (so a tick never runs
        # twice), and the previous lease must be free (so runs never overlap
        # across instances). Rows that fail return nothing. (A job's very first
        # claim inserts its row.)
        statement = new.on_conflict_do_update(
            index_elements=[c.c.job],
            set_={
                "last_tick": new.excluded.last_tick,
                "fence": c.c.fence + sa.literal_column("1", sa.BigInteger),
                "owner": new.excluded.owner,
                "lease_until": new.excluded.lease_until,
                "started_at": new.excluded.started_at,
                "finished_at": sa.null(),
                "duration": sa.null(),
                "outcome": sa.null(),
                "error": sa.null(),
            },
            where=sa.and_(
                c.c.last_tick < new.excluded.last_tick,
                sa.or_(c.c.lease_until.is_(None), c.c.lease_until < now),
            ),
        ).returning(c.c.job, c.c.fence)
        return statement

    def _release_statement(self, rows: int) -> Any:
        """The release of ``rows`` claims in one statement; every bind is a named one."""
        c = self.claims
        columns = {
            "job": sa.String,
            "fence": sa.BigInteger,
            "outcome": sa.String,
            "error": sa.Text,
            "duration": sa.Double,
        }
        ended = sa.values(*(sa.column(n, t) for n, t in columns.items()), name="ended")
        ended = ended.data(
            [
                tuple(sa.bindparam(f"b_{n}{k}", type_=t) for n, t in columns.items())
                for k in range(rows)
            ]
        )
        v = ended.cte("ended")
        # Only the claim `fence` is released: a newer claim of the job is not.
        statement = (
            sa.update(c)
            .where(c.c.job == v.c.job, c.c.fence == v.c.fence)
            .values(
                lease_until=sa.null(),
                finished_at=db_now(),
                outcome=v.c.outcome,
                error=v.c.error,
                duration=v.c.duration,
            )
        )
        return statement


# Parameters per row: 2 (claims) or 5 (releases); PostgreSQL and SQLite allow
# 32,766 per statement.
_MAX_ROWS = 1000
# Compiled statements kept, by kind and number of rows (the least recently used
# goes): an app's batches come in a few sizes, which repeat every tick.
_SIZES_KEPT = 32
# Loops due at one instant wake a few microseconds apart (each computed its
# own delay): the first row of a batch waits this long for the others to join.
_GATHER = 0.002


# How far ahead of the database's clock a tick may be claimed. Healthy hosts
# claim at or after the tick (their clock follows the database's); this only
# absorbs timers that fire a hair early and the error of the offset's estimate.
_FUTURE_MARGIN = 1.0
# Creating the tables may wait for other workers doing the same at startup.
_DDL_TIMEOUT = 30.0


def _own(results: dict[str, int | Exception], job: str) -> int | None:
    """``job``'s result in a batch: its fence, None, or its own error raised."""
    result = results.get(job)
    if isinstance(result, Exception):
        raise result
    return result


async def _each_row_alone_on_error(
    send: Callable[[list[tuple[str, Any]]], Awaitable[None]],
    rows: list[tuple[str, Any]],
    errors: dict[str, int | Exception],
) -> None:
    """``send(rows)``; if that fails for a reason one row may carry (a value the
    column refuses, say), send each row alone, so that only the rows at fault
    fail (their errors go into ``errors``, by job) and the others go through."""
    try:
        await send(rows)
        return
    except (sa.exc.OperationalError, sa.exc.InterfaceError):
        raise  # the database or the connection: every row would fail alike
    except sa.exc.StatementError as exc:
        if len(rows) == 1 or getattr(exc, "connection_invalidated", False):
            raise
        logger.warning("a batch of %d rows failed (%r); sending each row alone", len(rows), exc)
    for row in rows:
        try:
            await send([row])
        except (sa.exc.OperationalError, sa.exc.InterfaceError):
            raise
        except sa.exc.StatementError as exc:
            errors[row[0]] = exc


class _Batch:
    """Rows of one kind (claims, releases) due at one instant, sent together."""

    __slots__ = ("rows", "sent")

    def __init__(self) -> None:
        self.rows: list[tuple[str, Any]] = []
        self.sent: asyncio.Task[Any] | None = None
