"""The store's four tables, and the SQL that works on them.

- ``<prefix>claims``: one row per job. ``last_tick`` only moves forward;
  ``fence`` grows by one per claim; ``lease_until`` is NULL once released;
  ``finished_at``, ``outcome``, ``error``, ``duration`` are the last run's that
  ended (kept while the next one goes).
- ``<prefix>instances``: one row per live app process, for the status page.
- ``<prefix>pauses``: an operator's pause or resume of a job, for every instance
  and across restarts (no row: the job's declared default); ``version`` orders
  its changes, so that a reading never undoes a newer one (see
  :func:`pause_statement`).
- ``<prefix>runs``: the run history, one row per released claim, written by the
  release's own statement and pruned in the background.

Every time comparison uses the database's clock (``db_now()``); the app's clock
only computes ticks, which are the same in every process. Times are stored as
POSIX seconds (double precision) so that both databases compare them alike.
Statements name every bind ``b_...``: the batch ones run as driver SQL
(see ``_batches.Compiled``), which gets only the parameters we pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.expression import FunctionElement

from .._errors import ConfigurationError, short

__all__ = [
    "Insert",
    "Tables",
    "check_prefix",
    "claim_statement",
    "db_now",
    "db_received",
    "ddl",
    "insert_for",
    "pause_statement",
    "prune_statements",
    "release_statement",
    "released_runs_statement",
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
    # The store's statements each run in a transaction of their own (autocommit),
    # whose start is stamped when the statement arrives. statement_timestamp() is
    # not that time on asyncpg (the extended protocol stamps it at Execute, after
    # a table lock was waited for at Parse), so a claim held 1 s behind LOCK TABLE
    # looked 11 µs old.
    return "CAST(EXTRACT(EPOCH FROM transaction_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_received, "sqlite")
def _sqlite_received(element: db_received, compiler: Any, **kw: Any) -> str:
    # SQLite runs in this process and reads this host's clock: the time the
    # statement was sent is the time it was received.
    return str(compiler.process(sa.bindparam("b_sent", type_=sa.Double), **kw))


class Tables(NamedTuple):
    metadata: sa.MetaData
    claims: sa.Table
    instances: sa.Table
    pauses: sa.Table
    runs: sa.Table


_LONGEST = "ix_{}runs_job"
"""The longest name made with the prefix (the history's index)."""
_MAX_NAME_BYTES = 63
"""PostgreSQL's NAMEDATALEN - 1: it cuts longer names short (with a NOTICE),
so two of the store's names could end alike, and none would be the name the
store looks for."""


def check_prefix(prefix: object, context: str = "") -> str:
    """``prefix`` if every name made with it fits PostgreSQL's identifiers."""
    if not isinstance(prefix, str):
        raise ConfigurationError(f"{context}table_prefix={short(prefix)}: not a string")
    longest = _LONGEST.format(prefix)
    if not prefix.isprintable() or len(longest.encode("utf-8", "replace")) > _MAX_NAME_BYTES:
        most = _MAX_NAME_BYTES - len(_LONGEST.format(""))
        raise ConfigurationError(
            f"{context}table_prefix={short(prefix)}: use at most {most} bytes of printable "
            f"characters; the longest name made with it ({short(longest)}) must fit "
            f"PostgreSQL's {_MAX_NAME_BYTES}"
        )
    return prefix


def tables(prefix: str) -> Tables:
    """The store's tables, named with ``prefix``."""
    check_prefix(prefix)
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
    pauses = sa.Table(
        f"{prefix}pauses",
        metadata,
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("until", sa.Double, nullable=True),  # NULL: until resumed
        sa.Column("changed_at", sa.Double, nullable=False),
        sa.Column("changed_by", sa.String(200), nullable=False),
        # Tables made by a release before versions get the column with 0.
        sa.Column("version", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    runs = sa.Table(
        f"{prefix}runs",
        metadata,
        # INTEGER PRIMARY KEY is SQLite's rowid: it numbers rows by itself.
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("job", sa.String(200), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("tick", sa.Double, nullable=False),
        sa.Column("manual", sa.Boolean, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("finished_at", sa.Double, nullable=False),
        sa.Column("duration", sa.Double, nullable=True),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("instance", sa.String(200), nullable=False),
        sa.Index(_LONGEST.format(prefix), "job", "id"),
    )
    return Tables(metadata, claims, instances, pauses, runs)


def ddl(dialect: str, table_prefix: str) -> str:
    """The CREATE TABLE statements of the store's tables for ``dialect``."""
    dialects: dict[str, sa.Dialect] = {
        "postgresql": PGDialect(),  # type: ignore[no-untyped-call]
        "sqlite": SQLiteDialect(),
    }
    if dialect not in dialects:
        raise ConfigurationError(f"ddl(): dialect is 'postgresql' or 'sqlite', not {dialect!r}")
    metadata = tables(table_prefix).metadata
    statements = []
    for table in metadata.sorted_tables:
        statements.append(str(CreateTable(table).compile(dialect=dialects[dialect])).strip())
        statements.extend(
            str(CreateIndex(index).compile(dialect=dialects[dialect])).strip()
            for index in sorted(table.indexes, key=lambda index: str(index.name))
        )
    return "\n".join(f"{statement};\n" for statement in statements)


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


def pause_statement(pauses: sa.Table, insert: Insert) -> Any:
    """The change of one job's pause (``b_job``, ``b_paused``, ``b_until``,
    ``b_by``), made only before ``b_before`` on the database's clock, returning
    the row's new version (no row back: too late, nothing changed).

    The deadline is checked when the statement has its locks (a table locked,
    the job's row held by another change), so a change whose caller was told
    it came too late is never made afterwards. The version grows by one with
    each change of the row and is never below the database's clock in
    microseconds, so it also grows across the table dropped and made again
    (whose rows would start over at 1 and look older than the ones before)."""
    p, now = pauses, db_now()
    in_time = now < sa.bindparam("b_before", type_=sa.Double)
    clock = sa.cast(now * sa.literal_column("1000000"), sa.BigInteger)
    change = sa.select(
        sa.bindparam("b_job", type_=sa.String),
        sa.bindparam("b_paused", type_=sa.Boolean),
        sa.bindparam("b_until", type_=sa.Double),
        now,
        sa.bindparam("b_by", type_=sa.String),
        clock,
    ).where(in_time)
    new = insert(p).from_select(
        ["job", "paused", "until", "changed_at", "changed_by", "version"], change
    )
    return new.on_conflict_do_update(
        index_elements=[p.c.job],
        set_={
            "paused": new.excluded.paused,
            "until": new.excluded.until,
            "changed_at": new.excluded.changed_at,
            "changed_by": new.excluded.changed_by,
            "version": sa.case(
                (p.c.version < new.excluded.version, new.excluded.version),
                else_=p.c.version + sa.literal_column("1", sa.BigInteger),
            ),
        },
        where=in_time,  # again once the row is locked: a wait for it counts
    ).returning(p.c.version)


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


def claim_statement(
    claims: sa.Table, pauses: sa.Table, insert: Insert, dialect: str, *, manual: bool = False
) -> Any:
    """The claim of many jobs in one statement (rows as in ``_rows``); every
    bind is a named one. A paused job's tick is not claimed, unless ``manual``
    (an operator asked for the run)."""
    c, p, now = claims, pauses, db_now()
    lease = sa.bindparam("b_lease", type_=sa.Double)
    wanted = _rows("wanted", {"job": sa.String, "tick": sa.Double}, dialect)
    # Rows that may be claimed at all: the tick is not in the future on the
    # database's clock (a host whose clock jumped ahead must not move
    # `last_tick` past the ticks the others are about to claim), and the
    # statement did not wait past the timeout (its caller gave up).
    conditions = [
        wanted.c.tick <= now + sa.bindparam("b_early", type_=sa.Double),
        now < db_received() + sa.bindparam("b_timeout", type_=sa.Double),
    ]
    if not manual:
        # A pause taken on any instance holds from the next claim on: one
        # primary-key probe per row, in the claim's own statement.
        conditions.append(
            ~sa.exists().where(
                p.c.job == wanted.c.job,
                p.c.paused == sa.true(),
                sa.or_(p.c.until.is_(None), p.c.until > now),
            )
        )
    due = sa.select(
        wanted.c.job,
        wanted.c.tick,
        sa.literal_column("1", sa.BigInteger),
        sa.bindparam("b_owner", type_=sa.String),
        now + lease,
        now,
    ).where(*conditions)
    new = insert(c).from_select(
        ["job", "last_tick", "fence", "owner", "lease_until", "started_at"], due
    )
    # A tick must be newer than the last one claimed (so a tick never runs
    # twice), and the previous lease must be free (so runs never overlap
    # across instances). Rows that fail return nothing. (A job's very first
    # claim inserts its row.) The last run's end (finished_at, outcome, error,
    # duration) stays until this run's release: while a run goes, the status
    # shows the run before it, not nothing.
    statement = new.on_conflict_do_update(
        index_elements=[c.c.job],
        set_={
            "last_tick": new.excluded.last_tick,
            "fence": c.c.fence + sa.literal_column("1", sa.BigInteger),
            "owner": new.excluded.owner,
            "lease_until": new.excluded.lease_until,
            "started_at": new.excluded.started_at,
        },
        where=sa.and_(
            c.c.last_tick < new.excluded.last_tick,
            sa.or_(c.c.lease_until.is_(None), c.c.lease_until < now),
        ),
    ).returning(c.c.job, c.c.fence)
    return statement


_ENDED = {
    "job": sa.String,
    "fence": sa.BigInteger,
    "outcome": sa.String,
    "error": sa.Text,
    "duration": sa.Double,
    "attempts": sa.Integer,
    "manual": sa.Integer,
}
"""The columns of a release's rows (``fastapi_jobs.Ended``)."""


def _history(runs: sa.Table, source: Any, owner: Any, *where: Any) -> Any:
    """The history rows of released claims, from ``source`` (which has the
    claim's columns and the release's), those that match ``where``."""
    return sa.insert(runs).from_select(
        [
            "job",
            "fence",
            "tick",
            "manual",
            "attempts",
            "started_at",
            "finished_at",
            "duration",
            "outcome",
            "error",
            "instance",
        ],
        sa.select(
            source.c.job,
            source.c.fence,
            source.c.last_tick,
            source.c.manual != sa.literal_column("0"),
            source.c.attempts,
            source.c.started_at,
            source.c.finished_at,
            source.c.duration,
            source.c.outcome,
            source.c.error,
            owner,
        ).where(*where),
    )


def release_statement(claims: sa.Table, runs: sa.Table | None, dialect: str) -> Any:
    """The release of many claims in one statement (rows as in ``_rows``); every
    bind is a named one. On PostgreSQL with ``runs``, the same statement writes
    the history rows (on SQLite, :func:`released_runs_statement` does, first)."""
    c = claims
    v = _rows("ended", _ENDED, dialect)
    ran = v.c.outcome.is_not(None)

    def if_ran(value: Any, kept: Any) -> Any:
        # A claim whose run never started (outcome NULL) is only freed: the
        # job's last run stays what it was.
        return sa.case((ran, value), else_=kept)

    # Only the claim `fence` is released, once: not a newer claim of the job,
    # and a release sent again (its first reply lost) adds no history row.
    statement = (
        sa.update(c)
        .where(c.c.job == v.c.job, c.c.fence == v.c.fence, c.c.lease_until.is_not(None))
        .values(
            lease_until=sa.null(),
            finished_at=if_ran(db_now(), c.c.finished_at),
            outcome=if_ran(v.c.outcome, c.c.outcome),
            error=if_ran(v.c.error, c.c.error),
            duration=if_ran(v.c.duration, c.c.duration),
        )
    )
    if runs is None or dialect != "postgresql":
        return statement
    released = statement.returning(
        c.c.job,
        c.c.fence,
        c.c.last_tick,
        c.c.started_at,
        c.c.finished_at,
        c.c.owner,
        v.c.outcome,
        v.c.error,
        v.c.duration,
        v.c.attempts,
        v.c.manual,
    ).cte("released")
    return _history(runs, released, released.c.owner, released.c.outcome.is_not(None))


def released_runs_statement(claims: sa.Table, runs: sa.Table, dialect: str) -> Any:
    """SQLite's history rows of a release (same ``b_rows``), sent just before
    its update in the same connection: SQLite cannot insert from an UPDATE's
    RETURNING in one statement. The rows still unreleased are the ones the
    update is about to release."""
    c = claims
    v = _rows("ended", _ENDED, dialect)
    source = (
        sa.select(
            c.c.job,
            c.c.fence,
            c.c.last_tick,
            c.c.started_at,
            db_now().label("finished_at"),
            c.c.owner,
            v.c.outcome,
            v.c.error,
            v.c.duration,
            v.c.attempts,
            v.c.manual,
        )
        .join_from(v, c, sa.and_(c.c.job == v.c.job, c.c.fence == v.c.fence))
        .where(c.c.lease_until.is_not(None), v.c.outcome.is_not(None))
        .subquery("released")
    )
    return _history(runs, source, source.c.owner)


def prune_statements(runs: sa.Table) -> list[Any]:
    """The history's retention: rows older than ``b_before``, and each job's
    rows past its newest ``b_keep``."""
    ranked = sa.select(
        runs.c.id,
        sa.func.row_number().over(partition_by=runs.c.job, order_by=runs.c.id.desc()).label("n"),
    ).subquery("ranked")
    old = sa.delete(runs).where(runs.c.finished_at < sa.bindparam("b_before", type_=sa.Double))
    extra = sa.delete(runs).where(
        runs.c.id.in_(
            sa.select(ranked.c.id).where(ranked.c.n > sa.bindparam("b_keep", type_=sa.Integer))
        )
    )
    return [old, extra]
