"""An app for the status page's browser tests: one job in each state, names
and errors that are HTML, HTTP Basic auth (what a browser sends by itself), and
a task that schedules made at run time may name (the tests put them in the
store before the app starts: one of this task, one of a task it lacks).

DATABASE_URL: the store's database (a SQLite file). PASSWORD: Basic's password.
FORGET_LIFESPAN (1): the app is made without ``lifespan=scheduler.lifespan``, as a
newcomer may write it: the scheduler never starts.
"""

from __future__ import annotations

import os
import secrets
from typing import Annotated

import anyio
from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPBasic, HTTPBasicCredentials

from fastapi_jobs import Scheduler
from fastapi_jobs.stores import SQLAlchemyStore

HOSTILE = "<img src=x onerror=alert(1)>"
SCRIPT_ERROR = "<script>alert('error')</script> & more"
RARE = 240  # hours: no tick during a test; runs are the startup's and the buttons'

scheduler = Scheduler(
    store=SQLAlchemyStore(
        os.environ.get("DATABASE_URL", "sqlite+aiosqlite:///page.db"), heartbeat=1
    ),
    shutdown_timeout=1,
)


@scheduler.every(hours=RARE, run_on_startup=True)
async def fine() -> None: ...


@scheduler.every(hours=RARE, run_on_startup=True)
async def broken() -> None:
    raise ConnectionError("smtp refused")


@scheduler.every(hours=RARE, run_on_startup=True)
async def slow() -> None:
    await anyio.sleep(3600)


@scheduler.every(hours=RARE, paused=True)
async def held() -> None: ...


@scheduler.every(hours=RARE)
async def fresh() -> None: ...


@scheduler.every(hours=RARE, run_on_startup=True, name=HOSTILE)
async def hostile() -> None:
    raise ValueError(SCRIPT_ERROR)


@scheduler.task()
async def report(tenant: str) -> None: ...


basic = HTTPBasic()


def admin(login: Annotated[HTTPBasicCredentials, Depends(basic)]) -> None:
    if not secrets.compare_digest(login.password.encode(), os.environ["PASSWORD"].encode()):
        raise HTTPException(401, "no", headers={"WWW-Authenticate": "Basic"})


app = FastAPI() if os.environ.get("FORGET_LIFESPAN") else FastAPI(lifespan=scheduler.lifespan)
app.include_router(scheduler.router, dependencies=[Depends(admin)])
app.include_router(scheduler.control_router(dependencies=[Depends(admin)]))
