"""An app for the real-uvicorn shutdown tests.

Every job run writes rows to a SQLite file (JOBS_TEST_DB): ("slow", "start"),
("slow", "end"), ("ticker", "start"), and ("app", "shutdown") the moment the
lifespan starts shutting down, before the scheduler drains. With
SYNC_RUN_SECONDS, a sync job ("sync") sleeps that long in its thread, between
its "start" and "end" rows.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, closing
from typing import Any

import anyio
from fastapi import FastAPI

from fastapi_jobs import Scheduler

DB = os.environ["JOBS_TEST_DB"]
RUN_SECONDS = float(os.environ.get("SLOW_RUN_SECONDS", "2"))


def record(job: str, event: str, at: float | None = None) -> None:
    with closing(sqlite3.connect(DB, timeout=10)) as conn, conn:  # committed, then closed
        conn.execute("CREATE TABLE IF NOT EXISTS events (job TEXT, event TEXT, at REAL)")
        conn.execute("INSERT INTO events VALUES (?, ?, ?)", (job, event, at or time.time()))


logging.basicConfig(level=logging.INFO)
scheduler = Scheduler(shutdown_timeout=float(os.environ.get("SHUTDOWN_TIMEOUT", "30")))


@scheduler.every(minutes=1, run_on_startup=True)
async def slow() -> None:
    await anyio.to_thread.run_sync(record, "slow", "start")
    await anyio.sleep(RUN_SECONDS)
    await anyio.to_thread.run_sync(record, "slow", "end")


@scheduler.every(seconds=0.05)
async def ticker() -> None:
    # The moment the run started on the loop, not when a thread got to write it.
    await anyio.to_thread.run_sync(record, "ticker", "start", time.time())


if "SYNC_RUN_SECONDS" in os.environ:

    @scheduler.every(minutes=1, run_on_startup=True)
    def sync() -> None:
        record("sync", "start")
        time.sleep(float(os.environ["SYNC_RUN_SECONDS"]))
        record("sync", "end")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[Mapping[str, Any]]:
    async with scheduler.lifespan(app) as state:
        yield state
        record("app", "shutdown")


app = FastAPI(lifespan=lifespan)
app.include_router(scheduler.router)
