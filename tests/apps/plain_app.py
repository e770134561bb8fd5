"""An app as a new user writes it: no logging set up, run by plain `uvicorn app:app`.

Its jobs: `ok` every 0.2 s; `boom` every 0.2 s, which calls sys.exit(2) (a bug in
the job, not a request to stop the site); `slow`, at startup, 3 s long: still
running when the test stops the server. LOGGER: the app's own logger for the
scheduler; STORE: a database URL for a store (its jobs then claim their ticks).
"""

from __future__ import annotations

import logging
import os
import sys

import anyio
from fastapi import FastAPI

from fastapi_jobs import Scheduler
from fastapi_jobs.stores import SQLAlchemyStore

scheduler = Scheduler(
    shutdown_timeout=10,
    logger=logging.getLogger(os.environ["LOGGER"]) if "LOGGER" in os.environ else None,
    store=SQLAlchemyStore(os.environ["STORE"]) if "STORE" in os.environ else None,
)


@scheduler.every(seconds=0.2)
async def ok() -> None:
    pass


@scheduler.every(seconds=0.2)
def boom() -> None:
    sys.exit(2)


@scheduler.every(hours=1, run_on_startup=True)
async def slow() -> None:
    await anyio.sleep(3)


app = FastAPI(lifespan=scheduler.lifespan)


@app.get("/ping")
async def ping() -> str:
    return "pong"
