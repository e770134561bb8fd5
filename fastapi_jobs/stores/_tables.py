"""The store's seven tables, their names, and their DDL.

- ``<prefix>claims``: one row per job. ``last_tick`` only moves forward;
  ``fence`` grows by one per claim; ``lease_until`` is NULL once released;
  ``finished_at``, ``outcome``, ``error``, ``duration`` are the last run's that
  ended (kept while the next one goes).
- ``<prefix>instances``: one row per live app process, for the status page.
- ``<prefix>pauses``: an operator's pause or resume of a job, for every instance
  and across restarts (no row: the job's declared default); ``version`` orders
  its changes, so that a reading never undoes a newer one (see
  ``_statements.pause``).
- ``<prefix>runs``: the run history, one row per released claim, written by the
  release's own statement and pruned in the background.
- ``<prefix>handoffs``: the outbox of hand-off jobs, one row per (job, tick)
  handed to a queue that cannot refuse a duplicate by itself (``_outbox``);
  pruned with the history.
- ``<prefix>schedules``: the schedules made at run time (``fastapi_jobs._dynamic.stored``),
  one row per name; ``version`` grows with each change (a removal leaves the
  row, marked ``removed``, so that every instance reads it), and a claim of a
  stored schedule's tick is made only under the version the row has.
- ``<prefix>instants``: one row per set of jobs that come due together
  (``key``, a digest of their names), holding the last instant an instance
  claimed for the whole set (``_claim_statements.claim_instant``). Only the
  instance that claims an instant sends the set's claims; the others skip
  theirs. It saves work and decides nothing: each job's own claim still keeps
  a tick from running twice. Pruned after a day unused.

Times are stored as POSIX seconds (double precision) so that both databases
compare them alike. The SQL that works on the tables is in ``_statements`` and
``_queries``; creating them at startup is ``_setup``'s. ``include_tables`` puts
the same tables in the app's own ``MetaData``, where Alembic's autogenerate
sees them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.schema import BLANK_SCHEMA, CreateIndex, CreateTable, SchemaItem, conv

from .._errors import ConfigurationError, short

__all__ = ["Tables", "check_prefix", "ddl", "include_tables", "tables"]


class Tables(NamedTuple):
    """The store's tables, in one ``metadata``."""

    metadata: sa.MetaData
    claims: sa.Table
    instances: sa.Table
    pauses: sa.Table
    runs: sa.Table
    handoffs: sa.Table
    schedules: sa.Table
    instants: sa.Table


_LONGEST = "ix_{}runs_job"
"""The longest name made with the prefix (the history's index)."""
_MAX_NAME_BYTES = 63
"""PostgreSQL's NAMEDATALEN - 1: it cuts longer names short (with a NOTICE),
so two of the store's names could end alike, and none would be the name the
store looks for."""
_MADE: weakref.WeakKeyDictionary[sa.Table, str] = weakref.WeakKeyDictionary()
"""The tables made here, and their prefix: a table of the app's under the same
name is told from them. Not in ``Table.info``: Alembic writes that into every
migration it generates."""
_KINDS = ("claims", "instances", "pauses", "runs", "handoffs", "schedules", "instants")


def check_prefix(prefix: object, context: str = "") -> str:
    """``prefix`` if every name made with it fits PostgreSQL's identifiers."""
    if not isinstance(prefix, str):
        raise ConfigurationError(f"{context}table_prefix={short(prefix)}: not a string")
    if not prefix:
        # The bare names are the ones an app's own tables have.
        raise ConfigurationError(
            f"{context}table_prefix='': the store's tables would be named "
            f"{', '.join(_KINDS)}, names an app's own tables may have: keep a prefix "
            "(the default is fastapi_jobs_)"
        )
    longest = _LONGEST.format(prefix)
    if not prefix.isprintable() or len(longest.encode("utf-8", "replace")) > _MAX_NAME_BYTES:
        most = _MAX_NAME_BYTES - len(_LONGEST.format(""))
        raise ConfigurationError(
            f"{context}table_prefix={short(prefix)}: use at most {most} bytes of printable "
            f"characters; the longest name made with it ({short(longest)}) must fit "
            f"PostgreSQL's {_MAX_NAME_BYTES}"
        )
    return prefix


def tables(prefix: str, metadata: sa.MetaData | None = None) -> Tables:
    """The store's tables, named with ``prefix``, in ``metadata`` (a new one by default)."""
    check_prefix(prefix)
    metadata = sa.MetaData() if metadata is None else metadata
    table = partial(_table, metadata, prefix)
    claims = table(
        "claims",
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
    instances = table(
        "instances",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("seen_at", sa.Double, nullable=False),
    )
    pauses = table(
        "pauses",
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("until", sa.Double, nullable=True),  # NULL: until resumed
        sa.Column("changed_at", sa.Double, nullable=False),
        sa.Column("changed_by", sa.String(200), nullable=False),
        # Tables made by a release before versions get the column with 0.
        sa.Column("version", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    )
    runs = table(
        "runs",
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
        # conv(): this name whatever the app's naming_convention, the one the
        # store's own DDL gives it: a database made by either matches the other,
        # and no autogenerate proposes to rename it.
        sa.Index(conv(_LONGEST.format(prefix)), "job", "id"),
    )
    return Tables(
        *(metadata, claims, instances, pauses, runs),
        *(_outbox(table), _schedules(table, prefix), _instants(table)),
    )


def _outbox(table: Callable[..., sa.Table]) -> sa.Table:
    return table(
        "handoffs",
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("tick", sa.Double, primary_key=True),
        sa.Column("queue", sa.String(200), nullable=False),  # the hand-off's name
        sa.Column("queue_id", sa.String(255), nullable=True),  # NULL: not sent yet
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("sent_at", sa.Double, nullable=True),
    )


_SCHEDULES_INDEX = "ix_{}sch_ver"
"""The schedules' index on ``version`` (no longer than the history's: the
prefix's bound stays the one `check_prefix` says)."""


_SCHEDULES_GROUP_INDEX = "ix_{}sch_grp"
"""The schedules' index on their group: an apply reads its group's rows."""


def _schedules(table: Callable[..., sa.Table], prefix: str) -> sa.Table:
    return table(
        "schedules",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("task", sa.String(200), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),  # JSON: schedule, kwargs, options
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("removed", sa.Boolean, nullable=False),
        # The set it was applied with (ScheduleTable.apply); NULL: made one by one.
        # Added by a later release (a column that may be NULL: _setup adds it).
        sa.Column("group_name", sa.String(200), nullable=True),
        sa.Index(conv(_SCHEDULES_INDEX.format(prefix)), "version"),
        sa.Index(conv(_SCHEDULES_GROUP_INDEX.format(prefix)), "group_name"),
    )


def _instants(table: Callable[..., sa.Table]) -> sa.Table:
    return table(
        "instants",
        sa.Column("key", sa.String(64), primary_key=True),  # a digest of the set's names
        sa.Column("instant", sa.Double, nullable=False),  # only moves forward
        sa.Column("owner", sa.String(200), nullable=False),  # the instance that claimed it
        sa.Column("claimed_at", sa.Double, nullable=False),
    )


def _table(metadata: sa.MetaData, prefix: str, kind: str, *items: SchemaItem) -> sa.Table:
    # BLANK_SCHEMA: where the store looks for its tables (the connection's
    # default schema), whatever default schema the app's MetaData has.
    made = sa.Table(f"{prefix}{kind}", metadata, *items, schema=BLANK_SCHEMA)
    _MADE[made] = prefix
    return made


def include_tables(metadata: sa.MetaData, table_prefix: str = "fastapi_jobs_") -> list[sa.Table]:
    """Add the store's seven tables (and their indexes) to the app's ``metadata``.

    For apps whose schema is managed by migrations (Alembic): with the tables
    in the ``MetaData`` that ``env.py`` gives as ``target_metadata``,
    ``alembic revision --autogenerate`` writes the migration that creates
    them, and the store runs with ``create_tables=False``:

    ```python
    # fragment: migrations/env.py, where the app's declarative base is Base
    from fastapi_jobs.stores import include_tables

    include_tables(Base.metadata)
    target_metadata = Base.metadata
    ```

    Pass the same ``table_prefix`` as to ``SQLAlchemyStore``. The tables keep
    their own names whatever the metadata's ``naming_convention`` (their
    primary keys, which the store never names, take the convention's), and
    they are in the connection's default schema, where the store looks for
    them, whatever the metadata's ``schema``.

    Calling it again with the same metadata and prefix adds nothing and
    returns the same tables (``env.py`` runs once per Alembic command, and
    several times in one process when commands are called from Python).

    Returns:
        The seven tables, in the order they are created.

    Raises:
        ConfigurationError: ``metadata`` is not a ``sqlalchemy.MetaData``,
            ``table_prefix`` is not one the store takes, or the metadata has a
            table or an index of its own under one of the store's names.
    """
    _check_metadata(metadata)
    prefix = check_prefix(table_prefix, context="include_tables(): ")
    names = [f"{prefix}{kind}" for kind in _KINDS]
    present = [metadata.tables[name] for name in names if name in metadata.tables]
    theirs = [
        f"a table of its own named {table.name!r}"
        for table in present
        if _MADE.get(table) != prefix
    ]
    indexes = {_LONGEST.format(prefix), _SCHEDULES_INDEX.format(prefix)}
    theirs += [
        f"an index of its own named {item.name!r} (on {table.name!r})"
        for table in metadata.tables.values()
        if table not in _MADE
        for item in table.indexes
        if item.name in indexes
    ]
    if theirs:
        raise ConfigurationError(
            f"include_tables(): the metadata has {theirs[0]}: "
            f"give the store another table_prefix= (the same in SQLAlchemyStore(...))"
        )
    if len(present) == len(names):
        return present  # included before: the same tables
    return list(tables(prefix, metadata)[1:])


def _check_metadata(metadata: object) -> None:
    if not isinstance(metadata, sa.MetaData):
        # The declarative base itself is the likely mistake: it has the metadata.
        hint = (
            "pass its .metadata"
            if isinstance(getattr(metadata, "metadata", None), sa.MetaData)
            else "e.g. Base.metadata"
        )
        raise ConfigurationError(
            f"include_tables(): it takes a sqlalchemy.MetaData ({hint}), not {short(metadata)}"
        )


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
