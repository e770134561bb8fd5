"""Which engine the store runs on: the source it is given (an ``AsyncEngine``,
a URL, or a callable of the lifespan state) checked when the store is made,
what it runs on installed (else the extra to install is named then, not at
startup), and the engine chosen when it opens (on SQLite always one of its own)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .._distribution import NAME, install_hint
from .._errors import ConfigurationError, StoreError

__all__ = ["EngineSource", "check_source", "choose"]

EngineSource = AsyncEngine | str | Callable[[Mapping[str, Any]], AsyncEngine]

_ASYNC_DRIVERS = {"postgresql": ("asyncpg", "psycopg", "psycopg_async"), "sqlite": ("aiosqlite",)}
"""The drivers the store runs on, by backend (SQLAlchemy's async ones)."""

_INSTALLS = {
    "aiosqlite": ("aiosqlite", "sqlite", "aiosqlite"),
    "asyncpg": ("asyncpg", "postgres", "asyncpg"),
    "psycopg": ("psycopg", "psycopg", "psycopg[binary]"),
    "psycopg_async": ("psycopg", "psycopg", "psycopg[binary]"),
}
"""By driver: the module it imports, the extra that installs it, its package."""

_ONE_CONNECTION = (sa.pool.StaticPool, sa.pool.AssertionPool)
_SHARED = (
    "has a %s: one connection for the app and the scheduler, which on PostgreSQL "
    "fails the app's queries while a claim runs. Give it a pool (the default, "
    "or NullPool)"
)
_IN_MEMORY = (
    "is an in-memory SQLite database: each process would have its own, so every "
    "process would claim every tick. Use a file (sqlite+aiosqlite:///jobs.sqlite3) "
    "shared by the workers of one host, or PostgreSQL"
)


def _in_memory(url: sa.URL) -> bool:
    """An SQLite database that lives in one process's memory."""
    database = url.database or ""
    return url.get_backend_name() == "sqlite" and (
        database in ("", ":memory:") or url.query.get("mode") == "memory"
    )


def check_source(engine: object) -> None:
    """Raise `ConfigurationError` unless ``engine`` is a source the store
    can run on (a URL: of PostgreSQL or an SQLite file, through an async driver)."""
    if not (isinstance(engine, (AsyncEngine, str)) or callable(engine)):
        raise ConfigurationError(
            "SQLAlchemyStore takes an AsyncEngine, a database URL, or a callable "
            f"that returns the engine from the lifespan state; got {engine!r}"
        )
    if not isinstance(engine, str):
        check_installed(engine.url if isinstance(engine, AsyncEngine) else None)
        return
    try:
        url = sa.make_url(engine)
    except sa.exc.ArgumentError:
        raise ConfigurationError(
            "SQLAlchemyStore(...) got a string that is not a database URL, e.g. "
            "postgresql+asyncpg://user:pass@host/app or sqlite+aiosqlite:///jobs.sqlite3"
        ) from None
    if _in_memory(url):
        raise ConfigurationError(f"SQLAlchemyStore({url!r}) {_IN_MEMORY}")
    try:
        driver = url.get_driver_name()
    except sa.exc.NoSuchModuleError:  # a name SQLAlchemy has no dialect for: postgres://
        driver = ""
    if driver not in _ASYNC_DRIVERS.get(url.get_backend_name(), ()):
        # The URL as SQLAlchemy shows it: the password is masked.
        raise ConfigurationError(
            f"SQLAlchemyStore({url!r}): use PostgreSQL or SQLite through an async "
            "driver: postgresql+asyncpg://, postgresql+psycopg:// or sqlite+aiosqlite:///"
        )
    check_installed(url)


def check_installed(url: sa.URL | None) -> None:
    """Raise `ConfigurationError`, naming the extra to install, unless the
    driver of ``url`` (if known) and greenlet (SQLAlchemy's asyncio runs on it)
    import. Without them the store was made, and the app's startup failed with
    a bare ``ModuleNotFoundError``."""
    known = None if url is None else _INSTALLS.get(url.get_driver_name())
    if known is not None:
        module, extra, package = known
        _importable(module, f"the driver {module}", (extra,), package, url)
    extras = ("sqlite", "postgres", "psycopg") if known is None else (known[1],)
    _importable("greenlet", "greenlet (SQLAlchemy's asyncio)", extras, "greenlet", url)


def _importable(
    module: str, what: str, extras: tuple[str, ...], package: str, url: sa.URL | None
) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        named = "..." if url is None else repr(url)  # (the password masked)
        which = " or ".join(f"[{extra}]" for extra in extras)
        raise ConfigurationError(
            f"SQLAlchemyStore({named}) needs {what}, which cannot be imported ({exc}): "
            f"install {NAME} with the extra {which}, e.g. {install_hint(extras[0])}, "
            f"or {package} yourself"
        ) from exc


def choose(
    source: EngineSource, state: Mapping[str, Any], timeout: float
) -> tuple[AsyncEngine, AsyncEngine | None]:
    """The engine the store uses from ``source``, and the same if the store made
    it (to dispose of at close), else None."""
    owned = None
    if isinstance(source, str):
        engine = owned = _own_engine(sa.make_url(source), timeout)
    elif isinstance(source, AsyncEngine):
        engine = source
    else:
        engine = source(state)
        if not isinstance(engine, AsyncEngine):
            raise StoreError(f"the engine callable returned {engine!r}, not an AsyncEngine")
    dialect = engine.dialect.name
    if _in_memory(engine.url):
        raise StoreError(f"the store's engine ({engine.url}) {_IN_MEMORY}")
    if dialect not in ("postgresql", "sqlite"):
        raise StoreError(f"SQLAlchemyStore supports PostgreSQL and SQLite, not {dialect!r}")
    if dialect == "postgresql" and isinstance(engine.pool, _ONE_CONNECTION):
        # The scheduler's statements go beside the app's by design: on one shared
        # connection, asyncpg and psycopg refuse the second ("another operation is
        # in progress", "a manually started transaction"): the app's fail too.
        raise StoreError(f"the store's engine {_SHARED % type(engine.pool).__name__}")
    if dialect == "sqlite" and owned is None:
        engine = owned = _own_engine(engine.url, timeout)
    return engine, owned


def _own_engine(url: sa.URL, timeout: float) -> AsyncEngine:
    """An engine of the store's own. On SQLite, even when the app gives its
    engine, the store opens the same file through connections whose busy
    timeout is the store's: a statement behind a lock then fails by itself
    within `timeout`, before the operation's deadline could cut it
    mid-statement. Cut there, aiosqlite's connections lingered, each holding
    or waiting for the file's lock, and after a long outside lock the workers
    of a host kept each other locked out (and the app's pool, which the store
    borrowed, with them). SQLite has no server connections to save by
    sharing the app's pool."""
    if url.get_backend_name() == "sqlite":
        return create_async_engine(url, connect_args={"timeout": timeout})
    return create_async_engine(url)
