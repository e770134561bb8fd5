"""Shared helpers. Lifespans are entered in the test body (see `serve`), never in
async fixtures: a task group must be entered and left by the same task."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from fastapi_jobs import LoopClock, Scheduler

# A Monday, midnight UTC: virtual time in the tests starts here.
START = datetime(2026, 3, 2, tzinfo=UTC)
HOUR = 3600.0


def virtual_scheduler(start: datetime = START, **kwargs: object) -> Scheduler:
    """A scheduler whose wall clock moves with the (looptime) event loop."""
    return Scheduler(clock=LoopClock(start), **kwargs)  # type: ignore[arg-type]


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and give a client for it, in one task."""
    async with LifespanManager(app, startup_timeout=None, shutdown_timeout=None) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client
