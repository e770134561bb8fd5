"""The database's clock in SQL: every time comparison of the store uses it.

The app's clock only computes ticks, which are the same in every process; app
hosts may be skewed by seconds, so leases, deadlines and "now" are read on the
database server (one clock for the whole cluster).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

__all__ = ["db_now", "db_received", "sqlite_now"]


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
    # statement was sent (``sqlite_now()``, as ``b_sent``) is the time it was received.
    return str(compiler.process(sa.bindparam("b_sent", type_=sa.Double), **kw))


# SQLite reads the OS's real-time clock itself ('now'), so the time a claim is
# sent is read there too: a wrapped or patched time.time() must not put the two
# clocks apart (its claims would all look late).
sqlite_now: Callable[[], float] = time.time
if hasattr(time, "clock_gettime"):  # not on Windows
    sqlite_now = partial(time.clock_gettime, time.CLOCK_REALTIME)
