"""Stores: claims, pauses and run history in the app's own database.

``SQLAlchemyStore`` is imported only when used, so the core does not need
SQLAlchemy::

    from fastapi_jobs.stores import SQLAlchemyStore

    scheduler = Scheduler(lifespan=resources, store=SQLAlchemyStore(lambda s: s["db"]))

``include_tables`` adds the store's tables to the app's own ``MetaData``, for
apps whose migrations (Alembic) make them.

``Store`` is the protocol a store implements, with the rows it passes
(``Ended``: a run's end; ``Instance``: the process as the store sees it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._distribution import NAME, install_hint
from .._store import Ended, Instance, Store

if TYPE_CHECKING:
    from ._sqlalchemy import SQLAlchemyStore
    from ._tables import include_tables

__all__ = ["Ended", "Instance", "SQLAlchemyStore", "Store", "include_tables"]

# What needs SQLAlchemy, and the private module that defines it.
_LAZY = {"SQLAlchemyStore": "._sqlalchemy", "include_tables": "._tables"}

for _kind in (Ended, Instance, Store):
    _kind.__module__ = __name__
del _kind


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    except ImportError as exc:
        missing = _missing_module(exc)
        if missing == "greenlet":
            # SQLAlchemy 2.1's asyncio refuses to import without it (2.0's
            # imports: SQLAlchemyStore(...) names the extra then).
            raise ModuleNotFoundError(_no_greenlet(name, exc), name=missing) from exc
        if missing != "sqlalchemy":  # pragma: no cover - depends on what is installed
            raise
        raise ModuleNotFoundError(_missing(name), name=missing) from exc
    value.__module__ = __name__
    globals()[name] = value  # found directly from now on
    return value


def _missing(name: str) -> str:
    """What to install for ``name``: the store runs on a driver; the tables
    (for the app's migrations) need SQLAlchemy alone."""
    if name == "include_tables":
        return (
            f"{name} needs SQLAlchemy (no driver): install {NAME} with the extra "
            f"[sqlalchemy], {install_hint('sqlalchemy')}, or install sqlalchemy yourself"
        )
    return (
        f"{name} needs SQLAlchemy and a driver: install {NAME} with the "
        "extra [sqlite] (aiosqlite), [postgres] (asyncpg) or [psycopg], e.g. "
        f"{install_hint('sqlite')}, or install sqlalchemy[asyncio] and the driver yourself"
    )


def _missing_module(exc: ImportError) -> str | None:
    """The module whose absence made the import fail (SQLAlchemy names
    greenlet only as the cause of its own ImportError)."""
    cause = exc.__cause__
    if exc.name is None and isinstance(cause, ImportError):
        return cause.name
    return exc.name


def _no_greenlet(name: str, exc: ImportError) -> str:
    return (
        f"{name} needs greenlet (SQLAlchemy's asyncio), which cannot be imported "
        f"({exc.__cause__ or exc}): install {NAME} with the extra of your database, "
        f"[sqlite], [postgres] or [psycopg], e.g. {install_hint('sqlite')}, or greenlet "
        "yourself"
    )
