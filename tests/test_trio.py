"""The scheduler runs on trio too (anyio's other backend): its loops are then
anyio tasks, each in its own cancel scope."""

from __future__ import annotations

import contextvars
from pathlib import Path

import anyio
import pytest

from fastapi_jobs import JobContext, Scheduler, StoreError
from fastapi_jobs.stores import SQLAlchemyStore

from .support.waiting import poll


def test_jobs_tick_and_stop_on_trio() -> None:
    """On trio: jobs run on their grid, a failing one hurts no other, shutdown drains."""
    scheduler = Scheduler(shutdown_timeout=5)
    ticks: list[float] = []
    finished: list[str] = []

    @scheduler.every(seconds=0.05)
    async def fast(ctx: JobContext) -> None:
        ticks.append(ctx.tick.timestamp())

    @scheduler.every(seconds=0.05)
    async def broken() -> None:
        raise ValueError("nope")

    @scheduler.every(seconds=0.05)
    async def slow() -> None:
        await anyio.sleep(0.2)
        finished.append("slow")

    @scheduler.every(hours=1)
    async def idle() -> None:
        pass

    async def main() -> None:
        async with scheduler.running():
            await poll(lambda: len(ticks) >= 4 and scheduler.job_status("broken").failures >= 4)
            await anyio.sleep(0.1)  # the stop may find a slow run in flight: it is drained

    anyio.run(main, backend="trio")
    assert all(abs(t * 20 - round(t * 20)) < 1e-6 for t in ticks)  # on the 50 ms grid
    assert scheduler.job_status("slow").last_outcome == "ok"  # drained, not cut
    assert scheduler.job_status("idle").runs == 0


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def test_on_trio_a_job_first_woken_by_a_trigger_does_not_carry_its_context() -> None:
    """On trio too, a job's task starts from the scheduler's context, not from the
    context of the task whose trigger woke it first."""
    scheduler = Scheduler(shutdown_timeout=5)
    seen: list[str] = []

    @scheduler.every(hours=1)
    async def job() -> None:
        seen.append(REQUEST_ID.get())

    async def main() -> None:
        async with scheduler.running():
            await anyio.sleep(0.01)  # the tasks' owner runs (else the spawn waits for it)
            REQUEST_ID.set("req-1")
            await scheduler.trigger("job", wait=True)  # its first run: its task is made
            await scheduler.trigger("job", wait=True)

    anyio.run(main, backend="trio")
    assert seen == ["-", "-"]


def test_the_sqlalchemy_store_says_it_needs_asyncio(tmp_path: Path) -> None:
    """SQLAlchemy's async engine runs on asyncio only: on trio the scheduler does not
    start, with an error that says why."""
    store = SQLAlchemyStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}")
    scheduler = Scheduler(store=store)

    @scheduler.every(seconds=1)
    async def job() -> None:
        pass

    async def main() -> None:
        async with scheduler.running():
            pass

    with pytest.raises(StoreError, match="needs asyncio"):
        anyio.run(main, backend="trio")


def test_trigger_pause_and_retries_on_trio() -> None:
    """On trio: a triggered run runs in the job's task and can be waited for; a
    paused job skips its ticks; a failed run is retried."""
    scheduler = Scheduler(shutdown_timeout=5)
    runs: list[bool] = []
    tries: list[int] = []

    @scheduler.every(seconds=0.05)
    async def ticking(ctx: JobContext) -> None:
        runs.append(ctx.manual)

    @scheduler.every(hours=1, retries=2, retry_backoff=0.01)
    async def flaky() -> None:
        tries.append(1)
        if len(tries) < 2:
            raise ConnectionError("first try")

    async def main() -> None:
        async with scheduler.running():
            await scheduler.pause("ticking")
            await anyio.sleep(0.2)
            assert runs == []
            result = await (await scheduler.trigger("ticking")).wait()
            assert result is not None and result.ok
            flaky_result = await (await scheduler.trigger("flaky")).wait()
            assert flaky_result is not None and flaky_result.attempts == 2
            await scheduler.resume("ticking")
            await anyio.sleep(0.2)

    anyio.run(main, backend="trio")
    assert runs[0] is True and runs[1:] and not any(runs[1:])
    assert scheduler.job_status("ticking").skipped["paused"] >= 3
