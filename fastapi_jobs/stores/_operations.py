"""How the store's operations run: each in an asyncio task of its own, on a
connection of the store's AUTOCOMMIT engine, with its own deadline; callers
only wait for it. The tables are checked (and made) before the first
operation, and again after any database error (never cache "the tables exist").

Why a task of its own: a caller that stops waiting (its deadline, shutdown)
does not cancel the statement. Cancelled mid-statement, SQLAlchemy throws the
connection away, and under anyio's cancellation, which strikes again at every
await, the aiosqlite shim's close is cut in the middle and leaves a task that
never ends: the event loop then cannot shut down. So the operation ends by its
own deadline, which cancels it once (``asyncio.timeout``): a connection given
up on is then closed whole, and otherwise goes back to the pool.

The claims and releases, sent each second while jobs tick each second, keep
one connection between them (`run_kept`): a checkout from the pool and its
return cost the client more than the statement itself (~250 of ~550 µs on
asyncpg). It goes back to the pool after ``KEEP`` seconds unused, and is
dropped after any error.

SQLAlchemy's async engine runs on asyncio only, so this module uses asyncio
directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._errors import StoreError
from .._status import ErrorInfo
from ._db_clock import db_now
from ._poolers import Reconnect, refused_for_kept_statements, refused_for_statement_mode

__all__ = ["NOT_OPEN", "Operations", "transaction"]

T = TypeVar("T")

NOT_OPEN = "the store is not open: it opens when the scheduler starts"
# Creating the tables may wait for other workers doing the same at startup.
_DDL_TIMEOUT = 30.0
# The kept connection goes back to the pool once unused this long.
KEEP = 2.0
_ROOMY = 10  # connections a pool must have in all for one to be kept


class Operations:
    """The store's operations in flight, on its engine once it is open.

    Every operation gets twice ``timeout`` (its callers wait ``timeout``), and
    ``prepare`` (the tables' check) a deadline of its own, at least 30 s.
    """

    def __init__(
        self, timeout: float, prepare: Callable[[AsyncConnection], Awaitable[None]]
    ) -> None:
        self.timeout = timeout
        self.engine: AsyncEngine | None = None
        self.ready = False  # the tables were checked since the last database error
        self.in_flight: set[asyncio.Task[Any]] = set()
        self._prepare = prepare
        self._ready_lock = asyncio.Lock()
        self._kept: AsyncConnection | None = None  # see run_kept
        self._may_keep = False  # the pool has room for it
        self._kept_busy = False
        self._kept_until = 0.0  # the loop's time it goes back to the pool, unused
        self._kept_timer: asyncio.TimerHandle | None = None

    def open(self, engine: AsyncEngine) -> None:
        """Run from now on ``engine``, whose tables are yet to be checked."""
        # Each store statement stands alone: no BEGIN/COMMIT round trips, and
        # (on PostgreSQL) the pool is the app's own.
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.ready = False
        self._ready_lock = asyncio.Lock()  # bound to this loop
        self._kept, self._kept_busy, self._kept_timer = None, False, None
        self._may_keep = _roomy(engine.pool)

    async def run(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run ``op`` on a connection, in a task of its own; wait for its result."""
        return await asyncio.shield(self.spawn(self.in_connection(op)))

    async def run_kept(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """`run`, on the connection kept between calls (another one from the
        pool while it is in use)."""
        return await asyncio.shield(self.spawn(self.on_kept(op)))

    async def on_kept(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """`in_connection`, on the kept connection while no other operation uses it."""
        assert self.engine is not None
        if not self.ready:
            await self.ensure_ready()
        # Checked after the wait for the tables: another operation may have
        # taken the kept connection meanwhile (no await between this and taking it).
        if self._kept_busy or not self._may_keep:
            return await self.in_connection(op)
        self._kept_busy = True
        conn = self._kept
        try:
            async with asyncio.timeout(2 * self.timeout):
                if conn is not None and not await self._alive(conn):
                    self._kept = None
                    await _drop(conn)
                    conn = None
                if conn is None:
                    conn = self._kept = await self.engine.connect()
                return await op(conn)
        except BaseException as exc:
            # Whatever broke the operation may have left the connection in any
            # state (cut mid-statement, a transaction open): not kept.
            self._kept = None
            if conn is not None:
                await _drop(conn)
            if isinstance(exc, sa.exc.DBAPIError):
                self.ready = False  # never cache "the tables exist"
            raise
        finally:
            self._kept_busy = False
            if self._kept is not None and not _spare(self.engine.pool):
                self.spawn(self.let_go())  # the app needs its pool now
            else:
                self._keep_for(KEEP)

    async def _alive(self, conn: AsyncConnection) -> bool:
        """Whether the kept connection may be used again, checked as the pool
        checks its own at checkout: a connection its driver knows is closed
        (asyncpg sees a server's goodbye at once) is not; with
        ``pool_pre_ping=True``, one that does not answer a ping is not either
        (psycopg learns of a closed connection only by using it). Otherwise a
        database restart or a failover would cost a tick on every instance."""
        if _known_closed(conn):
            return False
        assert self.engine is not None
        if not getattr(self.engine.pool, "_pre_ping", False):
            return True
        try:
            await conn.run_sync(_ping)
        except Exception:  # noqa: BLE001 - any failure: a fresh connection instead
            return False
        return True

    def _keep_for(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._kept_until = loop.time() + seconds
        if self._kept_timer is None and self._kept is not None:
            self._kept_timer = loop.call_at(self._kept_until, self._unused)

    def _unused(self) -> None:
        self._kept_timer = None
        loop = asyncio.get_running_loop()
        if self._kept is None:
            return
        if self._kept_busy or loop.time() < self._kept_until:
            self._kept_timer = loop.call_at(self._kept_until, self._unused)
            return
        self.spawn(self.let_go())

    async def let_go(self) -> None:
        """Give the kept connection back to the pool (unless in use)."""
        conn = self._kept
        if conn is None or self._kept_busy:
            return
        self._kept = None
        if self._kept_timer is not None:
            self._kept_timer.cancel()
            self._kept_timer = None
        try:
            async with asyncio.timeout(self.timeout):
                await conn.close()
        except BaseException:
            await _drop(conn)
            raise

    def spawn(self, operation: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """``operation`` in a task of its own, kept until it ends."""
        if self.engine is None:
            operation.close()
            raise StoreError(NOT_OPEN)
        task = asyncio.get_running_loop().create_task(operation)
        self.in_flight.add(task)
        task.add_done_callback(self._settled)
        return task

    def _settled(self, task: asyncio.Task[Any]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # seen by the callers still waiting; the others gave up

    async def in_connection(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """``op`` on a connection, under the operation's deadline."""
        assert self.engine is not None
        if not self.ready:
            await self.ensure_ready()
        try:
            # Callers wait `timeout`; the operation itself gets twice that, so that
            # a statement made just in time still reports back (a late claim is then
            # freed) and one stuck for good still ends.
            async with asyncio.timeout(2 * self.timeout), self.engine.connect() as conn:
                return await op(conn)
        except sa.exc.DBAPIError:
            # Never cache "the tables exist": someone may have dropped them. The
            # next operation checks again (two catalog reads, after errors only).
            self.ready = False
            raise

    async def ensure_ready(self) -> None:
        """Check (and create) the tables once, under a deadline of their own: the
        first claim's short deadline is no measure of how long DDL may take."""
        assert self.engine is not None
        async with self._ready_lock:
            if self.ready:
                return
            async with asyncio.timeout(max(_DDL_TIMEOUT, 2 * self.timeout)):
                while True:
                    async with _connected(self.engine) as conn:
                        try:
                            await self._prepare(conn)
                            break
                        except Reconnect:
                            # Made before the engine was set for a pooler: not back to it.
                            await conn.invalidate()
            self.ready = True

    async def change(
        self, asked: float, send: Callable[[AsyncConnection, float], Awaitable[T]]
    ) -> T:
        """``send(conn, before)``: a change that the database makes only before
        ``before`` on its clock, made within ``timeout`` of ``asked`` (the
        loop's time) or not at all, and answered within twice that. Raises
        `StoreError` when it was not made, another error when that cannot
        be told (the answer was lost after the statement went out)."""
        assert self.engine is not None
        loop = asyncio.get_running_loop()
        made_by = asked + self.timeout
        sent = False
        try:
            async with asyncio.timeout_at(asked + 2 * self.timeout):
                if not self.ready:
                    # The tables' check keeps its own deadline: it goes on if the
                    # change cannot wait for it.
                    async with asyncio.timeout_at(made_by):
                        await asyncio.shield(self.spawn(self.ensure_ready()))
                async with self.engine.connect() as conn:
                    # `made_by` on the database's clock, from a statement that waits
                    # for no lock (read before now: the deadline comes out no
                    # later). Not statement_timestamp(): behind a table lock,
                    # asyncpg's statements are stamped when they get to run.
                    db_time = (await conn.execute(sa.select(db_now()))).scalar_one()
                    left = made_by - loop.time()
                    if left <= 0:
                        raise TimeoutError
                    sent = True
                    return await send(conn, db_time + left)
        except Exception as exc:
            answered = isinstance(exc, sa.exc.DBAPIError) and not exc.connection_invalidated
            if isinstance(exc, sa.exc.DBAPIError):
                self.ready = False  # never cache "the tables exist"
            if sent and not answered:
                raise  # made, unless it was not: nobody can tell
            if isinstance(exc, TimeoutError):
                raise StoreError(
                    f"the store could not reach the database within its timeout ({self.timeout:g}s)"
                ) from exc
            raise StoreError(f"the store could not make it ({ErrorInfo.of(exc)})") from exc

    async def settle(self) -> None:
        """Wait for the operations whose callers gave up, for at most ``timeout``
        (each would end by its own deadline, up to the DDL's 30 s behind a
        lock); then cancel what is left, once, and let it close its connection.
        A stop (the app's, the CLI's on SIGTERM) is bounded by the store's
        timeout, not by a lock someone else holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while self.in_flight and loop.time() < deadline:
            await asyncio.wait(set(self.in_flight), timeout=deadline - loop.time())
        left = set(self.in_flight)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=self.timeout)


@asynccontextmanager
async def transaction(conn: AsyncConnection) -> AsyncIterator[None]:
    """A transaction on a connection of the store's AUTOCOMMIT engine. On SQLite,
    IMMEDIATE takes the file's write lock at the start, within the busy timeout,
    so no statement inside fails halfway for a lock."""
    await conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.dialect.name == "sqlite" else "BEGIN")
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


@asynccontextmanager
async def _connected(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of ``engine``; a pooler in statement mode refuses the
    transaction a first connection opens (SQLAlchemy's own reads of the
    server), and behind one in transaction mode those reads may meet another
    client's prepared statements: each is said as `ConfigurationError`,
    naming the fix."""
    try:
        conn = await engine.connect()
    except sa.exc.DBAPIError as exc:
        refused = refused_for_statement_mode(exc) or refused_for_kept_statements(
            exc, engine.dialect.driver
        )
        if refused is not None:
            raise refused from exc
        raise
    try:
        yield conn
    finally:
        await conn.close()


def _capacity(pool: sa.Pool) -> float:
    """The connections ``pool`` may have checked out at once: NullPool has no
    limit (it opens one per checkout); a pool of another kind (one shared
    connection is refused at open, see ``_engines``) is not known to have any
    to spare."""
    if isinstance(pool, sa.pool.NullPool):
        return math.inf
    if not isinstance(pool, sa.pool.QueuePool):
        return 0
    overflow = getattr(pool, "_max_overflow", 0)
    return math.inf if overflow < 0 else pool.size() + overflow


def _roomy(pool: sa.Pool) -> bool:
    """Whether a connection may be kept out of ``pool`` at all: at least
    ``_ROOMY`` in all (SQLAlchemy's default is 5 + 10 overflow). From a small
    pool the app's own requests would wait for the scheduler's connection."""
    return _capacity(pool) >= _ROOMY


def _spare(pool: sa.Pool) -> bool:
    """Whether ``pool`` can spare the kept connection now: at most half of it
    is checked out (the kept one included). A busy app gets it back after
    each call."""
    if not isinstance(pool, sa.pool.QueuePool):
        return True  # kept only where _roomy: NullPool, which has no limit
    return 2 * pool.checkedout() <= _capacity(pool)


def _known_closed(conn: AsyncConnection) -> bool:
    """Whether the driver already knows ``conn`` is closed (no round trip)."""
    sync = conn.sync_connection
    if sync is None or sync.invalidated or sync.closed:
        return True
    driver = sync.connection.driver_connection
    is_closed = getattr(driver, "is_closed", None)  # asyncpg
    if callable(is_closed):
        return bool(is_closed())
    return bool(getattr(driver, "closed", False) or getattr(driver, "broken", False))  # psycopg


def _ping(sync: sa.Connection) -> None:
    """The dialect's own ping (what ``pool_pre_ping`` sends at checkout)."""
    dbapi = sync.connection.dbapi_connection
    if dbapi is None or not sync.dialect.do_ping(dbapi):
        raise ConnectionError("the database did not answer a ping")


async def _drop(conn: AsyncConnection) -> None:
    """Close ``conn`` for good (not back to the pool as it is): its state is unknown."""
    # Either may fail on a connection already broken: its pool makes a new one.
    with contextlib.suppress(Exception):
        await conn.invalidate()
    with contextlib.suppress(Exception):
        await conn.close()
