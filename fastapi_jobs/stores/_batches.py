"""Batching: the rows of one kind (claims, releases) that the scheduler sends
together share one statement, compiled once per size; a row the database
refuses fails alone."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["MAX_ROWS", "SizedStatements", "each_row_alone_on_error"]

logger = logging.getLogger("fastapi_jobs.stores")

# Parameters per row: 2 (claims) or 5 (releases); PostgreSQL and SQLite allow
# 32,766 per statement.
MAX_ROWS = 1000
# Compiled statements kept, by kind and number of rows (the least recently used
# goes): an app's batches come in a few sizes, which repeat every tick.
_SIZES_KEPT = 32


class SizedStatements:
    """The multi-row statements of each kind, compiled once per number of rows.

    SQLAlchemy cannot cache a multi-row VALUES (it has no cache key): run as a
    construct, such a statement was compiled anew each time, ~80 ms of CPU for
    300 rows. Compiled once here, it runs as the driver's own SQL.
    """

    def __init__(self, build: Callable[[str, int], Any]) -> None:
        self._build = build  # (kind, rows) -> the statement
        self._by_size: dict[tuple[str, int], tuple[str, tuple[str, ...] | None]] = {}

    async def execute(
        self, conn: AsyncConnection, kind: str, rows: int, params: dict[str, object]
    ) -> CursorResult[Any]:
        """Execute the ``rows``-row statement of ``kind`` with ``params``."""
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
        compiled = self._build(kind, rows).compile(dialect=dialect)
        # Run as driver SQL, a statement gets only the parameters we pass.
        assert all(name.startswith("b_") for name in compiled.binds), compiled.binds
        names = compiled.positiontup
        return compiled.string, None if names is None else tuple(names)


async def each_row_alone_on_error(
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
