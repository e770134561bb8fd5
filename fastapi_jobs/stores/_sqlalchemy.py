"""Claims in PostgreSQL or SQLite through SQLAlchemy's async engine: the store's
operations. Its tables and SQL are in ``_schema``, its batching in ``_batches``.

Each operation runs in an asyncio task of its own with its own deadline, and
callers only wait for it: see ``_run`` for why a statement is never cancelled
by its caller. SQLAlchemy's async engine runs on asyncio only, so this module
uses asyncio directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateColumn

from .._checks import flag, seconds
from .._context import JobContext
from .._errors import ConfigurationError, LeaseLostError, StoreError
from .._status import ClusterJobStatus, ClusterView, ErrorInfo, InstanceStatus, RunRecord, utc
from .._store import Ended, Instance
from . import _schema
from ._batches import MAX_ROWS, Compiled, each_row_alone_on_error
from ._schema import db_now

__all__ = ["SQLAlchemyStore"]

logger = logging.getLogger("fastapi_jobs.stores")

EngineSource = AsyncEngine | str | Callable[[Mapping[str, Any]], AsyncEngine]
T = TypeVar("T")


# SQLite reads the OS's real-time clock itself ('now'), so the time a claim is
# sent is read there too: a wrapped or patched time.time() must not put the two
# clocks apart (its claims would all look late).
_sqlite_now: Callable[[], float] = time.time
if hasattr(time, "clock_gettime"):  # not on Windows
    _sqlite_now = partial(time.clock_gettime, time.CLOCK_REALTIME)
# How far ahead of the database's clock a tick may be claimed. Healthy hosts
# claim at or after the tick (their clock follows the database's); this only
# absorbs timers that fire a hair early and the error of the offset's estimate.
_FUTURE_MARGIN = 1.0
# The last successes of at most this many jobs are asked by name (see _last_successes).
_MAX_LISTED = 500
# A batch's rows go to the database as one JSON array (see _schema._rows).
_json = json.JSONEncoder(allow_nan=False).encode
_NOT_OPEN = "the store is not open: it opens when the scheduler starts"
# Runs kept per job in the history table, at most.
_MAX_HISTORY = 100_000
# Creating the tables may wait for other workers doing the same at startup.
_DDL_TIMEOUT = 30.0
# A lease is what a killed holder costs its job; renewals keep long runs going,
# so a long lease buys nothing. Heartbeats faster than this only load the database.
_MAX_LEASE = 86400.0
_MIN_HEARTBEAT = 0.1


def _chunks(rows: Sequence[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """``rows`` in statements of at most MAX_ROWS, sorted by job: rows in one order
    for every instance, so two batches never wait on each other's row locks in
    opposite orders (no deadlock)."""
    ordered = sorted(rows, key=lambda row: row[0])
    return [ordered[start : start + MAX_ROWS] for start in range(0, len(ordered), MAX_ROWS)]


@asynccontextmanager
async def _transaction(conn: AsyncConnection) -> AsyncIterator[None]:
    """A transaction on a connection of the store's AUTOCOMMIT engine (SQLite's
    syntax). IMMEDIATE takes the file's write lock at the start, within the busy
    timeout, so no statement inside fails halfway for a lock."""
    await conn.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        yield
        await conn.exec_driver_sql("COMMIT")
    except BaseException:
        if not conn.invalidated:  # else SQLAlchemy closes it, which rolls back
            try:
                await conn.exec_driver_sql("ROLLBACK")
            except Exception:  # noqa: BLE001 - its transaction must not go back to the pool
                await conn.invalidate()
        raise


def _paused_until(paused: bool, until: float | None) -> float:
    """A pauses row as ``Store.pauses`` gives it."""
    if not paused:
        return 0.0
    return math.inf if until is None else float(until)


def _run_record(row: sa.RowMapping) -> RunRecord:
    """A row of the runs table, as the API shows it."""
    return RunRecord(
        id=str(row["fence"]),
        job=row["job"],
        tick=utc(row["tick"]),
        manual=bool(row["manual"]),
        attempts=row["attempts"],
        started_at=utc(row["started_at"]),
        finished_at=utc(row["finished_at"]),
        duration_s=row["duration"],
        outcome=row["outcome"],
        error=ErrorInfo.parse(row["error"]),
        instance=row["instance"],
        fence=row["fence"],
    )


def _in_memory(url: sa.URL) -> bool:
    """An SQLite database that lives in one process's memory."""
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or url.query.get("mode") == "memory"
    )


_ASYNC_DRIVERS = {"postgresql": ("asyncpg", "psycopg", "psycopg_async"), "sqlite": ("aiosqlite",)}
"""The drivers the store runs on, by backend (SQLAlchemy's async ones)."""

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
    (``fastapi_jobs_claims``, ``_instances``, ``_pauses``, ``_runs``) are
    created on first use unless ``create_tables=False``; :meth:`ddl` prints
    their DDL.

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
            if url.get_driver_name() not in _ASYNC_DRIVERS.get(url.get_backend_name(), ()):
                # The URL as SQLAlchemy shows it: the password is masked.
                raise ConfigurationError(
                    f"SQLAlchemyStore({url!r}): use PostgreSQL or SQLite through an async "
                    "driver: postgresql+asyncpg://, postgresql+psycopg:// or sqlite+aiosqlite:///"
                )
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
        if (
            not isinstance(history, int)
            or isinstance(history, bool)
            or not (0 <= history <= _MAX_HISTORY)
        ):
            raise ConfigurationError(
                f"SQLAlchemyStore(): history={history!r}: the runs kept per job, a whole "
                f"number from 0 (no history) to {_MAX_HISTORY}"
            )
        self.history = history
        self.history_max_age = seconds("history_max_age", history_max_age, context=said)
        self._source = engine
        self._create_tables = flag("create_tables", create_tables, context=said)
        tables = _schema.tables(_schema.check_prefix(table_prefix, context=said))
        self.metadata, self.claims, self.instances = (
            tables.metadata,
            tables.claims,
            tables.instances,
        )
        self.pauses_table, self.runs_table = tables.pauses, tables.runs
        self._engine: AsyncEngine | None = None
        self._owned: AsyncEngine | None = None
        self._instance: Instance | None = None
        self._ready = False
        self._compiled = Compiled(self._batch_statement)
        self._insert: _schema.Insert = _schema.insert_for("postgresql")  # set at open()
        self._dialect = "postgresql"  # set at open()
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
            engine = self._owned = self._own_engine(sa.make_url(source))
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
        if dialect == "sqlite" and engine is not self._owned:
            engine = self._owned = self._own_engine(engine.url)
        # Each store statement stands alone: no BEGIN/COMMIT round trips, and
        # (on PostgreSQL) the pool is the app's own.
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._instance = instance
        self._ready = False
        self._insert = _schema.insert_for(dialect)
        self._dialect = dialect
        self._compiled = Compiled(self._batch_statement)
        self._statements = _schema.single_statements(self.claims, self.instances, self._insert)
        self._statements["pause"] = _schema.pause_statement(self.pauses_table, self._insert)
        self._ensure_lock = asyncio.Lock()  # bound to this loop
        if self._create_tables:
            # Start on the tables now, so that the first tick does not wait for DDL;
            # a database that is down only delays it to the first operation.
            self._spawn(self._ensure_ready())

    def _own_engine(self, url: sa.URL) -> AsyncEngine:
        """An engine of the store's own. On SQLite, even when the app gives its
        engine, the store opens the same file through connections whose busy
        timeout is the store's: a statement behind a lock then fails by itself
        within `timeout`, before the operation's deadline could cut it
        mid-statement. Cut there, aiosqlite's connections lingered, each holding
        or waiting for the file's lock, and after a long outside lock the workers
        of a host kept each other locked out (and the app's pool, which the store
        borrowed, with them). SQLite has no server connections to save by
        sharing the app's pool."""
        if url.get_backend_name() == "sqlite":
            return create_async_engine(url, connect_args={"timeout": self.timeout})
        return create_async_engine(url)

    async def close(self) -> None:
        try:
            await self._settle_in_flight()
            if self._engine is not None and self._instance is not None and self._ready:
                instance = self.instances.c.id == self._instance.id
                removal = self._spawn(
                    self._in_connection(
                        lambda conn: conn.execute(sa.delete(self.instances).where(instance))
                    )
                )
                try:
                    await asyncio.wait_for(asyncio.shield(removal), self.timeout)
                finally:
                    await self._settle_in_flight()
        except Exception as exc:  # noqa: BLE001 - peers see the row go stale instead
            logger.warning("could not remove this instance's row: %r", exc)
        finally:
            if self._owned is not None:
                await self._owned.dispose()
                self._owned = None

    async def _settle_in_flight(self) -> None:
        """Wait for the operations whose callers gave up, for at most ``timeout``
        (each would end by its own deadline, up to the DDL's 30 s behind a
        lock); then cancel what is left, once, and let it close its connection.
        A stop (the app's, the CLI's on SIGTERM) is bounded by the store's
        timeout, not by a lock someone else holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while self._in_flight and loop.time() < deadline:
            await asyncio.wait(set(self._in_flight), timeout=deadline - loop.time())
        left = set(self._in_flight)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=self.timeout)

    # -- claims -----------------------------------------------------------

    async def claim(
        self, wanted: Sequence[tuple[str, float]], *, manual: bool = False
    ) -> dict[str, int | Exception]:
        """Claim each ``(job, tick)`` in as few statements as can be (one per
        thousand rows); see :meth:`fastapi_jobs.Store.claim`."""
        if not wanted:
            return {}
        kind = "claim_manual" if manual else "claim"
        # Filled as the operation goes, so that a caller who gives up can tell the
        # claims made from those whose answer never came.
        fences: dict[str, int | Exception] = {}
        asked: dict[str, float] = {}  # sent, not yet answered
        sent = self._spawn(
            self._in_connection(partial(self._claim_all, kind, _chunks(wanted), fences, asked))
        )
        try:
            return await asyncio.shield(sent)
        except BaseException:
            # The caller gave up (its deadline, shutdown), or the operation failed
            # or hit its own deadline. Claims made all the same are run by nobody:
            # free them, or the jobs wait out a lease.
            sent.add_done_callback(lambda _: self._abandoned(fences, asked))
            raise

    def _abandoned(self, fences: dict[str, int | Exception], asked: dict[str, float]) -> None:
        """Free what an abandoned claim operation may have claimed: the claims it
        reported, and those whose statement went out but whose answer was lost
        (cut by the deadline after the database had made it: a stall of this
        process, a slow link)."""
        made = [(job, fence) for job, fence in fences.items() if isinstance(fence, int)]
        unanswered = {job: tick for job, tick in asked.items() if job not in fences}
        if made or unanswered:
            self._spawn(self._free_claims(made, unanswered))

    async def _free_claims(self, made: list[tuple[str, int]], unanswered: dict[str, float]) -> None:
        try:
            if unanswered:
                # Which of them were made: a claim of this tick by this instance
                # is one this instance gave up on (a tick is claimed once).
                c = self.claims
                query = sa.select(c.c.job, c.c.fence, c.c.last_tick).where(
                    c.c.owner == self._owner, c.c.lease_until.is_not(None)
                )
                rows = await self._run(lambda conn: conn.execute(query))
                made += [(job, fence) for job, fence, tick in rows if unanswered.get(job) == tick]
            # Never ran: freed, with no run recorded (the job's last run stays).
            await self.release([Ended(job, fence, None, None, 0.0, 0) for job, fence in made])
        except Exception as exc:  # noqa: BLE001 - the claims free when their leases end
            logger.debug("could not free the claims of an abandoned claim: %r", exc)

    async def _claim_all(
        self,
        kind: str,
        chunks: list[list[tuple[str, Any]]],
        fences: dict[str, int | Exception],
        asked: dict[str, float],
        conn: AsyncConnection,
    ) -> dict[str, int | Exception]:
        async def claim_rows(rows: list[tuple[str, Any]]) -> None:
            params: dict[str, object] = {
                "b_owner": self._owner,
                "b_lease": self.lease,
                "b_timeout": self.timeout,
                "b_early": _FUTURE_MARGIN,
                "b_sent": _sqlite_now(),
            }
            params["b_rows"] = _json(rows)
            asked.update(rows)
            try:
                result = await self._compiled.execute(conn, kind, params)
            except sa.exc.DBAPIError as exc:
                if not exc.connection_invalidated:
                    # The database answered with an error: the statement made no
                    # claim, so there is none to look up and free (it would find
                    # a claim of the same tick made since, and end it).
                    for job, _ in rows:
                        asked.pop(job, None)
                raise
            returned = cast("list[tuple[str, int]]", result.all())  # RETURNING job, fence
            fences.update((job, int(fence)) for job, fence in returned)
            for job, _ in rows:
                asked.pop(job, None)  # answered: claimed, or not (held, an older tick)

        for chunk in chunks:
            await each_row_alone_on_error(claim_rows, chunk, fences)
        return fences

    async def renew(self, job: str, fence: int) -> bool:
        params = {"b_job": job, "b_fence": fence, "b_lease": self.lease}
        result = await self._run(lambda conn: conn.execute(self._statements["renew"], params))
        return result.rowcount == 1

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        """Release these claims in as few statements as can be; see
        :meth:`fastapi_jobs.Store.release`."""
        if not ended:
            return {}
        rows = [
            (e.job, (e.fence, e.outcome, e.error, e.duration, e.attempts, int(e.manual)))
            for e in ended
        ]
        failed = await self._run(partial(self._release_all, _chunks(rows)))
        return {job: error for job, error in failed.items() if isinstance(error, Exception)}

    async def _release_all(
        self, chunks: list[list[tuple[str, Any]]], conn: AsyncConnection
    ) -> dict[str, int | Exception]:
        failed: dict[str, int | Exception] = {}

        async def release_rows(rows: list[tuple[str, Any]]) -> None:
            params: dict[str, object] = {"b_rows": _json([(job, *ended) for job, ended in rows])}
            if self.history and self._dialect == "sqlite":
                # Two statements, one transaction: a history row written by a
                # release whose update then failed would be written again when
                # the release is sent again.
                async with _transaction(conn):
                    await self._compiled.execute(conn, "released_runs", params)
                    await self._compiled.execute(conn, "release", params)
            else:
                await self._compiled.execute(conn, "release", params)

        for chunk in chunks:
            await each_row_alone_on_error(release_rows, chunk, failed)
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

        async def query(conn: AsyncConnection) -> tuple[Any, Any, Any, Any, Any]:
            now = (await conn.execute(sa.select(db_now()))).scalar_one()
            rows = (await conn.execute(sa.select(c))).mappings().all()
            # Instances count as live for three missed heartbeats.
            live = await conn.execute(
                sa.select(i).where(i.c.seen_at > now - 3 * self.heartbeat).order_by(i.c.started_at)
            )
            pauses = await self._read_pauses(conn)
            return now, rows, live.mappings().all(), pauses, await self._last_successes(conn, rows)

        now, rows, live, pauses, successes = await self._run(query)
        return ClusterView(
            pauses={job: until for job, (until, _) in pauses.items()},
            pause_versions={job: version for job, (_, version) in pauses.items()},
            read_at=float(now),
            jobs={
                row["job"]: ClusterJobStatus(
                    last_tick=utc(row["last_tick"]),
                    fence=row["fence"],
                    last_started_at=utc(row["started_at"]),
                    last_finished_at=utc(row["finished_at"]),
                    last_duration_s=row["duration"],
                    last_outcome=row["outcome"],
                    last_error=ErrorInfo.parse(row["error"]),
                    last_instance=row["owner"],
                    last_success_at=utc(
                        row["finished_at"] if row["outcome"] == "ok" else successes.get(row["job"])
                    ),
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

    async def _last_successes(
        self, conn: AsyncConnection, claims: Sequence[sa.RowMapping]
    ) -> dict[str, float]:
        """When the latest successful run of each job whose last run was not one
        ended: from the run history (the claims row keeps only the last run),
        for those jobs only (few, usually), through the (job, id) index."""
        jobs = [row["job"] for row in claims if row["outcome"] != "ok"]
        if not jobs or not self.history:
            return {}
        r = self.runs_table
        query = sa.select(r.c.job, sa.func.max(r.c.finished_at)).where(r.c.outcome == "ok")
        if len(jobs) <= _MAX_LISTED:  # else every job (a bound parameter per job has limits)
            query = query.where(r.c.job.in_(jobs))
        query = query.group_by(r.c.job)
        return {job: float(at) for job, at in (await conn.execute(query)).all()}

    # -- operators: pauses and history -------------------------------------

    async def pause(self, job: str, until: float | None) -> int:
        return await self._set_pause(job, paused=True, until=until)

    async def resume(self, job: str) -> int:
        return await self._set_pause(job, paused=False, until=None)

    async def _set_pause(self, job: str, *, paused: bool, until: float | None) -> int:
        """The change, made within ``timeout`` of this call or not at all, and
        answered within twice that: its version, or :class:`StoreError` when it
        was not made, or another error when that cannot be told (the answer was
        lost after the statement went out)."""
        asked = asyncio.get_running_loop().time()
        change = {"b_job": job, "b_paused": paused, "b_until": until, "b_by": self._owner}
        return await asyncio.shield(self._spawn(self._change_pause(change, asked)))

    async def _change_pause(self, change: dict[str, object], asked: float) -> int:
        assert self._engine is not None
        loop = asyncio.get_running_loop()
        made_by = asked + self.timeout
        sent = False
        try:
            async with asyncio.timeout_at(asked + 2 * self.timeout):
                if not self._ready:
                    # The tables' check keeps its own deadline: it goes on if the
                    # change cannot wait for it.
                    async with asyncio.timeout_at(made_by):
                        await asyncio.shield(self._spawn(self._ensure_ready()))
                async with self._engine.connect() as conn:
                    # `made_by` on the database's clock, from a statement that waits
                    # for no lock (read before now: the deadline comes out no
                    # later). Not statement_timestamp(): behind a table lock,
                    # asyncpg's statements are stamped when they get to run.
                    db_time = (await conn.execute(sa.select(db_now()))).scalar_one()
                    left = made_by - loop.time()
                    if left <= 0:
                        raise TimeoutError
                    sent = True
                    version = await conn.scalar(
                        self._statements["pause"], {**change, "b_before": db_time + left}
                    )
        except Exception as exc:
            answered = isinstance(exc, sa.exc.DBAPIError) and not exc.connection_invalidated
            if isinstance(exc, sa.exc.DBAPIError):
                self._ready = False  # never cache "the tables exist"
            if sent and not answered:
                raise  # made, unless it was not: nobody can tell
            if isinstance(exc, TimeoutError):
                raise StoreError(
                    f"the store could not reach the database within its timeout ({self.timeout:g}s)"
                ) from exc
            raise StoreError(f"the store could not make it ({ErrorInfo.of(exc)})") from exc
        if version is None:
            raise StoreError(
                "it reached the database later than the store's timeout allows "
                f"({self.timeout:g}s; a lock on {self.pauses_table.name}?)"
            )
        return int(version)

    async def pauses(self) -> dict[str, tuple[float, int]]:
        return await self._run(self._read_pauses)

    async def _read_pauses(self, conn: AsyncConnection) -> dict[str, tuple[float, int]]:
        p = self.pauses_table
        rows = await conn.execute(sa.select(p.c.job, p.c.paused, p.c.until, p.c.version))
        return {
            job: (_paused_until(paused, until), int(version))
            for job, paused, until, version in rows.all()
        }

    async def runs(self, job: str, limit: int) -> list[RunRecord]:
        r = self.runs_table
        query = sa.select(r).where(r.c.job == job).order_by(r.c.id.desc()).limit(limit)
        rows = await self._run(lambda conn: conn.execute(query))
        return [_run_record(row) for row in rows.mappings().all()]

    async def recent_runs(self, jobs: Sequence[str], limit: int) -> dict[str, list[RunRecord]]:
        r = self.runs_table
        ranked = sa.select(
            r, sa.func.row_number().over(partition_by=r.c.job, order_by=r.c.id.desc()).label("n")
        )
        if len(jobs) <= _MAX_LISTED:  # else every job (a bound parameter per job has limits)
            ranked = ranked.where(r.c.job.in_(jobs))
        newest = ranked.subquery("newest")
        query = (
            sa.select(newest).where(newest.c.n <= limit).order_by(newest.c.job, newest.c.id.desc())
        )
        rows = await self._run(lambda conn: conn.execute(query))
        found: dict[str, list[RunRecord]] = {job: [] for job in jobs}
        for row in rows.mappings().all():
            if row["job"] in found:
                found[row["job"]].append(_run_record(row))
        return found

    async def prune(self) -> None:
        if not self.history:
            return
        old, extra = _schema.prune_statements(self.runs_table)

        async def prune(conn: AsyncConnection) -> None:
            before = (await conn.execute(sa.select(db_now()))).scalar_one() - self.history_max_age
            await conn.execute(old, {"b_before": before})
            await conn.execute(extra, {"b_keep": self.history})

        await self._run(prune)

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
        return _schema.ddl(dialect, table_prefix)

    # -- internals --------------------------------------------------------

    @property
    def _owner(self) -> str:
        if self._instance is None:
            raise StoreError(_NOT_OPEN)
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
            raise StoreError(_NOT_OPEN)
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

    def _batch_statement(self, kind: str) -> Any:
        if kind in ("claim", "claim_manual"):
            manual = kind == "claim_manual"
            return _schema.claim_statement(
                self.claims, self.pauses_table, self._insert, self._dialect, manual=manual
            )
        runs = self.runs_table if self.history else None
        if kind == "released_runs":
            assert runs is not None
            return _schema.released_runs_statement(self.claims, runs, self._dialect)
        return _schema.release_statement(self.claims, runs, self._dialect)

    async def _ensure_tables(self, conn: AsyncConnection) -> None:
        names = [t.name for t in self.metadata.sorted_tables]

        def check(sync_conn: sa.Connection) -> list[str]:
            inspector = sa.inspect(sync_conn)
            return [n for n in names if not inspector.has_table(n)]

        missing = await conn.run_sync(check)
        if self.pauses_table.name not in missing:
            await self._ensure_pause_versions(conn)
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

    async def _ensure_pause_versions(self, conn: AsyncConnection) -> None:
        """A pauses table made by a release before versions gets the column (0 in
        the rows there: the next change of each goes above it)."""
        p = self.pauses_table

        def lacks_it(sync_conn: sa.Connection) -> bool:
            columns = sa.inspect(sync_conn).get_columns(p.name)
            return "version" not in {column["name"] for column in columns}

        if not await conn.run_sync(lacks_it):
            return
        table = conn.dialect.identifier_preparer.format_table(p)
        column = CreateColumn(p.c.version).compile(dialect=conn.dialect)
        alter = f"ALTER TABLE {table} ADD COLUMN {column}"
        if not self._create_tables:
            raise StoreError(
                f"table {p.name} has no column version (an earlier release made it): "
                f"add it with {alter}, or pass create_tables=True"
            )
        try:
            await conn.exec_driver_sql(alter)
        except sa.exc.DatabaseError:
            if await conn.run_sync(lacks_it):
                raise
            return  # another instance added it at the same moment
        logger.info("added the column version to table %s", p.name)
