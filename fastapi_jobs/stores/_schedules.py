"""The store's schedules table: the schedules made at run time
(``fastapi_jobs._dynamic.stored.ScheduleTable`` on ``<prefix>schedules``).

A row's ``version`` grows with each change and is never below the database's
clock in microseconds (as a pause's: see ``_statements.pause``), so that
instances read the changes since the last they saw by an index on it, and a
name removed and made again never goes back to a version an instance knows.
A removal marks the row: an instance that reads changes, not the whole table,
must see it. Each write is made before a deadline on the database's clock, or
not at all (``Operations.change``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import StoreError
from .._status import ErrorInfo
from .._store import ScheduleRow
from ._db_clock import db_now
from ._operations import NOT_OPEN, Operations
from ._tables import Tables

__all__ = ["StoreSchedules"]


class StoreSchedules:
    """Schedules made at run time, in the store's ``schedules`` table."""

    def __init__(self, operations: Operations, tables: Tables) -> None:
        self._ops = operations
        self._table = tables.schedules
        self.present = True
        """False when the table does not exist (``create_tables=False``, a
        database migrated before it): writes fail saying so, reads find none."""

    def _columns(self) -> tuple[Any, ...]:
        s = self._table.c
        return (s.name, s.task, s.spec, s.version, s.updated_at, s.removed)

    def _version(self) -> Any:
        s, now = self._table, db_now()
        clock = sa.cast(now * sa.literal_column("1000000"), sa.BigInteger)
        return sa.case(
            (s.c.version < clock, clock), else_=s.c.version + sa.literal_column("1", sa.BigInteger)
        )

    async def create(self, name: str, task: str, spec: str) -> ScheduleRow | None:
        s, now = self._table, db_now()
        clock = sa.cast(now * sa.literal_column("1000000"), sa.BigInteger)
        before = sa.bindparam("b_before", type_=sa.Double)
        row = sa.select(
            sa.literal(name, sa.String),
            sa.literal(task, sa.String),
            sa.literal(spec, sa.Text),
            clock,
            now,
            sa.false(),
        ).where(now < before)
        insert = postgresql.insert if self._dialect() == "postgresql" else sqlite.insert
        new = insert(s).from_select(
            ["name", "task", "spec", "version", "updated_at", "removed"], row
        )
        # A removed row is taken over (its version goes on growing); a live one
        # refuses: the name is taken.
        statement = new.on_conflict_do_update(
            index_elements=[s.c.name],
            set_={
                "task": new.excluded.task,
                "spec": new.excluded.spec,
                "version": self._version(),
                "updated_at": now,
                "removed": sa.false(),
            },
            where=sa.and_(s.c.removed == sa.true(), now < before),
        ).returning(*self._columns())
        return await self._write(statement)

    async def change(self, name: str, task: str, spec: str, expect: int) -> ScheduleRow | None:
        """Replace the spec of the live row ``name`` whose version is still
        ``expect``; None if there is none (removed, or changed meanwhile)."""
        s = self._table
        statement = (
            sa.update(s)
            .where(
                s.c.name == name,
                s.c.removed == sa.false(),
                s.c.version == expect,
                db_now() < sa.bindparam("b_before", type_=sa.Double),
            )
            .values(task=task, spec=spec, version=self._version(), updated_at=db_now())
            .returning(*self._columns())
        )
        return await self._write(statement)

    async def remove(self, name: str) -> ScheduleRow | None:
        s = self._table
        statement = (
            sa.update(s)
            .where(
                s.c.name == name,
                s.c.removed == sa.false(),
                db_now() < sa.bindparam("b_before", type_=sa.Double),
            )
            .values(removed=sa.true(), version=self._version(), updated_at=db_now())
            .returning(*self._columns())
        )
        return await self._write(statement)

    async def get(self, name: str) -> ScheduleRow | None:
        """The live row ``name``, if there is one."""
        s = self._table
        query = sa.select(*self._columns()).where(s.c.name == name, s.c.removed == sa.false())
        rows = await self._read(query)
        return rows[0] if rows else None

    async def changes(self, since: int) -> list[ScheduleRow]:
        s = self._table
        query = sa.select(*self._columns()).order_by(s.c.version)
        if since > 0:
            query = query.where(s.c.version >= since)
        else:
            query = query.where(s.c.removed == sa.false())
        return await self._read(query)

    # -- internals --------------------------------------------------------

    def _dialect(self) -> str:
        engine = self._ops.engine
        if engine is None:
            raise StoreError(NOT_OPEN)
        return engine.dialect.name

    def _absent(self) -> StoreError:
        return StoreError(
            f"table {self._table.name} does not exist (the store runs with "
            "create_tables=False): make it with the app's migrations (include_tables(), "
            "or the DDL from SQLAlchemyStore.ddl()) to make schedules at run time"
        )

    async def _read(self, query: Any) -> list[ScheduleRow]:
        if not self._ops.ready:
            await self._ops.spawn(self._ops.ensure_ready())
        if not self.present:
            return []
        rows = await self._ops.run(lambda conn: _all(conn, query))
        return [_row(row) for row in rows]

    async def _write(self, statement: Any) -> ScheduleRow | None:
        self._dialect()  # open, or StoreError
        if not self._ops.ready:
            try:
                await self._ops.spawn(self._ops.ensure_ready())
            except Exception as exc:  # nothing was sent: nothing changed
                raise StoreError(f"the store could not reach it ({ErrorInfo.of(exc)})") from exc
        if not self.present:
            raise self._absent()
        asked = asyncio.get_running_loop().time()

        async def send(conn: AsyncConnection, before: float) -> Any:
            row = (await conn.execute(statement, {"b_before": before})).first()
            if row is None and (await conn.execute(sa.select(db_now()))).scalar_one() >= before:
                # Refused, or too late (behind a lock): nothing changed either way.
                raise StoreError(
                    f"it reached the database later than the store's timeout allows "
                    f"({self._ops.timeout:g}s; a lock on {self._table.name}?)"
                )
            return row

        row = await asyncio.shield(self._ops.spawn(self._ops.change(asked, send)))
        return None if row is None else _row(row)


def _row(row: Any) -> ScheduleRow:
    name, task, spec, version, updated_at, removed = row
    return ScheduleRow(
        str(name), str(task), str(spec), int(version), float(updated_at), bool(removed)
    )


async def _all(conn: AsyncConnection, query: Any) -> list[Any]:
    return list((await conn.execute(query)).all())
