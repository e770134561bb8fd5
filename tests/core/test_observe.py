"""Run hooks on virtual time: what observers are told, in which order, and that
an observer's failure or slowness never reaches the jobs."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import anyio
import pytest

from fastapi_jobs import ConfigurationError, Every, JobContext
from fastapi_jobs.observers import LeaseLost, Observer, RunFinished, RunStarted, TickSkipped
from fastapi_jobs.testing import MemoryStore

from ..conftest import HOUR, START, virtual_scheduler

pytestmark = pytest.mark.looptime


class Recorder(Observer):
    """Every event, as told (plain methods: called in the job's task)."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def run_started(self, event: RunStarted) -> None:
        self.events.append(event)

    def run_finished(self, event: RunFinished) -> None:
        self.events.append(event)

    def tick_skipped(self, event: TickSkipped) -> None:
        self.events.append(event)

    def lease_lost(self, event: LeaseLost) -> None:
        self.events.append(event)


async def test_an_observer_is_told_each_attempt_of_a_run_with_its_outcome() -> None:
    recorder = Recorder()
    scheduler = virtual_scheduler(observers=[recorder])
    calls: list[int] = []

    async def flaky(ctx: JobContext) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("smtp refused")

    scheduler.add_job(flaky, Every(hours=1), retries=1, retry_backoff=10)
    async with scheduler.running():
        await anyio.sleep(HOUR + 60)
    started, failed, restarted, finished = recorder.events
    tick = START + timedelta(hours=1)
    assert isinstance(started, RunStarted) and isinstance(restarted, RunStarted)
    assert (started.job, started.tick_at, started.attempt, started.manual) == (
        "flaky",
        tick,
        1,
        False,
    )
    assert started.instance == scheduler.instance.id and started.fence is None
    assert isinstance(failed, RunFinished) and isinstance(finished, RunFinished)
    assert (failed.outcome, failed.attempt, type(failed.error)) == ("failed", 1, ConnectionError)
    assert (restarted.attempt, finished.attempt, finished.outcome) == (2, 2, "ok")
    assert finished.error is None and finished.tick == tick.timestamp()
    assert 5 <= (restarted.started_at - started.started_at).total_seconds() <= 10


async def test_skipped_ticks_are_told_with_their_reason() -> None:
    recorder = Recorder()
    scheduler = virtual_scheduler()
    scheduler.add_observer(recorder)  # after the jobs too

    @scheduler.every(hours=1)
    async def slow() -> None:
        await anyio.sleep(1.5 * HOUR)

    @scheduler.every(hours=1, paused=True)
    async def waiting() -> None: ...

    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 1)
    skips = [
        (e.job, e.reason, e.tick_at, e.ticks) for e in recorder.events if isinstance(e, TickSkipped)
    ]
    assert ("waiting", "paused", START + timedelta(hours=1), 1) in skips
    assert ("waiting", "paused", START + timedelta(hours=2), 1) in skips
    assert ("slow", "overlap", START + timedelta(hours=2), 1) in skips


class Unreachable(MemoryStore):
    """A memory store whose every claim fails, as a database that is down."""

    async def claim(self, *args: Any, **kwargs: Any) -> dict[str, int | Exception]:
        raise ConnectionError("the database is down")


async def test_a_tick_skipped_as_the_store_is_unreachable_is_told_with_its_tick() -> None:
    """A tick whose claim cannot reach the store is told skipped as
    store_unavailable, with the tick."""
    recorder = Recorder()
    scheduler = virtual_scheduler(store=Unreachable(), observers=[recorder])

    @scheduler.every(hours=1)
    async def job() -> None: ...

    async with scheduler.running():
        await anyio.sleep(HOUR + 1)
    skips = [(e.job, e.reason, e.tick_at) for e in recorder.events if isinstance(e, TickSkipped)]
    assert skips == [("job", "store_unavailable", START + timedelta(hours=1))]


class Refusing(MemoryStore):
    """A memory store that refuses each job's claim with an error of its own,
    as a database refuses a value it cannot store."""

    async def claim(self, wanted: Any, **kwargs: Any) -> dict[str, int | Exception]:
        return {job: ValueError("a tick it cannot store") for job, _ in wanted}


async def test_a_claim_the_store_refuses_skips_the_tick_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claim the store answers with an error is a tick skipped as
    store_unavailable, told with its tick, and logged with the job and the error."""
    recorder = Recorder()
    scheduler = virtual_scheduler(store=Refusing(), observers=[recorder])

    @scheduler.every(hours=1)
    async def job() -> None: ...

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(HOUR + 1)
    skips = [(e.job, e.reason, e.tick_at) for e in recorder.events if isinstance(e, TickSkipped)]
    assert skips == [("job", "store_unavailable", START + timedelta(hours=1))]
    assert scheduler.job_status("job").skipped == {"store_unavailable": 1}
    [record] = [r for r in caplog.records if "refused its claim" in r.getMessage()]
    assert record.getMessage() == (
        "job 'job': the store refused its claim, tick skipped: ValueError('a tick it cannot store')"
    )
    assert record.job == "job"  # type: ignore[attr-defined]


async def test_async_observers_get_the_events_in_order_without_slowing_the_jobs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told: list[tuple[str, str]] = []
    ran: list[float] = []

    class Webhook:
        async def run_started(self, event: RunStarted) -> None:
            await anyio.sleep(30)  # a slow endpoint
            told.append(("start", event.job))

        async def run_finished(self, event: RunFinished) -> None:
            told.append((event.outcome, event.job))

    scheduler = virtual_scheduler(observers=[Webhook()])

    @scheduler.every(minutes=1)
    async def tick(ctx: JobContext) -> None:
        ran.append((ctx.tick - START).total_seconds())

    async with scheduler.running():
        await anyio.sleep(3 * 60 + 1)
    assert ran == [60, 120, 180]  # on time, though each start takes 30 s to be told
    # In order. The third run's start (told from 3:00, for 30 s) was still being
    # told when the app stopped: shutdown gives observers 5 s, then logs what is left.
    assert told == [("start", "tick"), ("ok", "tick")] * 2
    assert "shutdown: 2 observer event(s) not delivered in 5s" in caplog.text


async def test_an_observer_that_raises_is_logged_and_hurts_no_job_nor_other_observer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()

    class Broken:
        def run_started(self, event: RunStarted) -> None:
            raise ValueError("observer bug")

        def run_finished(self, event: RunFinished) -> None:
            raise SystemExit(3)

        async def tick_skipped(self, event: TickSkipped) -> None:
            raise RuntimeError("async observer bug")

    scheduler = virtual_scheduler(observers=[Broken(), recorder])

    @scheduler.every(hours=1)
    async def digest() -> None:
        await anyio.sleep(60)

    @scheduler.every(hours=1, paused=True)
    async def waiting() -> None: ...

    with caplog.at_level(logging.WARNING):
        async with scheduler.running():
            await anyio.sleep(2 * HOUR + 61)
    status = scheduler.job_status("digest")
    assert status.last_outcome == "ok" and status.failures == 0 and status.runs == 2
    kinds = [type(e).__name__ for e in recorder.events if getattr(e, "job", "") == "digest"]
    assert kinds == ["RunStarted", "RunFinished"] * 2
    assert "observer Broken.run_started raised ValueError('observer bug')" in caplog.text
    assert "observer Broken.run_finished raised SystemExit(3)" in caplog.text
    assert "observer Broken.tick_skipped raised RuntimeError('async observer bug')" in caplog.text


async def test_a_plain_method_that_returns_a_coroutine_is_told_to_be_async(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Sloppy:
        async def _send(self, event: RunStarted) -> None: ...

        def run_started(self, event: RunStarted) -> object:
            return self._send(event)  # a coroutine nobody awaits

    scheduler = virtual_scheduler(observers=[Sloppy()])

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    with caplog.at_level(logging.WARNING):
        async with scheduler.running():
            await anyio.sleep(HOUR + 1)
    assert scheduler.job_status("digest").last_outcome == "ok"
    assert "Sloppy.run_started raised TypeError" in caplog.text
    assert "declare the method `async def`" in caplog.text


def test_an_object_with_no_hook_is_not_an_observer() -> None:
    scheduler = virtual_scheduler()
    with pytest.raises(ConfigurationError, match="run_started, run_finished"):
        scheduler.add_observer(object())
    with pytest.raises(ConfigurationError, match="not an observer"):
        scheduler.add_observer(Observer())  # the base class alone hooks nothing
