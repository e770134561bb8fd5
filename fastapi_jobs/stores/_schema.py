"""The store's two tables, and the SQL that works on them.

- ``<prefix>claims``: one row per job. ``last_tick`` only moves forward;
  ``fence`` grows by one per claim; ``lease_until`` is NULL once released.
- ``<prefix>instances``: one row per live app process, for the status page.

Every time comparison uses the database's clock (``db_now()``); the app's clock
only computes ticks, which are the same in every process. Times are stored as
POSIX seconds (double precision) so that both databases compare them alike.
Statements name every bind ``b_...``: the batch ones run as driver SQL
(see ``_batches.Compiled``), which gets only the parameters we pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.expression import FunctionElement

from .._errors import ConfigurationError

__all__ = [
    "Insert",
    "claim_statement",
    "db_now",
    "db_received",
    "ddl",
    "insert_for",
    "release_statement",
    "single_statements",
    "tables",
]

Insert = Callable[[sa.Table], Any]
"""The dialect's ``insert()``, which has ``ON CONFLICT``."""


def insert_for(dialect: str) -> Insert:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


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


class db_received(FunctionElement[float]):
    """When the statement reached the database, as POSIX seconds.

    A claim that waited behind a lock past the store timeout is not made: its
    caller has given up, and a claim nobody runs would hold the job for a lease.
    """

    type = sa.Double()
    inherit_cache = True


@compiles(db_received, "postgresql")
def _pg_received(element: db_received, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_received, "sqlite")
def _sqlite_received(element: db_received, compiler: Any, **kw: Any) -> str:
    # SQLite runs in this process and reads this host's clock: the time the
    # statement was sent is the time it was received.
    return str(compiler.process(sa.bindparam("b_sent", type_=sa.Double), **kw))


def tables(prefix: str) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    """The store's two tables, named with ``prefix``."""
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


def ddl(dialect: str, table_prefix: str) -> str:
    """The CREATE TABLE statements of the store's tables for ``dialect``."""
    dialects: dict[str, sa.Dialect] = {
        "postgresql": PGDialect(),  # type: ignore[no-untyped-call]
        "sqlite": SQLiteDialect(),
    }
    if dialect not in dialects:
        raise ConfigurationError(f"ddl(): dialect is 'postgresql' or 'sqlite', not {dialect!r}")
    metadata, _, _ = tables(table_prefix)
    return "\n".join(
        f"{str(CreateTable(table).compile(dialect=dialects[dialect])).strip()};\n"
        for table in metadata.sorted_tables
    )


def single_statements(claims: sa.Table, instances: sa.Table, insert: Insert) -> dict[str, Any]:
    """The statements of one row: a lease's renewal, an instance's heartbeat."""
    c, i = claims, instances
    now = db_now()
    lease = sa.bindparam("b_lease", type_=sa.Double)

    ours = sa.and_(c.c.job == sa.bindparam("b_job"), c.c.fence == sa.bindparam("b_fence"))
    # A released claim stays released: a late renewal must not re-take it.
    renew = sa.update(c).where(ours, c.c.lease_until.is_not(None)).values(lease_until=now + lease)
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
    return {"renew": renew, "beat": beat}


def _rows(name: str, columns: dict[str, Any], dialect: str) -> Any:
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


def claim_statement(claims: sa.Table, insert: Insert, dialect: str) -> Any:
    """The claim of many jobs in one statement (rows as in ``_rows``); every
    bind is a named one."""
    c, now = claims, db_now()
    lease = sa.bindparam("b_lease", type_=sa.Double)
    wanted = _rows("wanted", {"job": sa.String, "tick": sa.Double}, dialect)
    # Rows that may be claimed at all: the tick is not in the future on the
    # database's clock (a host whose clock jumped ahead must not move
    # `last_tick` past the ticks the others are about to claim), and the
    # statement did not wait past the timeout (its caller gave up).
    due = sa.select(
        wanted.c.job,
        wanted.c.tick,
        sa.literal_column("1", sa.BigInteger),
        sa.bindparam("b_owner", type_=sa.String),
        now + lease,
        now,
    ).where(
        wanted.c.tick <= now + sa.bindparam("b_early", type_=sa.Double),
        now < db_received() + sa.bindparam("b_timeout", type_=sa.Double),
    )
    new = insert(c).from_select(
        ["job", "last_tick", "fence", "owner", "lease_until", "started_at"], due
    )
    # A tick must be newer than the last one claimed (so a tick never runs
    # twice), and the previous lease must be free (so runs never overlap
    # across instances). Rows that fail return nothing. (A job's very first
    # claim inserts its row.)
    statement = new.on_conflict_do_update(
        index_elements=[c.c.job],
        set_={
            "last_tick": new.excluded.last_tick,
            "fence": c.c.fence + sa.literal_column("1", sa.BigInteger),
            "owner": new.excluded.owner,
            "lease_until": new.excluded.lease_until,
            "started_at": new.excluded.started_at,
            "finished_at": sa.null(),
            "duration": sa.null(),
            "outcome": sa.null(),
            "error": sa.null(),
        },
        where=sa.and_(
            c.c.last_tick < new.excluded.last_tick,
            sa.or_(c.c.lease_until.is_(None), c.c.lease_until < now),
        ),
    ).returning(c.c.job, c.c.fence)
    return statement


def release_statement(claims: sa.Table, dialect: str) -> Any:
    """The release of many claims in one statement (rows as in ``_rows``); every
    bind is a named one."""
    c = claims
    columns = {
        "job": sa.String,
        "fence": sa.BigInteger,
        "outcome": sa.String,
        "error": sa.Text,
        "duration": sa.Double,
    }
    v = _rows("ended", columns, dialect)
    # Only the claim `fence` is released: a newer claim of the job is not.
    statement = (
        sa.update(c)
        .where(c.c.job == v.c.job, c.c.fence == v.c.fence)
        .values(
            lease_until=sa.null(),
            finished_at=db_now(),
            outcome=v.c.outcome,
            error=v.c.error,
            duration=v.c.duration,
        )
    )
    return statement
