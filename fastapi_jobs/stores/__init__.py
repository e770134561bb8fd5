"""Stores: claims and run history in the app's own database.

Imported only when used, so the core does not need SQLAlchemy::

    from fastapi_jobs.stores import SQLAlchemyStore

    scheduler = Scheduler(lifespan=resources, store=SQLAlchemyStore(lambda s: s["db"]))
"""

from __future__ import annotations

try:
    from ._sqlalchemy import SQLAlchemyStore
except ModuleNotFoundError as exc:  # pragma: no cover - depends on what is installed
    if exc.name != "sqlalchemy":
        raise
    raise ModuleNotFoundError(
        "SQLAlchemyStore needs SQLAlchemy and a driver: install fastapi_jobs with the "
        "extra [sqlite] (aiosqlite), [postgres] (asyncpg) or [psycopg], e.g. "
        "pip install '.[sqlite]' in its repository, or install sqlalchemy[asyncio] "
        "and the driver yourself",
        name=exc.name,
    ) from exc

__all__ = ["SQLAlchemyStore"]
