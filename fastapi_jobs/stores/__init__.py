"""Stores: claims, pauses and run history in the app's own database.

``SQLAlchemyStore`` is imported only when used, so the core does not need
SQLAlchemy::

    from fastapi_jobs.stores import SQLAlchemyStore

    scheduler = Scheduler(lifespan=resources, store=SQLAlchemyStore(lambda s: s["db"]))

``Store`` is the protocol a store implements, with the rows it passes
(``Ended``: a run's end; ``Instance``: the process as the store sees it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._distribution import NAME, install_hint
from .._store import Ended, Instance, Store

if TYPE_CHECKING:
    from ._sqlalchemy import SQLAlchemyStore

__all__ = ["Ended", "Instance", "SQLAlchemyStore", "Store"]

for _kind in (Ended, Instance, Store):
    _kind.__module__ = __name__
del _kind


def __getattr__(name: str) -> Any:
    if name != "SQLAlchemyStore":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from ._sqlalchemy import SQLAlchemyStore
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on what is installed
        if exc.name != "sqlalchemy":
            raise
        raise ModuleNotFoundError(
            f"SQLAlchemyStore needs SQLAlchemy and a driver: install {NAME} with the "
            "extra [sqlite] (aiosqlite), [postgres] (asyncpg) or [psycopg], e.g. "
            f"{install_hint('sqlite')}, or install sqlalchemy[asyncio] and the driver yourself",
            name=exc.name,
        ) from exc
    SQLAlchemyStore.__module__ = __name__
    globals()["SQLAlchemyStore"] = SQLAlchemyStore  # found directly from now on
    return SQLAlchemyStore
