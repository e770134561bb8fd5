"""An app for the schedule commands' tests: a store (DATABASE_URL, a SQLite
file), a task that schedules made at run time may name, which writes each run
to the file RAN_FILE (one line: the tenant and the tick), and the routers.
TASK=0: the task is left out (an older release)."""

from __future__ import annotations

import os

import anyio
from fastapi import FastAPI

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs.stores import SQLAlchemyStore

ENV = os.environ
scheduler = Scheduler(
    store=SQLAlchemyStore(
        ENV.get("DATABASE_URL", "sqlite+aiosqlite:///schedules.db"), heartbeat=0.5
    ),
    shutdown_timeout=2,
)

if ENV.get("TASK", "1") == "1":

    @scheduler.task()
    async def report(ctx: JobContext, tenant: str) -> None:
        async with await anyio.open_file(ENV.get("RAN_FILE", os.devnull), "a") as out:
            await out.write(f"{tenant} {ctx.tick.timestamp()}\n")


@scheduler.every(hours=240)
async def declared() -> None: ...


app = FastAPI(lifespan=scheduler.lifespan)
app.include_router(scheduler.router)
app.include_router(scheduler.control_router(public=True))
