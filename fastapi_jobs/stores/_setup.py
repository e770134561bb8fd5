"""Making the store's tables ready: create the missing ones (several workers
may do it at the same moment at startup: retried), and add the columns a table
made by an earlier release lacks. With ``create_tables=False`` nothing is
created or altered: the error names the migration to make.

A table under one of the store's names that is not the store's (the app's own)
is never altered: the store refuses to start on it."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from functools import partial

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.schema import CreateColumn

from .._errors import StoreError
from ._tables import Tables

__all__ = ["ensure_tables"]

logger = logging.getLogger("fastapi_jobs.stores")

_ATTEMPTS = 5
_ALEMBIC = "with Alembic: alembic revision --autogenerate, then alembic upgrade head"


async def ensure_tables(conn: AsyncConnection, tables: Tables, *, create: bool) -> set[str]:
    """Check that the store's tables and their columns exist (and make the
    missing ones if ``create``); raise `StoreError` if they cannot be used.
    Returns the optional tables left missing (``create_tables=False``)."""
    names = [t.name for t in tables.metadata.sorted_tables]

    def read(sync_conn: sa.Connection) -> dict[str, set[str]]:
        # One read of the catalog for the tables (PostgreSQL), not one per table.
        found = sa.inspect(sync_conn).get_multi_columns(filter_names=names)
        return {name: {column["name"] for column in cols} for (_, name), cols in found.items()}

    found = await conn.run_sync(read)
    _refuse_foreign(tables, found, create=create)
    lacking = [
        (table, column)
        for table in tables.metadata.sorted_tables
        if table.name in found
        for column in table.columns
        if column.name not in found[table.name]
    ]
    if not create:
        lacking = _unless_instants(tables.instants.name, lacking, found)
    if lacking:  # first: a table of the app's is said before the tables to make
        await _add_columns(conn, lacking, read, create=create)
    missing = [name for name in names if name not in found]
    optional = _optional(tables)
    absent = {name for name in optional if name in missing}
    if not create and absent:
        # Only what uses them fails on their absence (hand-offs to queues that
        # need an outbox; schedules made at run time, refused with the table's
        # name; without the instants, every instance sends every claim): a
        # store made by a release before them keeps working for everything else.
        missing = [name for name in missing if name not in absent]
        if missing:  # said with the others, to be made with them
            missing += [f"{name} ({optional[name]})" for name in sorted(absent)]
    if missing and not create:
        raise StoreError(
            f"table(s) {', '.join(missing)} do not exist, and create_tables=False: make them "
            f"with a migration ({_ALEMBIC}, with include_tables() in its env.py), or with the "
            "DDL from SQLAlchemyStore.ddl(), or pass create_tables=True"
        )
    if not missing:
        return absent if not create else set()
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            await conn.run_sync(tables.metadata.create_all, checkfirst=True)
            break
        except sa.exc.DatabaseError:
            # Other instances were creating them at the same moment
            # ("already exists", or a duplicate in PostgreSQL's catalog).
            if set(await conn.run_sync(read)) == set(names):
                break
            if attempt == _ATTEMPTS:
                raise
            await asyncio.sleep(random.uniform(0.02, 0.1) * attempt)
    logger.info("created table(s) %s", ", ".join(missing))
    return set()


def _optional(tables: Tables) -> dict[str, str]:
    """The tables whose absence only what uses them notices, and what that is."""
    return {
        tables.handoffs.name: "the hand-offs' outbox",
        tables.schedules.name: "the schedules made at run time",
        tables.instants.name: "the instants claimed for sets of jobs",
    }


def _unless_instants(
    instants: str, lacking: list[tuple[sa.Table, sa.Column[object]]], found: dict[str, set[str]]
) -> list[tuple[sa.Table, sa.Column[object]]]:
    """``lacking`` without the instants table's columns: a table of instants a
    migration made wrong is left unused (as if it were not there: it only saves
    work), not a reason to stop the claims."""
    missing = [column.name for table, column in lacking if table.name == instants]
    if not missing:
        return lacking
    logger.warning(
        "table %s lacks column(s) %s (create_tables=False): not used; every instance "
        "claims every job's tick until a migration makes it as SQLAlchemyStore.ddl() says",
        instants,
        ", ".join(missing),
    )
    del found[instants]
    return [(table, column) for table, column in lacking if table.name != instants]


def _addable(column: sa.Column[object]) -> bool:
    """Whether a release may add ``column`` to a table it made before: only a
    column that may be NULL or has a default (the ALTER works on a table with rows)."""
    return bool(column.nullable) or column.server_default is not None


def _refuse_foreign(tables: Tables, found: dict[str, set[str]], *, create: bool) -> None:
    """`StoreError` for a table under a store name that the store never made: it
    lacks the store's key (``job``, or ``id``), or (when the store would add the
    missing columns) a column that no table the store made ever lacked."""
    for table in tables.metadata.sorted_tables:
        if table.name not in found:
            continue
        have = found[table.name]
        keys = [c.name for c in table.columns if c.primary_key or c.name == "job"]
        absent = [name for name in keys if name not in have]
        if not absent and create:
            absent = [c.name for c in table.columns if c.name not in have and not _addable(c)]
        if absent:
            raise StoreError(
                f"table {table.name} is not the store's (it has no column {', '.join(absent)}): "
                "it is left as it is; give SQLAlchemyStore(...) another table_prefix= "
                "(the same in include_tables(), if the app's migrations use it)"
            )


async def _add_columns(
    conn: AsyncConnection,
    lacking: list[tuple[sa.Table, sa.Column[object]]],
    read: Callable[[sa.Connection], dict[str, set[str]]],
    *,
    create: bool,
) -> None:
    """Add the columns that tables made by an earlier release lack (``version``
    of the pauses: 0 in the rows there, the next change of each goes above it).
    A release that adds a column gives it a default or lets it be NULL, so the
    ALTER works on a table with rows."""
    preparer = conn.dialect.identifier_preparer
    alters = [
        f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN "
        f"{CreateColumn(column).compile(dialect=conn.dialect)}"
        for table, column in lacking
    ]
    if not create:
        where = ", ".join(f"{table.name}.{column.name}" for table, column in lacking)
        made = (
            "an earlier release made the table"
            if all(_addable(column) for _, column in lacking)
            else "a migration left them out; or the table is the app's own: then give the "
            "store another table_prefix="
        )
        raise StoreError(
            f"column(s) {where} do not exist ({made}), and "
            f"create_tables=False: make the migration the CHANGELOG names for this release "
            f"({_ALEMBIC}), or add {'it' if len(alters) == 1 else 'them'} with "
            f"{'; '.join(alters)}, or pass create_tables=True"
        )
    for (table, column), alter in zip(lacking, alters, strict=True):
        try:
            await conn.exec_driver_sql(alter)
        except sa.exc.DatabaseError:
            if column.name not in (await conn.run_sync(read)).get(table.name, ()):
                raise
            continue  # another instance added it at the same moment
        logger.info("added the column %s to table %s", column.name, table.name)
        for index in table.indexes:
            if column.name in index.columns:  # made with the table: made with the column here
                await conn.run_sync(partial(_create_index, index))


def _create_index(index: sa.Index, sync_conn: sa.Connection) -> None:
    index.create(sync_conn, checkfirst=True)
