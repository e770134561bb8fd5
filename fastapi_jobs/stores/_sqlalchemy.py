"""Claims in PostgreSQL or SQLite through SQLAlchemy's async engine.

Two tables, nothing else is touched:

- ``<prefix>claims``: one row per job. ``last_tick`` only moves forward;
  ``fence`` grows by one per claim; ``lease_until`` is NULL once released.
- ``<prefix>instances``: one row per live app process, for the status page.

Every time comparison uses the database's clock (``db_now()``); the app's clock
only computes ticks, which are the same in every process. Times are stored as
POSIX seconds (double precision) so that both databases compare them alike.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.expression import FunctionElement

from .._context import JobContext
from .._errors import ConfigurationError, LeaseLostError, StoreError
from .._status import ClusterJobStatus, ClusterView, InstanceStatus, Outcome
from .._store import Instance

__all__ = ["SQLAlchemyStore"]

logger = logging.getLogger("fastapi_jobs.stores")

EngineSource = AsyncEngine | str | Callable[[Mapping[str, Any]], AsyncEngine]


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


def _seconds(option: str, value: float | timedelta) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0:
        raise ConfigurationError(f"SQLAlchemyStore({option}={value!r}): must be > 0 seconds")
    return seconds


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
        self.lease = _seconds("lease", lease)
        self.timeout = _seconds("timeout", timeout)
        self.heartbeat = _seconds("heartbeat", heartbeat)
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
        self._batch: _Batch | None = None
        self._claims_by_size: dict[int, Any] = {}
        self._insert: Any = None  # the dialect's insert(), with ON CONFLICT
        self._ensure_lock = anyio.Lock()
        self._statements: dict[str, Any] = {}

    # -- life -------------------------------------------------------------

    async def open(self, state: Mapping[str, Any], instance: Instance) -> None:
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
        if dialect not in ("postgresql", "sqlite"):
            raise StoreError(f"SQLAlchemyStore supports PostgreSQL and SQLite, not {dialect!r}")
        # Each store statement stands alone: no BEGIN/COMMIT round trips, and
        # the pool is still the app's own.
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._instance = instance
        self._ready = False
        self._claims_by_size = {}
        self._statements = self._build(dialect)

    async def close(self) -> None:
        try:
            if self._engine is not None and self._instance is not None and self._ready:
                async with self._engine.connect() as conn:
                    await conn.execute(
                        sa.delete(self.instances).where(self.instances.c.id == self._instance.id)
                    )
        except Exception as exc:  # noqa: BLE001 - peers see the row go stale instead
            logger.warning("could not remove this instance's row: %r", exc)
        finally:
            if self._owned is not None:
                await self._owned.dispose()
                self._owned = None

    # -- claims -----------------------------------------------------------

    async def claim(self, job: str, tick: float) -> int | None:
        # Jobs on one grid come due at the same instant: their claims share one
        # multi-row statement. The first claim leads: it lets the others join
        # for a couple of milliseconds, then sends them all.
        batch = self._batch
        if batch is not None:
            batch.rows[job] = tick
            await batch.done.wait()
            if batch.error is not None:
                raise StoreError(f"the claim could not be made: {batch.error!r}")
            return batch.fences.get(job)
        batch = self._batch = _Batch()
        batch.rows[job] = tick
        try:
            await anyio.sleep(_GATHER)  # the others due now join the batch
            self._batch = None
            await self._claim_all(batch)
        except BaseException as exc:
            batch.error = exc
            raise
        finally:
            if self._batch is batch:
                self._batch = None
            batch.done.set()
        return batch.fences.get(job)

    async def _claim_all(self, batch: _Batch) -> None:
        # Rows in one order for every instance: two batches never wait on
        # each other's row locks in opposite orders (no deadlock).
        rows = sorted(batch.rows.items())
        async with self._connect() as conn:
            for start in range(0, len(rows), _MAX_ROWS):
                chunk = rows[start : start + _MAX_ROWS]
                params: dict[str, object] = {"b_owner": self._owner, "b_lease": self.lease}
                for k, (job, tick) in enumerate(chunk):
                    params[f"b_job{k}"] = job
                    params[f"b_tick{k}"] = tick
                result = await conn.execute(self._claim_statement(len(chunk)), params)
                for job, fence in result:
                    batch.fences[job] = int(fence)

    async def renew(self, job: str, fence: int) -> bool:
        async with self._connect() as conn:
            result = await conn.execute(
                self._statements["renew"], {"b_job": job, "b_fence": fence, "b_lease": self.lease}
            )
        return result.rowcount == 1

    async def release(
        self, job: str, fence: int, outcome: Outcome, error: str | None, duration: float
    ) -> None:
        async with self._connect() as conn:
            await conn.execute(
                self._statements["release"],
                {
                    "b_job": job,
                    "b_fence": fence,
                    "b_outcome": outcome,
                    "b_error": error,
                    "b_duration": duration,
                },
            )

    async def last_tick(self, job: str) -> float | None:
        async with self._connect() as conn:
            tick = (
                await conn.execute(
                    sa.select(self.claims.c.last_tick).where(self.claims.c.job == job)
                )
            ).scalar()
        return None if tick is None else float(tick)

    # -- instances and status -----------------------------------------------

    async def beat(self) -> float:
        assert self._instance is not None
        async with self._connect() as conn:
            seen = await conn.scalar(
                self._statements["beat"],
                {
                    "b_id": self._instance.id,
                    "b_hostname": self._instance.hostname,
                    "b_pid": self._instance.pid,
                },
            )
        return float(seen)

    async def read(self) -> ClusterView:
        c, i = self.claims, self.instances
        async with self._connect() as conn:
            now = (await conn.execute(sa.select(db_now()))).scalar_one()
            rows = (await conn.execute(sa.select(c))).mappings().all()
            # Instances count as live for three missed heartbeats.
            live = (
                (
                    await conn.execute(
                        sa.select(i)
                        .where(i.c.seen_at > now - 3 * self.heartbeat)
                        .order_by(i.c.started_at)
                    )
                )
                .mappings()
                .all()
            )
        return ClusterView(
            jobs={
                row["job"]: ClusterJobStatus(
                    last_tick=_utc(row["last_tick"]),
                    fence=row["fence"],
                    last_started_at=_utc(row["started_at"]),
                    last_finished_at=_utc(row["finished_at"]),
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

    def _connect(self) -> _Connection:
        if self._engine is None:
            raise StoreError("the store is not open: it opens when the scheduler starts")
        return _Connection(self)

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
                await anyio.sleep(random.uniform(0.02, 0.1) * attempt)
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
        release = (
            sa.update(c)
            .where(ours)
            .values(
                lease_until=None,
                finished_at=now,
                outcome=sa.bindparam("b_outcome"),
                error=sa.bindparam("b_error"),
                duration=sa.bindparam("b_duration", type_=sa.Double),
            )
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
        return {"renew": renew, "release": release, "beat": beat}

    def _claim_statement(self, rows: int) -> Any:
        """The claim of ``rows`` jobs in one statement (cached per size)."""
        statement = self._claims_by_size.get(rows)
        if statement is not None:
            return statement
        c, now = self.claims, db_now()
        lease = sa.bindparam("b_lease", type_=sa.Double)
        owner: sa.BindParameter[str] = sa.bindparam("b_owner")
        new = self._insert(c).values(
            [
                {
                    "job": sa.bindparam(f"b_job{k}"),
                    "last_tick": sa.bindparam(f"b_tick{k}", type_=sa.Double),
                    "fence": 1,
                    "owner": owner,
                    "lease_until": now + lease,
                    "started_at": now,
                }
                for k in range(rows)
            ]
        )
        # One statement claims: a tick must be newer than the last one claimed
        # (so a tick never runs twice) and the previous lease must be free (so
        # runs never overlap across instances). Rows that fail return nothing.
        statement = new.on_conflict_do_update(
            index_elements=[c.c.job],
            set_={
                "last_tick": new.excluded.last_tick,
                "fence": c.c.fence + 1,
                "owner": new.excluded.owner,
                "lease_until": new.excluded.lease_until,
                "started_at": new.excluded.started_at,
                "finished_at": None,
                "duration": None,
                "outcome": None,
                "error": None,
            },
            where=sa.and_(
                c.c.last_tick < new.excluded.last_tick,
                sa.or_(c.c.lease_until.is_(None), c.c.lease_until < now),
            ),
        ).returning(c.c.job, c.c.fence)
        self._claims_by_size[rows] = statement
        return statement


# Parameters per row: 2; PostgreSQL and SQLite allow 32,766 per statement.
_MAX_ROWS = 1000
# Loops due at one instant wake a few microseconds apart (each computed its
# own delay): the first claim waits this long for the others to join it.
_GATHER = 0.002


class _Batch:
    """The claims of one turn of the event loop, sent together."""

    __slots__ = ("done", "error", "fences", "rows")

    def __init__(self) -> None:
        self.rows: dict[str, float] = {}
        self.fences: dict[str, int] = {}
        self.error: BaseException | None = None
        self.done = anyio.Event()


class _Connection:
    """A store connection: makes sure the tables exist on first use."""

    def __init__(self, store: SQLAlchemyStore) -> None:
        self._store = store
        self._cm: Any = None

    async def __aenter__(self) -> AsyncConnection:
        store = self._store
        assert store._engine is not None
        self._cm = store._engine.connect()
        # Cancelled halfway, a checkout leaks its connection: let our own
        # deadline, not a caller's cancellation, end a slow connect.
        with anyio.CancelScope(shield=True), anyio.fail_after(store.timeout):
            conn: AsyncConnection = await self._cm.__aenter__()
        if not store._ready:
            try:
                async with store._ensure_lock:
                    if not store._ready:
                        await store._ensure_tables(conn)
                        store._ready = True
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
        return conn

    async def __aexit__(self, *exc: Any) -> None:
        # A timeout or shutdown may cancel us mid-statement; the connection must
        # still go back to the pool, or it leaks until garbage collection.
        with anyio.CancelScope(shield=True):
            await self._cm.__aexit__(*exc)


def _utc(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)
