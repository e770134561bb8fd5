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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from .._errors import NameTakenError, StoreError, TooManySchedulesError
from .._status import ErrorInfo
from .._store import AppliedRows, ScheduleRow, SetChange
from ._db_clock import db_now
from ._operations import NOT_OPEN, Operations, transaction
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
        return (s.name, s.task, s.spec, s.version, s.updated_at, s.removed, s.group_name)

    def _version(self) -> Any:
        s, now = self._table, db_now()
        clock = sa.cast(now * sa.literal_column("1000000"), sa.BigInteger)
        return sa.case(
            (s.c.version < clock, clock), else_=s.c.version + sa.literal_column("1", sa.BigInteger)
        )

    async def create(
        self, name: str, task: str, spec: str, most: int | None = None
    ) -> ScheduleRow | None:
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
                "group_name": sa.null(),  # made by name: in no group, whatever the old row's
            },
            where=sa.and_(s.c.removed == sa.true(), now < before),
        ).returning(*self._columns())
        return await self._write(statement, most=most)

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

    async def apply(
        self,
        group: str,
        rows: Mapping[str, tuple[str, str]],
        most: int | None,
        within: float,
    ) -> AppliedRows:
        await self._ready_to_write()
        committing = False

        async def make(conn: AsyncConnection) -> AppliedRows:
            nonlocal committing
            async with transaction(conn):
                applied = await self._apply_in(conn, group, rows, most)
                committing = True  # the COMMIT goes out as the block ends
            return applied

        assert self._ops.engine is not None
        engine = self._ops.engine
        try:
            async with asyncio.timeout(within), engine.connect() as conn:
                return await make(conn)
        except (NameTakenError, TooManySchedulesError):
            raise  # refused before anything was written, and rolled back
        except Exception as exc:
            if isinstance(exc, sa.exc.DBAPIError):
                self._ops.ready = False  # never cache "the tables exist"
            answered = isinstance(exc, sa.exc.DBAPIError) and not exc.connection_invalidated
            if committing and not answered:
                raise  # the COMMIT went out and its answer did not come back
            raise StoreError(f"the store could not make it ({ErrorInfo.of(exc)})") from exc

    async def _apply_in(
        self,
        conn: AsyncConnection,
        group: str,
        rows: Mapping[str, tuple[str, str]],
        most: int | None,
    ) -> AppliedRows:
        """`apply`'s work, inside its transaction."""
        started = (await conn.execute(sa.select(db_now()))).scalar_one()
        current = await self._group_locked(conn, group)
        new, changed, gone = change = SetChange.of(current, rows)
        if most is not None and change.grows_by > 0:
            change.check_bound(await self._live_count(conn), most)
        await self._insert(conn, group, {name: rows[name] for name in new})
        await self._change_all(conn, group, {name: rows[name] for name in changed})
        await self._remove_all(conn, group, gone)
        by_name = await self._written(conn, group, started, bool(new or changed or gone))
        return AppliedRows(
            created=[by_name[name] for name in new],
            changed=[by_name[name] for name in changed],
            removed=[by_name[name] for name in gone],
            unchanged=len(rows) - len(new) - len(changed),
        )

    async def _group_locked(self, conn: AsyncConnection, group: str) -> dict[str, tuple[str, str]]:
        """The group's live rows (name: task, spec), locked for the transaction."""
        s = self._table
        query = sa.select(s.c.name, s.c.task, s.c.spec).where(
            s.c.group_name == group, s.c.removed == sa.false()
        )
        if conn.dialect.name == "postgresql":
            # Applies of one group one after the other (SQLite's BEGIN IMMEDIATE
            # already makes every writer wait); the group's rows locked against a
            # change by name meanwhile.
            key = sa.func.hashtext(sa.literal(f"{s.name}\x1f{group}"))
            await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))
            query = query.with_for_update()
        return {name: (task, spec) for name, task, spec in (await conn.execute(query)).all()}

    async def _insert(
        self, conn: AsyncConnection, group: str, rows: Mapping[str, tuple[str, str]]
    ) -> None:
        """Insert ``rows`` in ``group``, or `NameTakenError` if a live row has a name."""
        if not rows:
            return
        s, now = self._table, db_now()
        clock = sa.cast(now * sa.literal_column("1000000"), sa.BigInteger)
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        values = insert(s).values(version=clock, updated_at=now, removed=sa.false())
        # A removed row is taken over (its version goes on growing); a live one
        # (another group's, or one made by name) refuses.
        statement = values.on_conflict_do_update(
            index_elements=[s.c.name],
            set_={
                "task": values.excluded.task,
                "spec": values.excluded.spec,
                "group_name": values.excluded.group_name,
                "version": self._version(),
                "updated_at": now,
                "removed": sa.false(),
            },
            where=s.c.removed == sa.true(),
        ).returning(s.c.name)
        params = [
            {"name": name, "task": task, "spec": spec, "group_name": group}
            for name, (task, spec) in rows.items()
        ]
        made = {name for (name,) in (await conn.execute(statement, params)).all()}
        taken = [name for name in rows if name not in made]
        if taken:
            raise SetChange.taken(group, taken)

    async def _change_all(
        self, conn: AsyncConnection, group: str, rows: Mapping[str, tuple[str, str]]
    ) -> None:
        if not rows:
            return
        s = self._table
        update = (
            sa.update(s)
            .where(
                s.c.name == sa.bindparam("b_name"),
                s.c.group_name == group,
                s.c.removed == sa.false(),
            )
            .values(
                task=sa.bindparam("b_task"),
                spec=sa.bindparam("b_spec"),
                version=self._version(),
                updated_at=db_now(),
            )
        )
        params = [{"b_name": n, "b_task": t, "b_spec": sp} for n, (t, sp) in rows.items()]
        await conn.execute(update, params)

    async def _remove_all(self, conn: AsyncConnection, group: str, names: Sequence[str]) -> None:
        s = self._table
        for chunk in _chunks(names):
            await conn.execute(
                sa.update(s)
                .where(s.c.group_name == group, s.c.removed == sa.false(), s.c.name.in_(chunk))
                .values(removed=sa.true(), version=self._version(), updated_at=db_now())
            )

    async def _written(
        self, conn: AsyncConnection, group: str, started: float, wrote: bool
    ) -> dict[str, ScheduleRow]:
        """The rows of ``group`` this transaction wrote, by name."""
        s = self._table
        written = s.c.group_name == group, s.c.updated_at >= started
        if wrote:
            took = (await conn.execute(sa.select(db_now()))).scalar_one() - started
            if took > self._ops.timeout:
                # Instances read the changes since a little before their last
                # read (three store timeouts): a version stamped long before the
                # COMMIT would be missed until they read every row. Stamped again.
                await conn.execute(sa.update(s).where(*written).values(version=self._version()))
        found = (await conn.execute(sa.select(*self._columns()).where(*written))).all()
        return {row.name: row for row in map(_row, found)}

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

    async def _ready_to_write(self) -> None:
        """The store open and its tables checked, or `StoreError`: nothing sent."""
        self._dialect()  # open, or StoreError
        if not self._ops.ready:
            try:
                await self._ops.spawn(self._ops.ensure_ready())
            except Exception as exc:  # nothing was sent: nothing changed
                raise StoreError(f"the store could not reach it ({ErrorInfo.of(exc)})") from exc
        if not self.present:
            raise self._absent()

    async def _live_count(self, conn: AsyncConnection) -> int:
        s = self._table
        query = sa.select(sa.func.count()).select_from(s).where(s.c.removed == sa.false())
        return int((await conn.execute(query)).scalar_one())

    async def _write(self, statement: Any, most: int | None = None) -> ScheduleRow | None:
        await self._ready_to_write()
        asked = asyncio.get_running_loop().time()

        async def send(conn: AsyncConnection, before: float) -> Any:
            if most is not None:
                # Counted before the insert, not with it: writers at the same
                # moment may each pass the bound by one (docs/guides/schedules.md).
                live = await self._live_count(conn)
                if live >= most:
                    raise TooManySchedulesError(live, 1, most)
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
    name, task, spec, version, updated_at, removed, group = row
    return ScheduleRow(
        str(name),
        str(task),
        str(spec),
        int(version),
        float(updated_at),
        bool(removed),
        None if group is None else str(group),
    )


def _chunks(names: Sequence[str], size: int = 500) -> Iterator[Sequence[str]]:
    """``names`` by ``size``: an IN list within every driver's bound on parameters."""
    for start in range(0, len(names), size):
        yield names[start : start + size]


async def _all(conn: AsyncConnection, query: Any) -> list[Any]:
    return list((await conn.execute(query)).all())
