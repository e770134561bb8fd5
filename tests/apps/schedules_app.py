"""An app for the multi-process tests of schedules made at run time: one task,
``report(ctx, tenant)``, that records each run, and the test's own endpoints to
make, change, remove and apply schedules (``/test/...``: not the library's control
endpoints, so these tests do not depend on them).

Configured by the environment: DATABASE_URL, HEARTBEAT (s), TIMEOUT (s),
NO_TASK (1: this release lacks the task ``report``, as an older one would).
The routers are public: the tests reach the app on localhost only.

Table (in the app's own database, beside the store's):
- schedule_runs(job, tenant, tick, fence, instance): one row per run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import sqlalchemy as sa
from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.schema import CreateTable

from fastapi_jobs import Every, JobContext, Scheduler, ScheduleSpec
from fastapi_jobs.stores import SQLAlchemyStore

from .telling import TellSkips

logging.basicConfig(level=logging.INFO)
ENV = os.environ

metadata = sa.MetaData()
schedule_runs = sa.Table(
    "schedule_runs",
    metadata,
    sa.Column("job", sa.String(50)),
    sa.Column("tenant", sa.String(50)),
    sa.Column("tick", sa.Double),
    sa.Column("fence", sa.BigInteger, nullable=True),
    sa.Column("instance", sa.String(200)),
)


@asynccontextmanager
async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    engine = create_async_engine(ENV["DATABASE_URL"])
    for attempt in range(5):
        try:
            async with engine.begin() as conn:
                await conn.execute(CreateTable(schedule_runs, if_not_exists=True))
            break
        except sa.exc.DBAPIError:
            # All processes start at once, and PostgreSQL's IF NOT EXISTS is not
            # safe against a concurrent CREATE (pg_type unique violation).
            if attempt == 4:
                raise
            await anyio.sleep(0.1 * (attempt + 1))
    yield {"db": engine}
    await engine.dispose()


store = SQLAlchemyStore(
    lambda state: state["db"],
    timeout=float(ENV.get("TIMEOUT", "2")),
    heartbeat=float(ENV.get("HEARTBEAT", "0.3")),
)
scheduler = Scheduler(lifespan=resources, store=store, shutdown_timeout=10)
scheduler.add_observer(TellSkips())
ME = scheduler.instance.id


async def report(ctx: JobContext, tenant: str) -> None:
    async with ctx.state["db"].begin() as conn:
        await conn.execute(
            schedule_runs.insert().values(
                job=ctx.name, tenant=tenant, tick=ctx.tick.timestamp(), fence=ctx.fence, instance=ME
            )
        )


if ENV.get("NO_TASK") != "1":
    scheduler.task(report)


class Made(BaseModel):
    name: str
    every: float
    kwargs: dict[str, Any]


class Changed(BaseModel):
    every: float | None = None
    kwargs: dict[str, Any] | None = None


app = FastAPI(lifespan=scheduler.lifespan)
app.include_router(scheduler.router)
app.include_router(scheduler.control_router(public=True))


# The test's own endpoints (the library's HTTP ones are not what these tests test).
@app.get("/test/instance")
async def instance() -> str:
    return ME


@app.post("/test/schedules")
async def make(made: Made) -> dict[str, Any]:
    made_ = await scheduler.add_schedule(
        made.name, "report", Every(seconds=made.every), kwargs=made.kwargs
    )
    return made_.to_dict()


@app.patch("/test/schedules/{name}")
async def change(name: str, changed: Changed) -> dict[str, Any]:
    schedule = None if changed.every is None else Every(seconds=changed.every)
    stored = await scheduler.update_schedule(name, schedule=schedule, kwargs=changed.kwargs)
    return stored.to_dict()


@app.delete("/test/schedules/{name}")
async def remove(name: str) -> None:
    await scheduler.remove_schedule(name)


@app.put("/test/sets/{group}")
async def apply(group: str, made: list[Made]) -> dict[str, Any]:
    applied = await scheduler.apply_schedules(
        group,
        [ScheduleSpec(m.name, "report", Every(seconds=m.every), kwargs=m.kwargs) for m in made],
    )
    return applied.to_dict()


@app.get("/test/schedules")
async def listed() -> list[dict[str, Any]]:
    return [stored.to_dict() for stored in await scheduler.schedules()]
