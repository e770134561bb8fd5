"""Making the store's tables ready: create the missing ones (several workers
may do it at the same moment at startup: retried), and add the column a table
made by an earlier release lacks. With ``create_tables=False`` nothing is
created: the error names the DDL to run."""

from __future__ import annotations

import asyncio
import logging
import random

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.schema import CreateColumn

from .._errors import StoreError
from ._tables import Tables

__all__ = ["ensure_tables"]

logger = logging.getLogger("fastapi_jobs.stores")

_ATTEMPTS = 5


async def ensure_tables(conn: AsyncConnection, tables: Tables, *, create: bool) -> None:
    """Check that the store's tables exist (and create the missing ones if
    ``create``); raise `StoreError` if they cannot be used."""
    names = [t.name for t in tables.metadata.sorted_tables]

    def check(sync_conn: sa.Connection) -> list[str]:
        inspector = sa.inspect(sync_conn)
        return [n for n in names if not inspector.has_table(n)]

    missing = await conn.run_sync(check)
    if tables.pauses.name not in missing:
        await _ensure_pause_versions(conn, tables.pauses, create=create)
    if not missing:
        return
    if not create:
        raise StoreError(
            f"table(s) {', '.join(missing)} do not exist: create them with the DDL "
            "from SQLAlchemyStore.ddl(), or pass create_tables=True"
        )
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            await conn.run_sync(tables.metadata.create_all, checkfirst=True)
            break
        except sa.exc.DatabaseError:
            # Other instances were creating them at the same moment
            # ("already exists", or a duplicate in PostgreSQL's catalog).
            if not await conn.run_sync(check):
                break
            if attempt == _ATTEMPTS:
                raise
            await asyncio.sleep(random.uniform(0.02, 0.1) * attempt)
    logger.info("created table(s) %s", ", ".join(missing))


async def _ensure_pause_versions(conn: AsyncConnection, pauses: sa.Table, *, create: bool) -> None:
    """A pauses table made by a release before versions gets the column (0 in
    the rows there: the next change of each goes above it)."""
    p = pauses

    def lacks_it(sync_conn: sa.Connection) -> bool:
        columns = sa.inspect(sync_conn).get_columns(p.name)
        return "version" not in {column["name"] for column in columns}

    if not await conn.run_sync(lacks_it):
        return
    table = conn.dialect.identifier_preparer.format_table(p)
    column = CreateColumn(p.c.version).compile(dialect=conn.dialect)
    alter = f"ALTER TABLE {table} ADD COLUMN {column}"
    if not create:
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
