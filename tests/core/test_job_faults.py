"""Whatever a job does, it hurts no other job and no later tick: a job that raises
CancelledError, SystemExit or KeyboardInterrupt, a sync job past its timeout, a
sync function that returns a coroutine, a job that ignores cancellation."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable

import anyio
import pytest

from fastapi_jobs import ConfigurationError, Every, JobContext, Scheduler

from ..conftest import HOUR, START, virtual_scheduler
from ..support.waiting import poll

pytestmark = pytest.mark.looptime


def raising(exc: Callable[[], BaseException]) -> Callable[[], object]:
    async def job() -> None:
        raise exc()

    return job


@pytest.mark.parametrize(
    "exc",
    [asyncio.CancelledError, lambda: SystemExit(3), KeyboardInterrupt, GeneratorExit],
    ids=["CancelledError", "SystemExit", "KeyboardInterrupt", "GeneratorExit"],
)
async def test_a_job_raising_a_base_exception_fails_that_run_only(
    exc: Callable[[], BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    """A BaseException raised by the job's own code is its failure: recorded, logged
    with traceback, and the next tick runs; other jobs never notice."""
    scheduler = virtual_scheduler()
    scheduler.add_job(raising(exc), Every(hours=1), name="bad")
    good = 0

    @scheduler.every(hours=1)
    async def other() -> None:
        nonlocal good
        good += 1

    with caplog.at_level(logging.ERROR, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(3 * HOUR + 1)
            status = scheduler.job_status("bad")
    assert (status.runs, status.failures, status.last_outcome) == (3, 3, "failed")
    assert status.next_run_at is not None  # the loop lives on
    assert status.last_error is not None
    assert status.last_error.type == type(exc()).__name__
    assert good == 3
    failures = [r for r in caplog.records if r.name == "fastapi_jobs.bad"]
    assert len(failures) == 3
    assert failures[0].exc_info is not None
    assert "not a request to stop the app" in failures[0].getMessage()


async def test_a_job_awaiting_a_future_cancelled_elsewhere_fails_and_ticks_on() -> None:
    """The CancelledError of a future that something else cancelled is the job's
    failure; run_now returns it in result.error."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def waits() -> None:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(1, future.cancel)
        await future

    result = await scheduler.run_now("waits")
    assert result.outcome == "failed"
    assert isinstance(result.error, asyncio.CancelledError)
    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 10)
        status = scheduler.job_status("waits")
    assert (status.runs, status.failures) == (3, 3)


@pytest.mark.looptime(False)  # threads run in real time: so does this test
async def test_a_sync_job_past_its_timeout_never_runs_twice_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sync job's thread cannot be stopped: past its timeout the run is reported at
    once, the job counts as running until the thread returns, and the ticks that
    come meanwhile are dropped as overlap, never started in another thread."""
    scheduler = Scheduler(shutdown_timeout=None)
    lock = threading.Lock()
    active, most, calls = 0, 0, 0
    release = threading.Event()

    @scheduler.every(seconds=0.1, timeout=0.05)
    def blocking() -> None:
        nonlocal active, most, calls
        with lock:
            active, calls = active + 1, calls + 1
            most = max(most, active)
        release.wait(10)
        with lock:
            active -= 1

    with caplog.at_level(logging.ERROR, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(0.65)  # six ticks go by while the first thread waits
            during = scheduler.job_status("blocking")
            calls_during = calls
            release.set()
            await poll(lambda: scheduler.job_status("blocking").runs >= 2)  # then ran again
    after = scheduler.job_status("blocking")
    assert during.running is True
    assert calls_during == 1 and most == 1
    # Counted when the run ends; ticks that went by while this process stood
    # still (a pause in CI) are counted as missed instead.
    assert after.skipped.get("overlap", 0) >= 1
    assert after.skipped.get("overlap", 0) + after.skipped.get("missed", 0) >= 4
    # Timed out once; twice when the first run's thread did not even start
    # within the 50 ms timeout (a loaded machine): then the next tick's did.
    assert after.failures in (1, 2)
    assert after.failures == 1 or any("it did not start" in r.getMessage() for r in caplog.records)
    assert after.last_error is not None and after.last_error.type == "TimeoutError"
    reported = [r.getMessage() for r in caplog.records]
    assert any("cannot be stopped" in m and "'blocking'" in m for m in reported)


@pytest.mark.looptime(False)  # threads run in real time: so does this test
async def test_a_sync_job_that_looks_at_ctx_cancelled_returns_when_cut() -> None:
    """A sync job's thread cannot be stopped, but it is told: past its timeout,
    or cut by a shutdown past its deadline, ``ctx.cancelled`` turns true with
    the reason, and a job that looks at it returns (the run ends then)."""
    reasons: list[str | None] = []

    def until_cancelled(ctx: JobContext) -> None:
        deadline = time.monotonic() + 10
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        reasons.append(ctx.cancel_reason)

    scheduler = Scheduler(shutdown_timeout=0.05)
    scheduler.add_job(until_cancelled, Every(hours=1), name="timed", timeout=0.05)
    scheduler.add_job(until_cancelled, Every(hours=1), name="cut", run_on_startup=True)
    result = await scheduler.run_now("timed")
    assert result.outcome == "timed_out" and reasons == ["timed out"]
    fresh = JobContext("timed", START, {}, logging.getLogger("x"))
    assert not fresh.cancelled and fresh.cancel_reason is None
    async with scheduler.running():
        await poll(lambda: scheduler.job_status("cut").running)
    # The shutdown cut the run; the thread saw it and returned.
    await poll(lambda: len(reasons) == 2)
    assert reasons[1] == "the job is stopping: the app's shutdown, or its schedule changed"
    await poll(lambda: not scheduler.job_status("cut").running)


async def test_a_sync_job_that_returns_a_coroutine_is_a_failed_run() -> None:
    """A sync function whose call returns a coroutine ran none of its body: a
    failed run that says to declare the job async (and no 'never awaited' warning)."""
    scheduler = Scheduler()
    ran: list[str] = []

    async def body() -> None:
        ran.append("body")

    def sync_job() -> object:
        return body()

    scheduler.add_job(sync_job, Every(hours=1))
    result = await scheduler.run_now("sync_job")
    assert result.outcome == "failed"
    assert isinstance(result.error, TypeError)
    assert "returned coroutine" in str(result.error) and "async def" in str(result.error)
    assert ran == []


@pytest.mark.parametrize("kind", ["async generator", "generator"])
def test_a_generator_function_is_refused_at_declaration(kind: str) -> None:
    """A generator function's body never runs when called: refused at once."""

    async def agen() -> object:
        yield 1

    def gen() -> object:
        yield 1

    with pytest.raises(ConfigurationError, match=r"generator function.*return instead of yield"):
        Scheduler().every(hours=1)(agen if kind == "async generator" else gen)


async def test_shutdown_ends_even_when_a_job_ignores_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job that swallows one cancellation meets another at its next await; one that
    swallows them all is named, and the lifespan returns after a short grace."""
    scheduler = virtual_scheduler(shutdown_timeout=2)
    swallowed: list[str] = []

    @scheduler.every(minutes=1)
    async def swallows_once() -> None:
        try:
            await anyio.sleep(HOUR)
        except asyncio.CancelledError:
            swallowed.append("once")
        await anyio.sleep(HOUR)  # cancelled again here

    lifespan_returned = False

    @scheduler.every(minutes=1)
    async def swallows_all() -> None:
        while not lifespan_returned:  # (so that the test's own event loop can close)
            try:
                await anyio.sleep(HOUR)
            except asyncio.CancelledError:
                swallowed.append("all")

    with caplog.at_level(logging.INFO, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(61)
            stopping = anyio.current_time()
    lifespan_returned = True
    took = anyio.current_time() - stopping
    assert 2 < took < 2 + 5 + 1  # the deadline, then the grace
    assert scheduler.job_status("swallows_once").last_outcome == "cancelled"
    [ignored] = [r.getMessage() for r in caplog.records if "ignored cancellation" in r.getMessage()]
    assert "'swallows_all'" in ignored and "'swallows_once'" not in ignored
    assert "once" in swallowed and "all" in swallowed


@pytest.mark.skipif(sys.platform == "win32", reason="threads and signals")
def test_sync_job_thread_is_not_two_threads_after_its_run_was_cut() -> None:
    """After run_now is cut from outside, the job's thread still counts as running:
    a second run_now is refused until the thread returns."""
    from fastapi_jobs import JobRunningError

    scheduler = Scheduler()
    started, release = threading.Event(), threading.Event()

    @scheduler.every(hours=1)
    def blocking() -> None:
        started.set()
        release.wait(10)

    async def main() -> None:
        # Cut once the thread runs the job: cut before that, the thread never
        # starts (a loaded machine); see the next test.
        async with anyio.create_task_group() as run:
            run.start_soon(scheduler.run_now, "blocking")
            assert await anyio.to_thread.run_sync(started.wait, 10)
            run.cancel_scope.cancel()
        assert scheduler.job_status("blocking").running is True
        with pytest.raises(JobRunningError):
            await scheduler.run_now("blocking")
        release.set()
        deadline = time.monotonic() + 10
        while scheduler.job_status("blocking").running and time.monotonic() < deadline:  # noqa: ASYNC110 - a thread sets what it polls
            await anyio.sleep(0.01)
        assert (await scheduler.run_now("blocking")).ok

    anyio.run(main)


@pytest.mark.skipif(sys.platform == "win32", reason="threads and signals")
def test_a_sync_run_cut_before_its_thread_starts_leaves_the_job_free() -> None:
    """A sync job's run cut while it waits for a worker thread (every one taken)
    never runs, and does not leave the job "running": the next run_now runs it."""
    scheduler = Scheduler()
    calls: list[str] = []

    @scheduler.every(hours=1)
    def quick() -> None:
        calls.append("quick")

    async def main() -> None:
        workers = anyio.to_thread.current_default_thread_limiter()
        workers.total_tokens = 1  # this loop's own limiter
        release = threading.Event()

        async def hold_the_one_worker() -> None:
            await anyio.to_thread.run_sync(release.wait)

        async with anyio.create_task_group() as others:
            others.start_soon(hold_the_one_worker)
            await poll(lambda: workers.borrowed_tokens == 1)
            with anyio.move_on_after(0.05):
                await scheduler.run_now("quick")  # waits for a worker, and is cut
            release.set()
        assert calls == []
        assert scheduler.job_status("quick").running is False
        assert (await scheduler.run_now("quick")).ok

    anyio.run(main)


@pytest.mark.skipif(sys.platform == "win32", reason="threads and signals")
def test_a_sync_run_that_times_out_waiting_for_a_worker_thread_did_not_start() -> None:
    """A sync job's timeout passes while every worker thread is taken: the run is
    timed out, said to have never started, and does not leave the job "running"
    waiting for a thread that will never come."""
    scheduler = Scheduler()
    calls: list[str] = []

    @scheduler.every(hours=1, timeout=0.05)
    def quick() -> None:
        calls.append("quick")

    async def main() -> None:
        workers = anyio.to_thread.current_default_thread_limiter()
        workers.total_tokens = 1  # this loop's own limiter
        release = threading.Event()

        async def hold_the_one_worker() -> None:
            await anyio.to_thread.run_sync(release.wait)

        async with anyio.create_task_group() as others:
            others.start_soon(hold_the_one_worker)
            await poll(lambda: workers.borrowed_tokens == 1)
            with anyio.fail_after(5):
                result = await scheduler.run_now("quick")
            release.set()
        assert result.outcome == "timed_out" and "did not start" in str(result.error)
        assert calls == []
        assert scheduler.job_status("quick").running is False
        assert (await scheduler.run_now("quick")).ok

    anyio.run(main)


@pytest.mark.looptime(False)  # threads run in real time: so does this test
async def test_shutdown_names_the_threads_it_leaves_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sync job's thread outlives the shutdown deadline: shutdown names it, and the
    job is still shown running until the thread returns."""
    scheduler = Scheduler(shutdown_timeout=0.05)
    started, release = threading.Event(), threading.Event()

    @scheduler.every(seconds=0.1)
    def stuck_in_io() -> None:
        started.set()
        release.wait(10)

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.to_thread.run_sync(started.wait)
    assert scheduler.job_status("stuck_in_io").running is True
    release.set()
    [left] = [r.getMessage() for r in caplog.records if "cannot be interrupted" in r.getMessage()]
    assert "'stuck_in_io'" in left and "exits when they return" in left
