"""``SQLAlchemyStore``: claims, pauses and run history in PostgreSQL or SQLite
through SQLAlchemy's async engine. This module holds the store's public
operations; the parts they are made of live beside it:

- ``_options``: the options, checked when the store is made;
- ``_engines``: which engine the store runs on (its source checked, SQLite's own);
- ``_poolers``: a connection pooler in between (no prepared statements kept);
- ``_operations``: each operation in an asyncio task of its own, with its deadline;
- ``_setup``: the tables made at startup (retried; the ALTER for old tables);
- ``_tables``: the tables, their names and DDL; ``_db_clock``: the database's time;
- ``_store_claims``: the claims' and releases' operations (a base class);
- ``_statements``: the writes' SQL; ``_batches``: many rows in one statement;
- ``_reads``: the reads; ``_models``: their rows as the API's models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._context import JobContext
from .._errors import ConfigurationError, LeaseLostError, StoreError
from .._status import ClusterView, RunRecord
from .._store import Instance
from . import _poolers, _reads, _tables
from ._backfills import StoreBackfills
from ._engines import EngineSource, check_source, choose
from ._operations import NOT_OPEN, Operations
from ._options import check_options
from ._outbox import StoreOutbox
from ._schedules import StoreSchedules
from ._setup import ensure_tables
from ._statements import Statements
from ._store_claims import StoreClaims

__all__ = ["SQLAlchemyStore"]

logger = logging.getLogger("fastapi_jobs.stores")


class SQLAlchemyStore(StoreClaims):
    """Claims and run history in the app's own PostgreSQL or SQLite database.

    ``engine`` is an ``AsyncEngine``, a URL, or a callable that picks the
    engine out of the lifespan state (so claims share the app's pool):

    ```python
    # fragment: with an app whose lifespan yields its engine as "db"
    store = SQLAlchemyStore(lambda state: state["db"])
    ```

    Each tick of each job then runs at most once across all instances that
    share the database, while leases are honoured: a run renews its lease
    every ``lease / 3`` and is cancelled if it cannot. The tables (`ddl` prints
    them) are created when the scheduler starts unless ``create_tables=False``:
    then the app's migrations make them (Alembic: `include_tables`).

    The run history keeps the last ``history`` runs of each job (0: none) for
    at most ``history_max_age``; it is written by the release's own round trip
    and pruned in the background, never per run.

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
        history: int = 100,
        history_max_age: float | timedelta = timedelta(days=30),
    ) -> None:
        check_source(engine)
        options = check_options(
            lease=lease,
            timeout=timeout,
            heartbeat=heartbeat,
            history=history,
            history_max_age=history_max_age,
            create_tables=create_tables,
            table_prefix=table_prefix,
        )
        self.lease, self.timeout, self.heartbeat = options.lease, options.timeout, options.heartbeat
        self.history, self.history_max_age = options.history, options.history_max_age
        self._source = engine
        self._create_tables = options.create_tables
        self.tables = _tables.tables(options.table_prefix)
        self._owned: AsyncEngine | None = None  # made by the store, disposed of at close
        self._pooled: bool | None = None  # behind a connection pooler (_poolers), once known
        self._instance: Instance | None = None
        self._sql: Statements | None = None  # built for the engine's dialect at open()
        self._operations = Operations(self.timeout, self._prepare)
        self.outbox = StoreOutbox(self._operations, self.tables, self.lease)  # queues.Outbox
        self.schedules = StoreSchedules(self._operations, self.tables)  # _stored.ScheduleTable
        self.backfills = StoreBackfills(self)  # claims of past ticks (Scheduler.backfill)

    # -- life -------------------------------------------------------------

    async def open(self, state: Mapping[str, Any], instance: Instance) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise StoreError(
                "SQLAlchemyStore needs asyncio: SQLAlchemy's async engine does not run on trio"
            ) from None
        engine, self._owned = choose(self._source, state, self.timeout)
        self._operations.open(engine)
        self._instance = instance
        self._sql = Statements(self.tables, engine.dialect.name, history=bool(self.history))
        self._pooled = None
        if self._owned is not None and engine.dialect.name == "postgresql":
            _poolers.cautious(self._owned)
        if self._create_tables or engine.dialect.name == "postgresql":
            # Start on the tables now, so that the first tick does not wait for DDL;
            # a database that is down only delays it to the first operation.
            ready = self._operations.spawn(self._operations.ensure_ready())
            if engine.dialect.name == "postgresql":
                # A pooler the store cannot run behind fails the start, naming the
                # fix; a database down or slow only delays that check as well.
                await asyncio.wait({ready}, timeout=self.timeout)
                done = ready.done() and not ready.cancelled()
                if done and isinstance(ready.exception(), ConfigurationError):
                    raise ready.exception()  # type: ignore[misc]

    async def _prepare(self, conn: AsyncConnection) -> None:
        if self._pooled is None and conn.dialect.name == "postgresql":
            self._pooled = await _poolers.check(conn, self._owned)
        absent = await ensure_tables(conn, self.tables, create=self._create_tables)
        present = self.schedules.present = self.tables.schedules.name not in absent
        self._statements.schedules = present
        instants = self._statements.instants = self.tables.instants.name not in absent
        if not instants:
            logger.info(
                "no table %s (create_tables=False): every instance claims every job's tick; "
                "make it with the app's migrations to have jobs due together claimed once",
                self.tables.instants.name,
            )
        self._statements.batches.prepare(conn.dialect, self._statements.hot)

    async def close(self) -> None:
        ops = self._operations
        try:
            await ops.settle()
            if ops.engine is not None and self._instance is not None and ops.ready:
                i = self.tables.instances
                removal = sa.delete(i).where(i.c.id == self._instance.id)
                task = ops.spawn(ops.in_connection(lambda conn: conn.execute(removal)))
                try:
                    await asyncio.wait_for(asyncio.shield(task), self.timeout)
                finally:
                    await ops.settle()
        except Exception as exc:  # noqa: BLE001 - peers see the row go stale instead
            logger.warning("could not remove this instance's row: %r", exc)
        finally:
            with contextlib.suppress(Exception):  # else closed with its pool, or by the GC
                await ops.let_go()
            if self._owned is not None:
                await self._owned.dispose()
                self._owned = None

    async def last_tick(self, job: str) -> float | None:
        return await self._operations.run(partial(_reads.last_tick, tables=self.tables, job=job))

    # -- instances and status -----------------------------------------------

    async def beat(self) -> float:
        if self._instance is None:
            raise StoreError(NOT_OPEN)
        params = {
            "b_id": self._instance.id,
            "b_hostname": self._instance.hostname,
            "b_pid": self._instance.pid,
        }
        beat = self._statements.beat
        seen = await self._operations.run(lambda conn: conn.scalar(beat, params))
        return float(seen)

    async def read(self) -> ClusterView:
        read = partial(
            _reads.cluster, tables=self.tables, heartbeat=self.heartbeat, history=self.history
        )
        return await self._operations.run(read)

    async def read_jobs(self, jobs: Collection[str], unwell: bool = False) -> ClusterView:
        """`read`, with the claims of ``jobs`` only (a page of a listing); with
        ``unwell``, also those whose last run failed or whose lease is live."""
        read = partial(
            _reads.cluster,
            tables=self.tables,
            heartbeat=self.heartbeat,
            history=self.history,
            jobs=jobs,
            unwell=unwell,
        )
        return await self._operations.run(read)

    # -- operators: pauses and history -------------------------------------

    async def pause(self, job: str, until: float | None) -> int:
        return await self._set_pause(job, paused=True, until=until)

    async def resume(self, job: str) -> int:
        return await self._set_pause(job, paused=False, until=None)

    async def _set_pause(self, job: str, *, paused: bool, until: float | None) -> int:
        """The change, made within ``timeout`` of this call or not at all, and
        answered within twice that: its version, or `StoreError` when it
        was not made, or another error when that cannot be told (the answer was
        lost after the statement went out)."""
        asked = asyncio.get_running_loop().time()
        change = {"b_job": job, "b_paused": paused, "b_until": until, "b_by": self._owner}
        statement = self._statements.pause

        async def send(conn: AsyncConnection, before: float) -> Any:
            return await conn.scalar(statement, {**change, "b_before": before})

        ops = self._operations
        version = await asyncio.shield(ops.spawn(ops.change(asked, send)))
        if version is None:
            raise StoreError(
                "it reached the database later than the store's timeout allows "
                f"({self.timeout:g}s; a lock on {self.tables.pauses.name}?)"
            )
        return int(version)

    async def pauses(self) -> dict[str, tuple[float, int]]:
        return await self._operations.run(partial(_reads.pauses, tables=self.tables))

    async def runs(self, job: str, limit: int) -> list[RunRecord]:
        return await self._operations.run(
            partial(_reads.runs, tables=self.tables, job=job, limit=limit)
        )

    async def recent_runs(self, jobs: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        return await self._operations.run(
            partial(_reads.recent_runs, tables=self.tables, jobs=jobs, limit=limit)
        )

    async def prune(self) -> None:
        sql, history, max_age = self._statements, self.history, self.history_max_age
        await self._operations.run(partial(sql.prune, history=history, max_age=max_age))

    # -- fencing, for the jobs' own writes ---------------------------------

    def fenced(self, ctx: JobContext) -> sa.ColumnElement[bool]:
        """A condition that holds while ``ctx``'s claim is the job's latest.

        Add it to the WHERE clause of a job's own write, so that a run that
        lost its lease (paused, partitioned) cannot write after a newer run
        has claimed the job:

        ```python
        # fragment: in a job, `ledger` a table of the app's
        await conn.execute(
            update(ledger).where(ledger.c.id == 1, store.fenced(ctx)).values(...)
        )
        ```
        """
        if ctx.fence is None:
            raise LeaseLostError(
                f"job {ctx.name!r} has no fence: it runs without a claim (no store, "
                "every_instance=True, or run_now)"
            )
        c = self.tables.claims
        return sa.exists().where(c.c.job == ctx.name, c.c.fence == ctx.fence)

    @classmethod
    def ddl(cls, dialect: str = "postgresql", table_prefix: str = "fastapi_jobs_") -> str:
        """The CREATE TABLE statements, for migrations or ``create_tables=False``."""
        return _tables.ddl(dialect, table_prefix)
