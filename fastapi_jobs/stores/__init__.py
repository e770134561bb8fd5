"""Stores: claims and run history in the app's own database.

Imported only when used, so the core does not need SQLAlchemy::

    from fastapi_jobs.stores import SQLAlchemyStore

    scheduler = Scheduler(lifespan=resources, store=SQLAlchemyStore(lambda s: s["db"]))
"""

from __future__ import annotations

from ._sqlalchemy import SQLAlchemyStore

__all__ = ["SQLAlchemyStore"]
