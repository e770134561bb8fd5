"""Thousands of stored schedules in a real SQLite file, written before an app
starts (as one set, in one transaction): the listings' tests page through them."""

from __future__ import annotations

from fastapi_jobs import Every
from fastapi_jobs._dynamic.stored import encode

from ..conftest import open_store

RARE = 240  # hours: no tick during a test

TENANTS = 4800
"""Schedules of the task ``report(tenant)``: ``tenant-00000`` and on."""
PAUSED = 100
"""Of them, the first made paused (``tenant-00000`` to ``tenant-00099``)."""
LEGACY = 200
"""Schedules of a task no app here has (``legacy-0000`` and on): left alone."""


def tenant(i: int) -> str:
    return f"tenant-{i:05d}"


def legacy(i: int) -> str:
    return f"legacy-{i:04d}"


async def seed(url: str) -> None:
    """`TENANTS` schedules of ``report`` (`PAUSED` of them paused) and `LEGACY`
    of a task that is gone, in the store at ``url``."""
    from sqlalchemy.ext.asyncio import create_async_engine

    rows = {
        tenant(i): (
            "report",
            encode(
                Every(hours=RARE), {"tenant": tenant(i)}, {"paused": True} if i < PAUSED else {}
            ),
        )
        for i in range(TENANTS)
    }
    rows.update(
        {legacy(i): ("sync_ledger", encode(Every(hours=RARE), {}, {})) for i in range(LEGACY)}
    )
    engine = create_async_engine(url)
    try:
        async with open_store(engine) as store:
            assert store.schedules is not None
            await store.schedules.apply("seed", rows, None, 60.0)
    finally:
        await engine.dispose()
