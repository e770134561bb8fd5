"""The scheduler inside a FastAPI lifespan: shared state, start, drain and cut."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from fastapi import FastAPI, Request

from fastapi_jobs import ConfigurationError, JobContext

from ..conftest import HOUR, serve, virtual_scheduler

pytestmark = pytest.mark.looptime


class Pool:
    """Stands for the app's database pool: something created by the lifespan."""

    def __init__(self) -> None:
        self.closed = False
        self.used_by: list[str] = []


async def test_jobs_and_requests_share_the_lifespan_state() -> None:
    """Jobs see what the app's lifespan yields on ctx.state; requests on request.state."""
    pool = Pool()

    @asynccontextmanager
    async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        yield {"db": pool}
        pool.closed = True

    app_logger = logging.getLogger("myapp")
    scheduler = virtual_scheduler(lifespan=resources, logger=app_logger)
    seen: list[JobContext] = []

    @scheduler.every(hours=1)
    async def use_pool(ctx: JobContext) -> None:
        ctx.state["db"].used_by.append("job")
        assert not ctx.state["db"].closed
        seen.append(ctx)

    app = FastAPI(lifespan=scheduler.lifespan)

    @app.get("/ping")
    async def ping(request: Request) -> dict[str, bool]:
        request.state.db.used_by.append("request")
        return {"same": request.state.db is pool}

    async with serve(app) as client:
        assert (await client.get("/ping")).json() == {"same": True}
        await anyio.sleep(HOUR + 1)  # past the 1:00 tick (a tie is the heap's to order)
        assert not pool.closed
    assert pool.closed  # the app's own lifespan closed it, after the jobs stopped
    assert pool.used_by == ["request", "job"]
    [ctx] = seen
    assert ctx.state["db"] is pool
    assert ctx.name == "use_pool"
    assert ctx.logger.name == "myapp.use_pool"
    assert ctx.fence is None and ctx.manual is False


async def test_lifespan_without_app_lifespan_yields_empty_state() -> None:
    """Without an app lifespan, jobs get an empty state and requests still work."""
    scheduler = virtual_scheduler()
    states: list[object] = []

    @scheduler.every(hours=1)
    async def job(ctx: JobContext) -> None:
        states.append(dict(ctx.state))

    app = FastAPI(lifespan=scheduler.lifespan)
    async with serve(app):
        await anyio.sleep(HOUR + 1)  # past the 1:00 tick
    assert states == [{}]


async def test_shutdown_waits_for_the_run_in_flight_and_starts_no_new_run() -> None:
    """Leaving the lifespan mid-run: the run finishes, then nothing else starts."""
    scheduler = virtual_scheduler(shutdown_timeout=HOUR)
    events: list[tuple[str, float]] = []

    @scheduler.every(minutes=1)
    async def writer() -> None:
        events.append(("start", scheduler.clock.now()))
        await anyio.sleep(50)
        events.append(("end", scheduler.clock.now()))

    @scheduler.every(seconds=10)
    async def ticker() -> None:
        events.append(("tick", scheduler.clock.now()))

    app = FastAPI(lifespan=scheduler.lifespan)
    async with serve(app):
        await anyio.sleep(60 + 20)  # writer started at 60, will end at 110
        stop_at = scheduler.clock.now()
        loop_stop = anyio.current_time()
    assert anyio.current_time() - loop_stop == pytest.approx(30)  # waited for the run
    assert events[-1][0] == "end"
    assert [e for e in events if e[1] > stop_at and e[0] != "end"] == []
    assert scheduler.job_status("writer").last_outcome == "ok"


async def test_shutdown_returns_at_once_when_all_jobs_are_idle() -> None:
    """Idle jobs stop at once: no waiting for their next tick."""
    scheduler = virtual_scheduler()

    @scheduler.every(days=1)
    async def daily() -> None:
        pass

    async with scheduler.running():
        await anyio.sleep(10)
        before = anyio.current_time()
    assert anyio.current_time() == pytest.approx(before)


async def test_shutdown_cuts_runs_past_the_deadline_and_logs_each_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After shutdown_timeout the remaining runs are cancelled, named in the log."""
    scheduler = virtual_scheduler(shutdown_timeout=30)
    cleaned_up: list[str] = []

    @scheduler.every(minutes=1)
    async def endless() -> None:
        try:
            await anyio.sleep(10 * HOUR)
        finally:
            cleaned_up.append("endless")

    @scheduler.every(minutes=1)
    async def quick() -> None:
        await anyio.sleep(5)

    with caplog.at_level(logging.INFO, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(61)
            before = anyio.current_time()
    assert anyio.current_time() - before == pytest.approx(30)
    assert cleaned_up == ["endless"]
    assert scheduler.job_status("endless").last_outcome == "cancelled"
    assert scheduler.job_status("quick").last_outcome == "ok"
    cut = [r for r in caplog.records if "shutdown deadline" in r.getMessage()]
    assert [r.job for r in cut] == ["endless"]  # type: ignore[attr-defined]
    assert "'endless'" in cut[0].getMessage() and "cancelling" in cut[0].getMessage()


async def test_shutdown_timeout_none_waits_as_long_as_the_run_takes() -> None:
    """shutdown_timeout=None never cuts a run."""
    scheduler = virtual_scheduler(shutdown_timeout=None)

    @scheduler.every(minutes=1)
    async def long() -> None:
        await anyio.sleep(5 * HOUR)

    async with scheduler.running():
        await anyio.sleep(61)
    assert scheduler.job_status("long").last_outcome == "ok"


async def test_job_declared_after_start_is_refused() -> None:
    """Declaring a job while the scheduler runs fails with what to do."""
    scheduler = virtual_scheduler()
    async with scheduler.running():
        with pytest.raises(ConfigurationError, match="already running; declare jobs before"):

            @scheduler.every(hours=1)
            async def late() -> None:
                pass

    # Once stopped, it can be declared (and started again).
    @scheduler.every(hours=1)
    async def later() -> None:
        pass

    assert "later" in scheduler.jobs


async def test_running_twice_at_once_is_refused() -> None:
    """One scheduler runs one set of loops at a time."""
    scheduler = virtual_scheduler()
    async with scheduler.running():
        with pytest.raises(RuntimeError, match="already running"):
            async with scheduler.running():
                pass


async def test_scheduler_can_start_again_after_stopping() -> None:
    """A stopped scheduler (app restarted in-process, e.g. tests) runs again."""
    scheduler = virtual_scheduler()
    runs = 0

    @scheduler.every(hours=1)
    async def job() -> None:
        nonlocal runs
        runs += 1

    for _ in range(2):
        async with scheduler.running():
            await anyio.sleep(HOUR + 1)
    assert runs == 2
