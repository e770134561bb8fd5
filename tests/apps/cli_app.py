"""An app without a store for the CLI's tests in this process: a job declared
paused, and one that runs as it should."""

from __future__ import annotations

from fastapi import FastAPI

from fastapi_jobs import Scheduler

scheduler = Scheduler()
ran: list[str] = []


@scheduler.every(hours=1, paused=True)
async def waiting() -> None:
    ran.append("waiting")


@scheduler.every(hours=1)
async def ready() -> None:
    ran.append("ready")


app = FastAPI(lifespan=scheduler.lifespan)


@scheduler.cron("0 7 * * *", tz="America/New_York")
async def morning() -> None:
    ran.append("morning")
