"""The example app: sessions in a database, and the jobs that look after them.

SQLite by default (a file in the working directory); set DATABASE_URL to use
another database, e.g. ``postgresql+asyncpg://user:pass@localhost/app``.

The job status at /jobs, the status page at /jobs/ui and the Prometheus metrics
at /metrics are for admins: set JOBS_TOKEN and send it as ``Authorization:
Bearer <token>``, or as the password (any user name) when the browser asks.
The runs are traced as soon as the app sets up an OpenTelemetry SDK.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.security import (
    HTTPAuthorizationCredentials,
    HTTPBasic,
    HTTPBasicCredentials,
    HTTPBearer,
)
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field
from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, delete, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateIndex, CreateTable

from fastapi_jobs import JobContext, Scheduler, metrics, tracing
from fastapi_jobs.stores import SQLAlchemyStore

DATABASE_URL = os.environ.get("DATABASE_URL", "sqlite+aiosqlite:///example_app.sqlite3")
JOBS_TOKEN = os.environ.get("JOBS_TOKEN", "")

metadata = MetaData()
sessions = Table(
    "sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("user", String(200), nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=False, index=True),
)
digests = Table(
    "digests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("sent_at", DateTime, nullable=False),
    Column("active_sessions", Integer, nullable=False),
)

logger = logging.getLogger("example_app")


def utcnow() -> datetime:
    # Naive UTC: what SQLAlchemy's DateTime stores on every backend alike.
    return datetime.now(UTC).replace(tzinfo=None)


@asynccontextmanager
async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """The app's own lifespan: one engine (pool) for requests and jobs alike."""
    engine = create_async_engine(DATABASE_URL)
    await create_tables(engine)
    yield {"db": engine}
    await engine.dispose()


# Claims live in the app's own database, through the app's own engine: with
# `uvicorn example_app.main:app --workers 4` each tick runs in one worker.
async def create_tables(engine: AsyncEngine) -> None:
    """Create the app's tables. With --workers N every worker does this at once:
    IF NOT EXISTS, and a retry, since PostgreSQL's IF NOT EXISTS can still
    collide with a concurrent CREATE."""
    for attempt in range(5):
        try:
            async with engine.begin() as conn:
                for table in metadata.sorted_tables:
                    await conn.execute(CreateTable(table, if_not_exists=True))
                    for index in table.indexes:
                        await conn.execute(CreateIndex(index, if_not_exists=True))
            return
        except DBAPIError:
            if attempt == 4:
                raise
            await asyncio.sleep(0.1 * (attempt + 1))


scheduler = Scheduler(
    lifespan=resources, logger=logger, store=SQLAlchemyStore(lambda state: state["db"])
)


@scheduler.every(minutes=1)
async def expire_sessions(ctx: JobContext) -> None:
    """Delete the sessions whose time is up."""
    engine: AsyncEngine = ctx.state["db"]
    async with engine.begin() as conn:
        result = await conn.execute(delete(sessions).where(sessions.c.expires_at < utcnow()))
    if result.rowcount:
        ctx.logger.info("expired %d sessions", result.rowcount)


@scheduler.cron("0 7 * * mon-fri", tz="Europe/Lisbon", retries=2, retry_backoff=30)
async def send_digest(ctx: JobContext) -> None:
    """Each weekday morning, "send" a digest: here, a row with the day's figure."""
    engine: AsyncEngine = ctx.state["db"]
    async with engine.begin() as conn:
        active = await conn.scalar(select(func.count()).select_from(sessions))
        await conn.execute(digests.insert().values(sent_at=utcnow(), active_sessions=active))
    ctx.logger.info("digest sent: %d active sessions", active)


_upstream_calls = itertools.count(1)
rates: dict[str, float] = {}  # a cache in each worker process


@scheduler.every(seconds=20, every_instance=True)
def refresh_rates() -> None:
    """Refresh this process's cache, so it runs in every worker (every_instance).
    A sync job: it runs in a worker thread. Its upstream fails every third call."""
    if next(_upstream_calls) % 3 == 0:
        raise ConnectionError("rates upstream timed out")
    rates["EUR/USD"] = 1.08


@scheduler.task()
async def remind(ctx: JobContext, user: str, text: str) -> None:
    """A task: schedules made at run time name it (POST /jobs/schedules with
    {"name": "remind-ana", "task": "remind", "schedule": {"every": 3600},
    "kwargs": {"user": "ana", "text": "stand up"}}): see docs/guides/schedules.md."""
    # What a schedule passes may be private: the log names the user, not the text.
    ctx.logger.info("reminding %s (%d characters)", user, len(text))


bearer = HTTPBearer(auto_error=False)
basic = HTTPBasic(auto_error=False)  # what a browser sends for the status page


async def require_admin(
    token: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    login: Annotated[HTTPBasicCredentials | None, Depends(basic)],
) -> None:
    """The job status tells what runs when, on which host, and what failed:
    for the app's operators, not for every visitor."""
    if not JOBS_TOKEN:
        raise HTTPException(
            503, "set JOBS_TOKEN in the app's environment to read /jobs (as a Bearer token)"
        )
    given = token.credentials if token is not None else login.password if login else ""
    if not secrets.compare_digest(given.encode(), JOBS_TOKEN.encode()):
        raise HTTPException(
            401,
            "send the app's JOBS_TOKEN: Authorization: Bearer <token> (or as the password)",
            # Basic: a browser asks for it, for the status page at /jobs/ui.
            headers={"WWW-Authenticate": 'Basic realm="jobs", charset="UTF-8"'},
        )


app = FastAPI(title="fastapi_jobs example", lifespan=scheduler.lifespan)
# GET /jobs, /jobs/{name}, /jobs/{name}/runs and the page /jobs/ui: for admins.
app.include_router(scheduler.router, dependencies=[Depends(require_admin)])
# POST /jobs/{name}/run, /pause, /resume (the page's buttons): behind the same auth.
app.include_router(scheduler.control_router(dependencies=[Depends(require_admin)]))

# Prometheus scrapes /metrics behind the same auth: the figures name the jobs and
# say which fail. Its scrape config sends the token, as a Bearer header
# (`authorization: {credentials_file: /run/secrets/jobs_token}`) or as the
# password (`basic_auth: {username: prometheus, password_file: ...}`). A registry
# of its own: the app's other metrics may share it. The router writes the jobs'
# figures a slice at a time, so a scrape does not hold the app's requests.
registry = CollectorRegistry()
jobs_metrics = metrics.instrument(scheduler, registry)
app.include_router(jobs_metrics.router(), dependencies=[Depends(require_admin)])
# A span per run, in whatever tracing the app sets up (opentelemetry-instrument,
# or the SDK configured at startup); the API's no-op until then.
tracing.instrument(scheduler)


class NewSession(BaseModel):
    user: str = Field(min_length=1, max_length=200)
    ttl_seconds: int = Field(default=3600, gt=0)


class SessionOut(BaseModel):
    id: str
    user: str
    expires_at: datetime


@app.post("/sessions", status_code=201)
async def create_session(body: NewSession, request: Request) -> SessionOut:
    engine: AsyncEngine = request.state.db
    now = utcnow()
    session_id, expires_at = secrets.token_urlsafe(16), now + timedelta(seconds=body.ttl_seconds)
    async with engine.begin() as conn:
        await conn.execute(
            sessions.insert().values(
                id=session_id, user=body.user, created_at=now, expires_at=expires_at
            )
        )
    return SessionOut(id=session_id, user=body.user, expires_at=_aware(expires_at))


@app.get("/sessions")
async def list_sessions(request: Request) -> list[SessionOut]:
    engine: AsyncEngine = request.state.db
    async with engine.connect() as conn:
        query = select(sessions).order_by(sessions.c.created_at)
        rows = (await conn.execute(query)).mappings().all()
    return [
        SessionOut(id=r["id"], user=r["user"], expires_at=_aware(r["expires_at"])) for r in rows
    ]


def _aware(naive_utc: datetime) -> datetime:
    return naive_utc.replace(tzinfo=UTC)
