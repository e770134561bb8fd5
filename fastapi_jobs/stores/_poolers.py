"""Connection poolers between the store and PostgreSQL: PgBouncer, Supabase's
and Neon's poolers, RDS Proxy.

In transaction mode a pooler hands each transaction (each statement, outside
one) to whichever server connection is free, shared with other clients. A
statement a client prepares once and keeps (asyncpg's statement cache,
psycopg's preparing after five runs) lives on one server connection and is
then used on another: it is missing there ("does not exist"), or another
client's statement of the same name runs with this client's parameters. So
behind a pooler the store's connections keep no prepared statement: asyncpg
then parses each statement again in the same message as its parameters, which
a pooler cannot split, and psycopg sends each one whole.

A pooler is recognised by the process id it makes up for each client
connection, against the server's own ``pg_backend_pid()``, when the store
first connects. The store's own engine (given a URL) keeps no prepared
statement until it knows there is no pooler; an app's engine is the app's,
and behind a pooler one that keeps them is refused. Statement mode, which runs no transaction at
all, is refused: the claims of overlap="replace" and the schedules' changes
need one.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._errors import ConfigurationError

__all__ = [
    "Reconnect",
    "cautious",
    "check",
    "refused_for_kept_statements",
    "refused_for_statement_mode",
]

logger = logging.getLogger("fastapi_jobs.stores")

# The connect argument that keeps no prepared statement, by driver.
_NO_STATEMENTS_KEPT: dict[str, tuple[str, Any]] = {
    "asyncpg": ("statement_cache_size", 0),
    "psycopg": ("prepare_threshold", None),
}

# What a prepared statement kept behind a transaction-mode pooler meets on a
# server connection shared with other clients: another client's statement of
# the same name (42P05), none of that name (26000), or one of that name made
# for other columns or parameters (asyncpg's own errors, which carry no code).
# Nothing else makes them: a connection straight to PostgreSQL owns its names.
_CLASH_CODES = frozenset({"42P05", "26000"})
_CLASH_WORDS = ("number of columns in the result row", "bind message supplies")

STATEMENT_MODE = (
    "the store reaches PostgreSQL through a pooler in statement mode, which runs no "
    "transaction, and the store needs them: use the pooler's transaction or session mode "
    "(PgBouncer: pool_mode = transaction; Supabase: its transaction pooler, port 6543)"
)


class Reconnect(Exception):
    """The store's own engine was just set anew (see `check`): its tables are
    checked again on a new connection."""


def cautious(engine: AsyncEngine) -> None:
    """Until the store knows whether a pooler is in between, the connections of
    its own ``engine`` keep no prepared statements: one kept by the first
    connection would stay on the pooler's shared server connection, in another
    client's way ("already exists") or in its statements' place."""
    event.listen(engine.sync_engine, "do_connect", _keep_none)


def _keep_none(dialect: sa.Dialect, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
    argument, value = _NO_STATEMENTS_KEPT[dialect.driver]
    cparams[argument] = value


async def check(conn: AsyncConnection, owned: AsyncEngine | None) -> bool:
    """Whether ``conn`` reaches PostgreSQL through a pooler. With none, the
    store's own engine (``owned``, made `cautious`) keeps its prepared
    statements from now on (`Reconnect` raised). Behind one, an app's engine
    that keeps them is refused, as is a pooler in statement mode
    (`ConfigurationError`, naming the fix)."""
    sync = conn.sync_connection
    assert sync is not None
    driver = sync.connection.driver_connection
    assert driver is not None, "a connection checked out has its driver's"
    name = conn.dialect.driver
    told = driver.get_server_pid() if name == "asyncpg" else driver.info.backend_pid
    try:
        real = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
    except sa.exc.DBAPIError as exc:
        # Instances starting at once behind a pooler: this very statement may
        # meet another's of the same name. That is the answer, not a failure.
        refused = refused_for_kept_statements(exc, name)
        if refused is not None:
            raise refused from None
        raise
    if told == real:
        if owned is not None and event.contains(owned.sync_engine, "do_connect", _keep_none):
            # The server itself: statements prepared once and kept (~150 µs a
            # claim saved on asyncpg), on connections made from now on.
            event.remove(owned.sync_engine, "do_connect", _keep_none)
            await owned.dispose()
            raise Reconnect
        return False
    await _refuse_statement_mode(conn)
    if _keeps_statements(driver, name):
        seen = f"the server's process {real} is not the {told} the connection was told"
        raise _kept_statements(name, seen)
    logger.info(
        "the store reaches PostgreSQL through a connection pooler: its connections keep "
        "no prepared statements"
    )
    return True


def _kept_statements(driver: str, seen: str) -> ConfigurationError:
    """The refusal of an engine of ``driver`` that keeps prepared statements
    behind a pooler (``seen``: how the store knows), naming the fix."""
    argument, value = _NO_STATEMENTS_KEPT[driver]
    return ConfigurationError(
        f"the store's engine reaches PostgreSQL through a connection pooler ({seen}), and "
        "its connections keep prepared statements: in the pooler's transaction mode "
        "they run on other clients' server connections, with other parameters (the "
        "store cannot tell that mode from session mode, where they would be safe). "
        f"Make the engine with connect_args={{{argument!r}: {value!r}}}, or give the "
        "store the URL: SQLAlchemyStore(url) makes an engine of its own that keeps none"
    )


def refused_for_kept_statements(exc: sa.exc.DBAPIError, driver: str) -> ConfigurationError | None:
    """The `ConfigurationError` naming the fix, if ``exc`` is what a prepared
    statement kept behind a pooler meets (another client's of the same name,
    none, or one of other columns): at the store's check, or at a first
    connection (SQLAlchemy's own reads of the server), where instances that
    start at once meet each other's statements before the check can tell."""
    if driver not in _NO_STATEMENTS_KEPT:
        return None
    code = getattr(exc.orig, "sqlstate", None)
    said = str(exc.orig)
    if code in _CLASH_CODES or any(words in said for words in _CLASH_WORDS):
        return _kept_statements(driver, f"a prepared statement clashed: {said[:120]}")
    return None


def _keeps_statements(driver: Any, name: str) -> bool:
    """Whether the driver's connection keeps prepared statements."""
    if name == "asyncpg":
        # asyncpg's own flag (statement_cache_size > 0), read by its fetch().
        return bool(getattr(driver, "_stmt_cache_enabled", True))
    return driver.prepare_threshold is not None


async def _refuse_statement_mode(conn: AsyncConnection) -> None:
    """`ConfigurationError` if the pooler refuses a transaction (statement mode)."""
    try:
        await conn.exec_driver_sql("BEGIN")
        await conn.exec_driver_sql("ROLLBACK")
    except sa.exc.DBAPIError as exc:
        refused = refused_for_statement_mode(exc)
        if refused is not None:
            raise refused from None
        raise


def refused_for_statement_mode(exc: sa.exc.DBAPIError) -> ConfigurationError | None:
    """The `ConfigurationError` naming the fix, if ``exc`` is a pooler's refusal
    of a transaction in statement mode (at the store's check, or at a first
    connection, whose own reads of the server SQLAlchemy opens one for)."""
    if "statement pooling mode" in str(exc):
        return ConfigurationError(STATEMENT_MODE)
    return None
