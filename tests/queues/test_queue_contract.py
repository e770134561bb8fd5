"""What every hand-off promises, whatever the queue: one contract, run against
arq, Celery and procrastinate (each with a real broker and a real worker
process), as APScheduler runs one datastore suite against every store.

Each queue is a `QueueUnderTest`: how a job hands off to it, what the app's
lifespan gives the job, and what its worker ran. What differs between queues
(Celery's outbox, arq's job ids, procrastinate's transaction with the store)
is tested in each queue's own module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs.queues import Handoff
from fastapi_jobs.queues.arq import ArqTask
from fastapi_jobs.queues.procrastinate import ProcrastinateTask

from ..conftest import QUEUE_PARAMS
from ..support.instances import engine_for, instance
from ..support.postgres import PostgresServer
from ..support.redis import RedisServer
from ..support.waiting import poll
from . import test_handoff_arq as arq_side
from . import test_handoff_celery as celery_side
from . import test_handoff_procrastinate as procrastinate_side
from .test_handoff_arq import _store_runs

# Each queue (procrastinate on both drivers), and the server it needs: its
# marker is set from the param (tests/conftest.py).
QUEUES = QUEUE_PARAMS


@dataclass
class QueueUnderTest:
    """A queue with its worker running, and a store's engine beside it."""

    label: str
    """What `JobStatus.hand_off` says of the job's task."""
    task: Callable[[], Handoff]
    """A job's ``enqueue=`` for this queue."""
    state: Mapping[str, Any]
    """What the app's lifespan yields (the store's engine as ``db``, the queue's client)."""
    engine: AsyncEngine
    """The store's database."""
    worked: Callable[[], Awaitable[dict[str, list[Mapping[str, Any]]]]]
    """What the worker ran: each tick (ISO, from the kwargs) -> the kwargs of each execution."""
    queue_ids: Callable[[], Awaitable[dict[str, str]]]
    """Each tick (ISO) -> the queue's id of its job."""
    outbox: bool
    """Its sends are recorded in the store's outbox (Celery's and procrastinate's)."""


@asynccontextmanager
async def _arq(redis: RedisServer, tmp_path: Path) -> AsyncIterator[QueueUnderTest]:
    with arq_side.running_worker(redis, tmp_path) as worker:
        async with (
            arq_side.arq_pool(redis) as pool,
            engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
        ):

            async def worked() -> dict[str, list[Mapping[str, Any]]]:
                return _by_tick(entry["kwargs"] for entry in await worker.executions(pool))

            async def queue_ids() -> dict[str, str]:
                return {
                    entry["kwargs"]["tick"]: entry["key"] for entry in await worker.executions(pool)
                }

            yield QueueUnderTest(
                "arq task record",
                lambda: ArqTask("record", pool=lambda s: s["arq"], queue_name=worker.queue),
                {"db": engine, "arq": pool},
                engine,
                worked,
                queue_ids,
                outbox=False,
            )


@asynccontextmanager
async def _celery(redis: RedisServer, tmp_path: Path) -> AsyncIterator[QueueUnderTest]:
    with celery_side.running_worker(redis, tmp_path) as worker:
        async with (
            celery_side.celery_app(redis) as app,
            celery_side.redis_client(redis) as r,
            engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
        ):

            async def worked() -> dict[str, list[Mapping[str, Any]]]:
                return _by_tick(entry["kwargs"] for entry in await worker.executions(r))

            async def queue_ids() -> dict[str, str]:
                return {e["kwargs"]["tick"]: e["id"] for e in await worker.executions(r)}

            yield QueueUnderTest(
                "celery task fj.record",
                lambda: celery_side._task(worker),
                {"db": engine, "celery": app},
                engine,
                worked,
                queue_ids,
                outbox=True,
            )


@asynccontextmanager
async def _procrastinate(
    postgres: PostgresServer, tmp_path: Path, driver: str
) -> AsyncIterator[QueueUnderTest]:
    database = await procrastinate_side.fresh_database(postgres)
    with procrastinate_side.running_worker(database, tmp_path):
        async with engine_for(database.url(driver)) as engine:

            async def worked() -> dict[str, list[Mapping[str, Any]]]:
                executions = await procrastinate_side._executions(engine)
                return _by_tick(entry["kwargs"] for entry in executions)

            async def queue_ids() -> dict[str, str]:
                jobs = await procrastinate_side._jobs(engine)
                return {job["args"]["tick"]: str(job["id"]) for job in jobs}

            yield QueueUnderTest(
                "procrastinate task record",
                lambda: ProcrastinateTask("record"),
                {"db": engine},
                engine,
                worked,
                queue_ids,
                outbox=True,
            )


async def _outbox(engine: AsyncEngine) -> dict[str, str | None]:
    """The store's outbox: each tick (ISO) -> the queue's id it recorded."""
    async with engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT tick, queue_id FROM fastapi_jobs_handoffs"))
        return {datetime.fromtimestamp(tick, UTC).isoformat(): qid for tick, qid in rows}


def _by_tick(kwargs: Any) -> dict[str, list[Mapping[str, Any]]]:
    found: dict[str, list[Mapping[str, Any]]] = {}
    for each in kwargs:
        found.setdefault(each["tick"], []).append(each)
    return found


@pytest.fixture(params=list(QUEUES))
async def queue(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[QueueUnderTest]:
    """Each queue in turn, its worker running (its server through
    ``getfixturevalue``: the marker is set from the param, tests/conftest.py)."""
    name: str = request.param
    if name.startswith("procrastinate"):
        postgres: PostgresServer = request.getfixturevalue("postgres")
        made = _procrastinate(postgres, tmp_path, name.removeprefix("procrastinate-"))
    else:
        redis: RedisServer = request.getfixturevalue("redis")
        made = _arq(redis, tmp_path) if name == "arq" else _celery(redis, tmp_path)
    async with made as under_test:
        yield under_test


async def _all_worked(queue: QueueUnderTest, ticks: list[datetime]) -> bool:
    worked = await queue.worked()
    return all(tick.isoformat() in worked for tick in ticks)


async def test_each_tick_is_handed_off_once_and_worked_once(queue: QueueUnderTest) -> None:
    """Each tick of a hand-off job is one job in the queue, worked once with the
    kwargs the job returned for that tick; the store's history has each run ok,
    with the queue's id of its job."""
    handed: list[datetime] = []
    scheduler = instance(queue.engine)

    @scheduler.every(seconds=0.5, enqueue=queue.task())
    async def digest(ctx: JobContext) -> dict[str, object]:
        handed.append(ctx.tick)
        return {"tick": ctx.tick.isoformat(), "audience": "all"}

    async with scheduler.running(queue.state):
        assert scheduler.job_status("digest").hand_off == queue.label
        await poll(lambda: scheduler.job_status("digest").runs >= 3, within=30)
        history = await scheduler.runs("digest", limit=100)
    runs = await _store_runs(queue.engine, "digest")
    outbox = await _outbox(queue.engine)
    await poll(lambda: _all_worked(queue, handed), within=30)
    worked, queue_ids = await queue.worked(), await queue.queue_ids()

    assert len(handed) >= 3 and len(set(handed)) == len(handed)
    assert [run["outcome"] for run in runs] == ["ok"] * len(handed)
    assert worked == {
        tick.isoformat(): [{"tick": tick.isoformat(), "audience": "all"}] for tick in handed
    }
    assert outbox == (queue_ids if queue.outbox else {})
    # The history (read while the app ran: the last run may not be in it yet)
    # says which job of the queue each run made.
    assert history and all(run.tick is not None for run in history)
    assert all(run.queue_id == queue_ids[run.tick.isoformat()] for run in history if run.tick)


async def test_three_instances_hand_each_tick_off_once(queue: QueueUnderTest) -> None:
    """Three instances on one store hand one job off for a window, each going
    for every tick: each tick is claimed by one of them, handed off once and
    worked once."""
    handed: list[datetime] = []
    schedulers: list[Scheduler] = []
    async with AsyncExitStack() as stack:
        for i in range(3):
            scheduler = instance(queue.engine)
            schedulers.append(scheduler)

            async def digest(ctx: JobContext) -> dict[str, object]:
                handed.append(ctx.tick)
                return {"tick": ctx.tick.isoformat()}

            scheduler.every(seconds=0.25, enqueue=queue.task())(digest)
            await stack.enter_async_context(scheduler.running(queue.state))
            await anyio.sleep(0.07 * i)  # instances start at different moments
        await poll(lambda: len(handed) >= 10, within=30)
        competed = [
            s.job_status("digest").runs + s.job_status("digest").skipped.get("claimed_elsewhere", 0)
            for s in schedulers
        ]
    # Every instance has stopped; the runs in flight ended first.
    await poll(lambda: _all_worked(queue, handed), within=30)
    worked = await queue.worked()

    assert len(handed) == len(set(handed)), "a tick was handed off twice"
    assert {tick: len(each) for tick, each in worked.items()} == {
        tick.isoformat(): 1 for tick in handed
    }
    # Each instance went for the ticks: it ran them, or found them claimed by a
    # peer. (Which one wins is the store's race: one instance may win them all.)
    assert all(n >= 5 for n in competed), competed


def test_every_queue_of_the_package_is_under_the_contract() -> None:
    """A queue added to fastapi_jobs.queues joins the contract (or this fails)."""
    package = Path(__file__).resolve().parents[2] / "fastapi_jobs" / "queues"
    modules = {path.stem for path in package.glob("*.py") if not path.stem.startswith("_")}
    assert modules == {name.split("-")[0] for name in QUEUES}
