"""An app for the multi-process tests: N claimed jobs that record every run.

Configured by the environment:
DATABASE_URL, JOBS (count), INTERVAL (s), RUN_SECONDS, LEASE, TIMEOUT,
SHUTDOWN_TIMEOUT, CLOCK_OFFSET (s added to this process's clock), CATCH_UP (s),
RUN_ON_STARTUP (1: run the current period's tick at start), FAIL (1: every run
fails after recording itself), RETRIES, PAUSED (1: declared paused), EVERY_INSTANCE
(1: unclaimed), METRICS (1: Prometheus at /metrics, in multiprocess mode if
PROMETHEUS_MULTIPROC_DIR is set), BIND_DELAY (s uvicorn is held after it logs
startup complete, before it binds: a loaded machine, for the harness's test),
STARTUP_SECONDS (s the lifespan waits after making its tables: a startup stuck;
it creates the file STARTUP_MARK, if given, as it starts waiting), STORE_URL (1: the
store is given DATABASE_URL itself and makes its own engine, as behind a pooler;
the app's own engine then keeps no prepared statements, as a pooler needs), APP_TABLES
(0: the lifespan makes no table of its own and touches no database: only the store does).
The control router is public: the tests reach the app on localhost only.

Tables (in the app's own database, beside the store's):
- runs(job, tick, fence, instance, pid, started, finished): one row per run,
  "finished" set by a fenced write at the end;
- writes(job, fence, instance, at): one row per successful fenced write.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.schema import CreateTable

from fastapi_jobs import Every, JobContext, Scheduler, SystemClock
from fastapi_jobs.stores import SQLAlchemyStore

from .telling import TellSkips

logging.basicConfig(level=logging.INFO)
ENV = os.environ
INTERVAL = float(ENV.get("INTERVAL", "0.25"))
RUN_SECONDS = float(ENV.get("RUN_SECONDS", "0"))

if ENV.get("BIND_DELAY"):

    class _HeldAfterStartup(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Application startup complete" in record.getMessage():
                time.sleep(float(ENV["BIND_DELAY"]))

    # After uvicorn's own handler, so the line is written first; uvicorn binds
    # right after logging it, and this call holds that up.
    logging.getLogger("uvicorn").addHandler(_HeldAfterStartup())

metadata = sa.MetaData()
runs = sa.Table(
    "runs",
    metadata,
    sa.Column("job", sa.String(50)),
    sa.Column("tick", sa.Double),
    sa.Column("fence", sa.BigInteger),
    sa.Column("instance", sa.String(200)),
    sa.Column("pid", sa.Integer),
    sa.Column("started", sa.Double),
    sa.Column("finished", sa.Double, nullable=True),
)
writes = sa.Table(
    "writes",
    metadata,
    sa.Column("job", sa.String(50)),
    sa.Column("fence", sa.BigInteger),
    sa.Column("instance", sa.String(200)),
    sa.Column("at", sa.Double),
)


class OffsetClock(SystemClock):
    """This process's clock, off by CLOCK_OFFSET seconds (a skewed host)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset

    async def sleep_until(self, ts: float) -> None:
        await super().sleep_until(ts - self.offset)


def _app_connect_args() -> dict[str, Any]:
    """The app's own engine behind a pooler in transaction mode: no prepared
    statements kept (the store's own engine sets the same by itself)."""
    if ENV.get("STORE_URL") != "1" or "postgresql" not in ENV["DATABASE_URL"]:
        return {}
    if "+psycopg" in ENV["DATABASE_URL"]:
        return {"prepare_threshold": None}
    return {"statement_cache_size": 0}


@asynccontextmanager
async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    engine = create_async_engine(ENV["DATABASE_URL"], connect_args=_app_connect_args())
    for attempt in range(5 if ENV.get("APP_TABLES") != "0" else 0):
        try:
            async with engine.begin() as conn:
                for table in metadata.sorted_tables:
                    await conn.execute(CreateTable(table, if_not_exists=True))
            break
        except sa.exc.DBAPIError:
            # All processes start at once, and PostgreSQL's IF NOT EXISTS is not
            # safe against a concurrent CREATE (pg_type unique violation).
            if attempt == 4:
                raise
            await anyio.sleep(0.1 * (attempt + 1))
    if ENV.get("STARTUP_MARK"):
        await anyio.Path(ENV["STARTUP_MARK"]).touch()
    await anyio.sleep(float(ENV.get("STARTUP_SECONDS", "0")))
    yield {"db": engine}
    await engine.dispose()


store = SQLAlchemyStore(
    ENV["DATABASE_URL"] if ENV.get("STORE_URL") == "1" else lambda state: state["db"],
    lease=float(ENV.get("LEASE", "30")),
    timeout=float(ENV.get("TIMEOUT", "2")),
    heartbeat=1,
)
scheduler = Scheduler(
    lifespan=resources,
    store=store,
    shutdown_timeout=float(ENV.get("SHUTDOWN_TIMEOUT", "30")),
    clock=OffsetClock(float(ENV.get("CLOCK_OFFSET", "0"))),
)
scheduler.add_observer(TellSkips())
ME = scheduler.instance.id


def fenced(ctx: JobContext) -> sa.ColumnElement[bool]:
    """The run's fence as a condition (an every_instance run has none: always true)."""
    return sa.true() if ctx.fence is None else store.fenced(ctx)


async def fenced_write(ctx: JobContext, conn: Any) -> bool:
    """Record a write only while this run's claim is the job's latest."""
    guarded = sa.select(
        sa.literal(ctx.name), sa.literal(ctx.fence), sa.literal(ME), sa.literal(time.time())
    ).where(fenced(ctx))
    result = await conn.execute(
        writes.insert().from_select(["job", "fence", "instance", "at"], guarded)
    )
    return bool(result.rowcount)


async def work(ctx: JobContext) -> None:
    engine = ctx.state["db"]
    async with engine.begin() as conn:
        await conn.execute(
            runs.insert().values(
                job=ctx.name,
                tick=ctx.tick.timestamp(),
                fence=ctx.fence,
                instance=ME,
                pid=os.getpid(),
                started=time.time(),
            )
        )
    deadline = time.monotonic() + RUN_SECONDS
    while True:
        async with engine.begin() as conn:
            await fenced_write(ctx, conn)
        if time.monotonic() >= deadline:
            break
        await anyio.sleep(min(0.05, RUN_SECONDS))
    async with engine.begin() as conn:
        await conn.execute(
            sa.update(runs)
            .where(runs.c.job == ctx.name, runs.c.fence == ctx.fence, fenced(ctx))
            .values(finished=time.time())
        )
    if ENV.get("FAIL") == "1":
        raise ConnectionError("the job's own failure")


catch_up = float(ENV["CATCH_UP"]) if ENV.get("CATCH_UP") else None
for n in range(int(ENV.get("JOBS", "1"))):
    scheduler.add_job(
        work,
        Every(seconds=INTERVAL),
        name=f"job{n}",
        catch_up=catch_up,
        run_on_startup=ENV.get("RUN_ON_STARTUP") == "1",
        retries=int(ENV.get("RETRIES", "0")),
        retry_backoff=0.05,
        paused=ENV.get("PAUSED") == "1",
        every_instance=ENV.get("EVERY_INSTANCE") == "1",
    )

app = FastAPI(lifespan=scheduler.lifespan)
app.include_router(scheduler.router)
app.include_router(scheduler.control_router(public=True))

if ENV.get("METRICS") == "1":
    from prometheus_client import CollectorRegistry, multiprocess

    from fastapi_jobs.metrics import instrument

    registry = CollectorRegistry()
    if ENV.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    app.include_router(instrument(scheduler, registry, max_age=0.2).router())
