"""An app for the multi-process tests of overlap policies and jitter: one claimed
job, ``long``, whose first run in this process is long (so only the instance
started with LONG_SECONDS has a long run) and whose later runs end at once.

Configured by the environment: DATABASE_URL, OVERLAP (skip, queue_one or
replace), INTERVAL (s), JITTER (s, or unset), LONG_SECONDS (the first run here
lasts until its tick plus this: a half interval past a tick keeps its end away
from the next ticks' claims), LEASE (s), TIMEOUT (s).
The status router is public: the tests reach the app on localhost only.

Table (in the app's own database, beside the store's):
- policy_runs(tick, fence, instance, started, ended): one row per run, "ended"
  written as the run ends, however it ends (a cancelled run's too), on this
  host's clock.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.schema import CreateTable

from fastapi_jobs import Every, JobContext, Scheduler
from fastapi_jobs.stores import SQLAlchemyStore

logging.basicConfig(level=logging.INFO)
ENV = os.environ
LONG_SECONDS = float(ENV.get("LONG_SECONDS", "0"))

metadata = sa.MetaData()
policy_runs = sa.Table(
    "policy_runs",
    metadata,
    sa.Column("tick", sa.Double),
    sa.Column("fence", sa.BigInteger, nullable=True),
    sa.Column("instance", sa.String(200)),
    sa.Column("started", sa.Double),
    sa.Column("ended", sa.Double, nullable=True),
)


@asynccontextmanager
async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    engine = create_async_engine(ENV["DATABASE_URL"])
    for attempt in range(5):
        try:
            async with engine.begin() as conn:
                await conn.execute(CreateTable(policy_runs, if_not_exists=True))
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
    lease=float(ENV.get("LEASE", "1.5")),
    timeout=float(ENV.get("TIMEOUT", "0.4")),
    heartbeat=1,
)
scheduler = Scheduler(lifespan=resources, store=store, shutdown_timeout=10)
ME = scheduler.instance.id
first = True


async def long(ctx: JobContext) -> None:
    global first
    engine = ctx.state["db"]
    tick = ctx.tick.timestamp()
    async with engine.begin() as conn:
        await conn.execute(
            policy_runs.insert().values(
                tick=tick, fence=ctx.fence, instance=ME, started=time.time()
            )
        )
    try:
        if first:
            first = False
            await anyio.sleep(max(0.0, tick + LONG_SECONDS - time.time()))
    finally:
        # Shielded: a replaced run is cancelled here, and its end is what the test reads.
        with anyio.CancelScope(shield=True):
            async with engine.begin() as conn:
                await conn.execute(
                    sa.update(policy_runs)
                    .where(policy_runs.c.fence == ctx.fence, policy_runs.c.instance == ME)
                    .values(ended=time.time())
                )


scheduler.add_job(
    long,
    Every(seconds=float(ENV.get("INTERVAL", "0.5"))),
    name="long",
    overlap=ENV.get("OVERLAP", "skip"),  # type: ignore[arg-type]  # add_job checks it
    jitter=timedelta(seconds=float(ENV["JITTER"])) if ENV.get("JITTER") else None,
)

app = FastAPI(lifespan=scheduler.lifespan)
app.include_router(scheduler.router)


@app.get("/test/instance")
async def instance() -> str:
    return ME
