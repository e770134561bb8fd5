"""The store's four tables, their names, and their DDL.

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

Times are stored as POSIX seconds (double precision) so that both databases
compare them alike. The SQL that works on the tables is in ``_statements`` and
``_queries``; creating them at startup is ``_setup``'s.
"""

from __future__ import annotations

from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.schema import CreateIndex, CreateTable

from .._errors import ConfigurationError, short

__all__ = ["Tables", "check_prefix", "ddl", "tables"]


class Tables(NamedTuple):
    """The store's tables, in one ``metadata``."""

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
