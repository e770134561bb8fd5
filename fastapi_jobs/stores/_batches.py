"""Batching: the rows of one kind (claims, releases) that the scheduler sends
together share one statement, compiled once, their values in one JSON
parameter; a row the database refuses fails alone, and an error of the
statement (a table missing, a deadlock, the connection) fails the whole call.
`claim_all` sends claims so, noting which were asked and not yet answered."""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import ScheduleChangedError, TickAheadError
from ._db_clock import sqlite_now
from ._operations import transaction

__all__ = [
    "MAX_ROWS",
    "Compiled",
    "chunks",
    "claim_all",
    "each_row_alone_on_error",
    "encode",
    "row_error",
    "rows_cte",
]

logger = logging.getLogger("fastapi_jobs.stores")

# Rows per statement: larger batches go in several statements (each holds its
# rows' locks for the time its rows take).
MAX_ROWS = 1000

encode = json.JSONEncoder(allow_nan=False).encode
"""A batch's rows as the one JSON array of ``b_rows`` (see `rows_cte`)."""


_job = operator.itemgetter(0)  # a row's job (a C call: the sort's key for every row)


def chunks(rows: Sequence[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """``rows`` in statements of at most MAX_ROWS, sorted by job: rows in one order
    for every instance, so two batches never wait on each other's row locks in
    opposite orders (no deadlock)."""
    ordered = sorted(rows, key=_job)
    if len(ordered) <= MAX_ROWS:
        return [ordered]
    return [ordered[start : start + MAX_ROWS] for start in range(0, len(ordered), MAX_ROWS)]


def rows_cte(name: str, columns: dict[str, Any], dialect: str) -> Any:
    """The rows a statement works on, as a CTE named ``name``: one parameter,
    ``b_rows``, a JSON array of rows (each an array of ``columns``' values) that
    the database unpacks. So one statement, compiled once, serves batches of any
    size, and a row costs the app one ``json.dumps`` entry instead of a bound
    parameter per value (with the parameters' names, ordering and encoding, or
    asyncpg's checks of every array element, ~4 µs a row)."""
    if dialect == "postgresql":
        unpacked = sa.func.json_array_elements(
            sa.cast(sa.bindparam("b_rows", type_=sa.Text), postgresql.JSON)
        ).table_valued("value")
        source = unpacked.alias(f"{name}_rows")
        fields: list[sa.ColumnElement[Any]] = [
            source.c.value.op("->>")(sa.literal_column(str(k))) for k in range(len(columns))
        ]
    else:
        unpacked = sa.func.json_each(sa.bindparam("b_rows", type_=sa.Text)).table_valued("value")
        source = unpacked.alias(f"{name}_rows")
        fields = [
            sa.func.json_extract(source.c.value, sa.literal_column(f"'$[{k}]'"))
            for k in range(len(columns))
        ]
    selected = [
        sa.cast(field, kind).label(column)
        for field, (column, kind) in zip(fields, columns.items(), strict=True)
    ]
    return sa.select(*selected).select_from(source).cte(name)


class Rows:
    """What a batch statement sent to asyncpg directly returned: its records,
    read as a SQLAlchemy result's (``all``, ``first``)."""

    __slots__ = ("_records",)

    def __init__(self, records: list[Any]) -> None:
        self._records = records

    def all(self) -> list[Any]:
        return self._records

    def first(self) -> Any:
        return self._records[0] if self._records else None


class Compiled:
    """The batch statements of each kind, compiled once for the connection's
    dialect and run as the driver's own SQL.

    SQLAlchemy caches the compilation of a statement it runs, but a batch runs
    thousands of times a day and the cache lookup is not free either; run as
    driver SQL, a statement costs the driver's work and nothing more. On
    asyncpg, it goes to the driver's connection itself (`_on_asyncpg`), unless
    something listens to the engine's statements.
    """

    def __init__(self, build: Callable[[str], Any]) -> None:
        self._build = build  # kind -> the statement
        self._compiled: dict[str, tuple[str, tuple[str, ...] | None]] = {}

    def prepare(self, dialect: sa.Dialect, kinds: Sequence[str]) -> None:
        """Compile ``kinds`` now (at startup): a compilation takes milliseconds
        of the event loop, which the first tick's claim should not wait for."""
        for kind in kinds:
            if kind not in self._compiled:
                self._compiled[kind] = self._compile(kind, dialect)

    async def execute(
        self, conn: AsyncConnection, kind: str, params: dict[str, object]
    ) -> CursorResult[Any] | Rows:
        """Execute the statement of ``kind`` with ``params``."""
        compiled = self._compiled.get(kind)
        if compiled is None:
            compiled = self._compiled[kind] = self._compile(kind, conn.dialect)
        sql, names = compiled
        if names is None:
            return await conn.exec_driver_sql(sql, params)
        args = tuple(params[name] for name in names)
        if conn.dialect.driver == "asyncpg" and not _watched(conn):
            return await _on_asyncpg(conn, sql, args)
        return await conn.exec_driver_sql(sql, args)

    def _compile(self, kind: str, dialect: sa.Dialect) -> tuple[str, tuple[str, ...] | None]:
        compiled = self._build(kind).compile(dialect=dialect)
        # Run as driver SQL, a statement gets only the parameters we pass.
        assert all(name.startswith("b_") for name in compiled.binds), compiled.binds
        names = compiled.positiontup
        return compiled.string, None if names is None else tuple(names)


def _watched(conn: AsyncConnection) -> bool:
    """Whether anything sees the statements of ``conn``: SQLAlchemy's echo, or a
    listener (SQL logging, a tracing instrumentation, the tests' counters, an
    error handler). Their statements then go through SQLAlchemy, which tells them."""
    sync = conn.sync_connection
    if sync is None:
        return True
    dispatch = sync.dispatch
    return bool(
        getattr(sync, "_echo", True)
        or dispatch.before_cursor_execute
        or dispatch.after_cursor_execute
        or sync.dialect.dispatch.handle_error
    )


async def _on_asyncpg(conn: AsyncConnection, sql: str, args: tuple[object, ...]) -> Rows:
    """``sql`` on the asyncpg connection under ``conn``, prepared once by the
    driver's own statement cache. SQLAlchemy's adapter costs ~200 µs of the
    app's CPU per statement and ~2 µs per row returned (a greenlet's hops, a
    cursor, a ``Row`` per record: ``bench/claim_layers.py``), more than the
    statement itself; every instance sends one or two such statements per
    instant. Errors come out as SQLAlchemy's would: a ``DBAPIError`` whose
    ``orig`` is asyncpg's (with its ``sqlstate``), ``connection_invalidated``
    when the connection closed (as SQLAlchemy's asyncpg dialect tells a
    disconnect), which is then invalidated."""
    assert conn.sync_connection is not None
    driver = conn.sync_connection.connection.driver_connection
    assert driver is not None, "a connection checked out has its driver's"
    try:
        return Rows(await driver.fetch(sql, *args))
    except Exception as exc:
        closed = driver.is_closed()
        if closed:
            await conn.invalidate()
        hide = conn.sync_engine.hide_parameters
        raise sa.exc.DBAPIError(sql, args, exc, hide, connection_invalidated=closed) from exc


# The SQLSTATE classes that a single row's values can cause: 22 data exception
# (a value the column refuses), 23 integrity constraint violation. Any other
# class is the statement's or the database's (42P01 undefined table, 40
# deadlock or serialization, 57 operator intervention, 08 connection, 53
# resources): every row would fail alike, and the caller must see it whole.
_ROW_CLASSES = ("22", "23")


def row_error(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a batch statement, may be the fault of one of
    its rows rather than of the statement, the database or the connection."""
    if not isinstance(exc, sa.exc.DBAPIError) or exc.connection_invalidated:
        return False
    # asyncpg (through SQLAlchemy's adapter) and psycopg both name it `sqlstate`.
    state = getattr(exc.orig, "sqlstate", None)
    if isinstance(state, str) and len(state) == 5:
        return state[:2] in _ROW_CLASSES
    # SQLite has no SQLSTATE; a missing table or a lock is its OperationalError.
    return isinstance(exc, (sa.exc.IntegrityError, sa.exc.DataError))


async def each_row_alone_on_error(
    send: Callable[[list[tuple[str, Any]]], Awaitable[None]],
    rows: list[tuple[str, Any]],
    errors: dict[str, int | Exception],
) -> None:
    """``send(rows)``; if that fails for a reason one row may carry (see
    `row_error`), send each row alone, so that only the rows at fault fail
    (their errors go into ``errors``, by job) and the others go through. Any
    other error is raised: the statement failed as a whole (and its caller
    keeps the rows, to send them again)."""
    try:
        await send(rows)
        return
    except sa.exc.DBAPIError as exc:
        if not row_error(exc):
            raise
        if len(rows) == 1:
            errors[rows[0][0]] = exc
            return
        logger.warning("a batch of %d rows failed (%r); sending each row alone", len(rows), exc)
    for row in rows:
        try:
            await send([row])
        except sa.exc.DBAPIError as exc:
            if not row_error(exc):
                raise
            errors[row[0]] = exc


async def claim_all(
    batches: Compiled,
    kind: str,
    chunks: list[list[tuple[str, Any]]],
    params: dict[str, object],
    fences: dict[str, int | Exception],
    asked: dict[str, float],
    conn: AsyncConnection,
) -> dict[str, int | Exception]:
    """Send the claims (``kind``: a claim statement returning job, fence) of
    ``chunks`` with ``params``; fill ``fences`` with what they made, and
    ``asked`` with the rows sent and not yet answered (what a caller who gives
    up must look up and free)."""

    async def claim_rows(rows: list[tuple[str, Any]]) -> None:
        sent = {**params, "b_sent": sqlite_now(), "b_rows": encode(rows)}
        asked.update({row[0]: row[1] for row in rows})
        said = kind
        if kind != "reclaim" and conn.dialect.name == "postgresql" and _versioned(rows):
            said = kind + "+changed"  # _statements.VERSIONED: its refusals for a version too
        try:
            result = await batches.execute(conn, said, sent)
        except sa.exc.DBAPIError as exc:
            if not exc.connection_invalidated:
                # The database answered with an error: the statement made no
                # claim, so there is none to look up and free (it would find
                # a claim of the same tick made since, and end it).
                for job, *_ in rows:
                    asked.pop(job, None)
            raise
        records = result.all()
        if kind == "reclaim":
            # RETURNING job, fence: the drivers give the BIGINT as an int.
            fences.update(cast("list[tuple[str, int]]", records))
        else:
            made, db_time = clocked(records, conn.dialect.name)
            answers = cast("list[tuple[str, int | None]]", made)
            # A NULL fence: refused for its schedule's version (PostgreSQL's `changed`).
            fences.update((job, fence) for job, fence in answers if fence is not None)
            ahead(rows, fences, db_time, cast("float", params["b_early"]))
            changed = [job for job, fence in answers if fence is None]
            await _changed(batches, rows, changed, fences, conn)
        for row in rows:
            asked.pop(row[0], None)  # answered: claimed, or not (held, an older tick)

    for chunk in chunks:
        await each_row_alone_on_error(claim_rows, chunk, fences)
    return fences


def clocked(records: Sequence[Any], dialect: str) -> tuple[Sequence[Any], float]:
    """The rows a claim of ``_statements.CLOCKED`` returned, without the clock's
    column and row; and the database's clock as the statement ran (SQLite's is
    this host's, read now)."""
    if dialect != "postgresql":
        return records, sqlite_now()
    made = [record[:-1] for record in records if record[0] is not None]
    db_time = next(record[-1] for record in records if record[0] is None)
    return made, float(db_time)


def _versioned(rows: Sequence[tuple[Any, ...]]) -> bool:
    """Whether ``rows`` hold a stored schedule's tick (a row with its version)."""
    return any(len(row) > 2 for row in rows)


async def _changed(
    batches: Compiled,
    rows: Sequence[tuple[Any, ...]],
    changed: list[str],
    fences: dict[str, int | Exception],
    conn: AsyncConnection,
) -> None:
    """Tell the rows of ``rows`` refused for their stored schedule's version:
    `ScheduleChangedError` in ``fences``. PostgreSQL's claim returned them
    (``changed``, by job); on SQLite, whose claim returns only what it made, a
    read of the versions of the stored schedules' rows left unclaimed says
    which (a statement more, only when one of them is left unclaimed)."""
    if conn.dialect.name != "postgresql" and _versioned(rows):
        unclaimed = [row for row in rows if len(row) > 2 and row[0] not in fences]
        if unclaimed:
            result = await batches.execute(conn, "claim_changed", {"b_rows": encode(unclaimed)})
            changed = [row[0] for row in result.all()]
    if changed:
        ticks = {row[0]: row[1] for row in rows}
        for job in changed:
            fences[job] = ScheduleChangedError(float(ticks[job]))


def ahead(
    rows: Sequence[tuple[Any, ...]],
    fences: dict[str, int | Exception],
    db_time: float,
    early: float,
) -> None:
    """Tell the rows of ``rows`` (job, tick, ...) that were not claimed because
    their tick is still in the future on the database's clock (``db_time``, at
    the statement's end; the claim allows ``early``): `TickAheadError` in
    ``fences``. A row claimed elsewhere, or held, stays missing."""
    limit = db_time + early
    for row in rows:
        if row[1] > limit and row[0] not in fences:
            fences[row[0]] = TickAheadError(row[1], db_time)


async def claim_taking_over(
    batches: Compiled,
    rows: Sequence[tuple[Any, ...]],
    taking: set[str],
    params: dict[str, object],
    fences: dict[str, int | Exception],
    asked: dict[str, float],
    conn: AsyncConnection,
    *,
    history: bool,
) -> dict[str, int | Exception]:
    """Claim ``rows``; those of the ``taking`` jobs (``overlap="replace"``) take
    over a lease still held. In one transaction, with the history rows of the
    runs they replace written first (``history``: the store keeps one)."""
    others = [row for row in rows if row[0] not in taking]
    if others:
        await claim_all(batches, "claim", chunks(others), params, fences, asked, conn)
    replacing = [row for row in rows if row[0] in taking]
    async with transaction(conn):
        if history:
            sent = {**params, "b_sent": sqlite_now(), "b_rows": encode(replacing)}
            await batches.execute(conn, "replaced_runs", sent)
        await claim_all(batches, "claim_replace", chunks(replacing), params, fences, asked, conn)
    return fences
