"""Running one job once, now: for tests and for operators."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from fastapi import FastAPI

from fastapi_jobs import JobContext, JobNotFoundError, JobRunningError
from fastapi_jobs._scheduler import seam_of
from fastapi_jobs.testing import MemoryStore

from ..conftest import HOUR, START, serve, virtual_scheduler

pytestmark = pytest.mark.looptime


async def test_run_now_with_explicit_state_without_starting_anything() -> None:
    """A test can run a job with its own state, no app, no timers."""
    scheduler = virtual_scheduler()
    rows: list[str] = []

    @scheduler.every(hours=1)
    async def digest(ctx: JobContext) -> None:
        ctx.state["outbox"].append(f"digest {ctx.name}")

    result = await scheduler.run_now("digest", state={"outbox": rows})
    assert result.ok and result.outcome == "ok" and result.error is None
    assert result.tick == START
    assert rows == ["digest digest"]
    status = scheduler.job_status("digest")
    assert status.runs == 1 and status.last_outcome == "ok"


async def test_run_now_uses_the_running_apps_state_and_marks_the_run_manual() -> None:
    """While the app runs, run_now gets the lifespan state and ctx.manual is True."""

    @asynccontextmanager
    async def resources(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        yield {"db": "the pool"}

    scheduler = virtual_scheduler(lifespan=resources)
    seen: list[tuple[object, bool]] = []

    @scheduler.every(days=1)
    async def job(ctx: JobContext) -> None:
        seen.append((ctx.state["db"], ctx.manual))

    async with serve(FastAPI(lifespan=scheduler.lifespan)):
        await scheduler.run_now("job")
    assert seen == [("the pool", True)]


async def test_run_now_returns_the_error_instead_of_raising() -> None:
    """A failing job's exception comes back on the result, and is recorded."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    def broken() -> None:
        raise KeyError("missing")

    result = await scheduler.run_now("broken")
    assert result.outcome == "failed"
    assert isinstance(result.error, KeyError)
    assert scheduler.job_status("broken").failures == 1


async def test_run_now_refuses_while_the_job_runs() -> None:
    """A job runs one at a time, by hand or not."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def slow() -> None:
        await anyio.sleep(600)

    async with scheduler.running():
        await anyio.sleep(HOUR + 1)
        with pytest.raises(JobRunningError, match="'slow' is running; wait"):
            await scheduler.run_now("slow")


async def test_scheduled_tick_during_a_manual_run_is_dropped() -> None:
    """A tick that comes while a manual run goes is skipped as overlap."""
    scheduler = virtual_scheduler()
    ticks: list[bool] = []

    @scheduler.every(hours=1)
    async def job(ctx: JobContext) -> None:
        ticks.append(ctx.manual)
        await anyio.sleep(HOUR / 2)

    async with scheduler.running(), anyio.create_task_group() as tg:
        await anyio.sleep(HOUR * 0.9)
        tg.start_soon(scheduler.run_now, "job")  # runs 0.9h .. 1.4h
        await anyio.sleep(HOUR)
    assert ticks == [True]
    assert scheduler.job_status("job").skipped == {"overlap": 1}


async def test_run_now_unknown_job() -> None:
    """An unknown name raises JobNotFoundError listing the jobs."""
    scheduler = virtual_scheduler()
    with pytest.raises(JobNotFoundError, match="no job named 'x'; the jobs are: none"):
        await scheduler.run_now("x")


async def test_job_is_an_ordinary_function() -> None:
    """The decorated function can be called directly, with a context built by hand."""
    import logging

    scheduler = virtual_scheduler()
    out: list[str] = []

    @scheduler.every(hours=1)
    async def greet(ctx: JobContext) -> None:
        out.append(ctx.state["who"])

    await greet(JobContext("greet", START, {"who": "me"}, logging.getLogger("t")))
    assert out == ["me"]


@pytest.mark.looptime
async def test_the_current_tick_after_a_run_by_hand_is_refused_saying_so() -> None:
    """A daily job run by hand at 01:00 has claimed 01:00: a run of its current
    tick (00:00, as `fastapi-jobs run` asks) is refused saying a later run took
    it, not that the database's clock was stepped back."""
    scheduler = virtual_scheduler(store=MemoryStore())

    @scheduler.every(hours=24)
    async def nightly() -> None: ...

    async with scheduler.running(ticking=False):
        await anyio.sleep(3600)
        await (await scheduler.trigger("nightly")).wait()
        with pytest.raises(JobRunningError, match="a run by hand, or a later tick") as info:
            await seam_of(scheduler).start_current_tick("nightly")
    assert "stepped back" not in str(info.value)
