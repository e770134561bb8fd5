"""The scheduler runs on trio too (anyio's other backend): its loops are then
anyio tasks, each in its own cancel scope."""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest
import trio.testing

from fastapi_jobs import JobContext, Scheduler, StoreError
from fastapi_jobs.stores import SQLAlchemyStore

from ..observability import test_metrics, test_tracing
from ..stores import test_memory_store
from ..support.waiting import poll
from ..web import test_router
from . import (
    test_clock_steps,
    test_dispatcher,
    test_job_faults,
    test_lifespan,
    test_loop,
    test_observe,
    test_operate,
    test_run_now,
)


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


# -- the core's tests, again on trio ---------------------------------------------
#
# Each async test of these modules (lifecycle, job faults and timeouts,
# shutdown, the loop, run_now, trigger/pause/resume, retries) is collected here
# a second time and run by anyio on trio: the same assertions, the other
# backend. Where looptime drives asyncio's clock, trio's own virtual clock
# does (``MockClock`` jumping to the next deadline whenever every task waits);
# ``looptime(False)`` tests run in real time here too. Tests that need the
# store (SQLAlchemy's async engine is asyncio's) or reach for asyncio itself are
# left out, each with why.

_CORE = (
    test_lifespan,
    test_loop,
    test_job_faults,
    test_run_now,
    test_operate,
    test_dispatcher,
    test_clock_steps,
    test_memory_store,
    test_observe,
    test_tracing,
    test_metrics,
    test_router,
)
_ASYNCIO_ONLY = {
    "job_faults.test_a_job_raising_a_base_exception_fails_that_run_only[CancelledError]": (
        "raises asyncio.CancelledError itself"
    ),
    "job_faults.test_a_job_awaiting_a_future_cancelled_elsewhere_fails_and_ticks_on": (
        "awaits an asyncio future"
    ),
    "job_faults.test_shutdown_ends_even_when_a_job_ignores_cancellation": (
        "swallows asyncio.CancelledError: trio's cancellation cannot be swallowed"
    ),
    "dispatcher.test_a_burst_is_woken_in_slices_with_turns_of_the_loop_between": (
        "probes the turns of the loop with asyncio tasks"
    ),
    "dispatcher.test_hourly_jobs_have_no_task_before_their_first_tick": (
        "counts asyncio.all_tasks()"
    ),
    "clock_steps.test_with_a_store_an_offset_jump_wakes_the_timer": "a SQLite store",
    "clock_steps.test_without_a_store_ticks_follow_the_wall_clock": (
        "no margin past the watcher's wake-up, which comes at the instant its check "
        "does: asyncio runs the two in the order they slept, trio in a random one"
    ),
    "tracing.test_a_claimed_runs_span_has_its_fence": "a SQLite store",
    "metrics.test_cluster_figures_come_from_the_store_and_a_locked_database_gives_store_up_0": (
        "a SQLite store"
    ),
    "metrics.test_a_store_that_is_down_from_the_start_gives_store_up_0_not_a_failed_scrape": (
        "a SQLite store"
    ),
}
_NEEDS_ASYNCIO = ("postgres", "stepped_postgres", "database_url", "cluster_url")  # stores'


def _virtual(module: ModuleType, test: Callable[..., Any]) -> bool:
    in_module = getattr(module, "pytestmark", [])
    if not isinstance(in_module, list):
        in_module = [in_module]
    marks = [*in_module, *getattr(test, "pytestmark", [])]
    looptime = [mark for mark in marks if mark.name == "looptime"]
    return bool(looptime) and looptime[-1].args != (False,)


def _on_trio(test: Callable[..., Coroutine[Any, Any, None]], virtual: bool) -> Callable[..., None]:
    @functools.wraps(test)  # its name, its marks (parametrize) and its fixtures
    def on_trio(*args: Any, **kwargs: Any) -> None:
        options = {"clock": trio.testing.MockClock(autojump_threshold=0)} if virtual else {}
        anyio.run(functools.partial(test, *args, **kwargs), backend="trio", backend_options=options)

    return on_trio


def _marks(test: Callable[..., Any], key: str) -> list[pytest.Mark]:
    """The test's own marks, but looptime's (trio has its own clock) and the
    parameters that are asyncio's only."""
    marks = []
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "looptime":
            continue
        if mark.name == "parametrize" and "ids" in mark.kwargs:
            kept = [
                (value, id_)
                for value, id_ in zip(mark.args[1], mark.kwargs["ids"], strict=True)
                if f"{key}[{id_}]" not in _ASYNCIO_ONLY
            ]
            mark = pytest.mark.parametrize(
                mark.args[0], [value for value, _ in kept], ids=[id_ for _, id_ in kept]
            ).mark
        marks.append(mark)
    return marks


for _module in _CORE:
    _short = _module.__name__.rpartition(".")[2].removeprefix("test_")
    for _name, _test in vars(_module).items():
        if not _name.startswith("test_") or not inspect.iscoroutinefunction(_test):
            continue
        if f"{_short}.{_name}" in _ASYNCIO_ONLY:
            continue
        if any(p in _NEEDS_ASYNCIO for p in inspect.signature(_test).parameters):
            continue
        _variant = _on_trio(_test, _virtual(_module, _test))
        _variant.pytestmark = _marks(_test, f"{_short}.{_name}")  # type: ignore[attr-defined]
        globals()[f"test_{_short}__{_name.removeprefix('test_')}__on_trio"] = _variant
