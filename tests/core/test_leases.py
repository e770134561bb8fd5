"""Leases and their renewal: a run keeps its claim while it runs, a lease that
cannot be renewed cancels the run, and what a lost lease leaves behind. Real
time, short intervals (the database's clock decides leases)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sqlite3
import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from fastapi_jobs import Every, JobContext, JobRunningError, StoreError, tracing
from fastapi_jobs.metrics import instrument
from fastapi_jobs.observers import LeaseLost, Observer
from fastapi_jobs.testing import MemoryStore

from ..conftest import open_store, virtual_scheduler
from ..support.instances import engine_for, hold_lock, instance
from ..support.partition import Partition
from ..support.postgres import PostgresServer
from ..support.waiting import poll


async def test_a_run_longer_than_its_lease_keeps_it_by_renewal(database_url: str) -> None:
    """Three 2.5 s runs under a 1 s lease, in each of two instances, renew their
    leases (one keeper task per instance); no peer runs a job meanwhile: two runs of
    a job never overlap. (The lease must outlive pauses of this process, which hold
    up its renewals too.)"""
    runs: dict[str, list[tuple[str, int | None]]] = {f"long{k}": [] for k in range(3)}
    spans: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    async with engine_for(database_url) as engine, AsyncExitStack() as stack:
        for who in ("i0", "i1"):
            scheduler = instance(engine, lease=1.0, timeout=0.33, heartbeat=1)
            for name in runs:

                async def long(ctx: JobContext, who: str = who) -> None:
                    runs[ctx.name].append((who, ctx.fence))
                    started = time.monotonic()
                    try:
                        await anyio.sleep(2.5)
                    finally:
                        spans[ctx.name].append((started, time.monotonic()))

                scheduler.add_job(long, Every(seconds=0.1), name=name)
            await stack.enter_async_context(scheduler.running({"db": engine}))
        # Each job's first run, 2.5 leases long, ended and the next began.
        await poll(lambda: all(len(job_runs) >= 2 for job_runs in runs.values()))
    # The instances stop one after the other, so one may start a third run while
    # the other drains; and a claim whose answer came after the store's timeout is
    # released unrun (a gap in the fences). Each run has a newer claim than the
    # last, and two runs of a job never overlap.
    for name, job_runs in runs.items():
        fences = [fence or 0 for _, fence in job_runs]
        assert fences == sorted(set(fences)), fences
        ordered = sorted(spans[name])
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(ordered)), ordered
        first = ordered[0]
        assert first[1] - first[0] > 2.49, ordered  # ran its 2.5 s: renewals kept it


class Renewals(MemoryStore):
    """A memory store that notes each renewal: the job, and when (the loop's time)."""

    def __init__(self, seen: list[tuple[str, float]], **options: float) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.seen = seen

    async def renew(self, job: str, fence: int) -> bool:
        self.seen.append((job, anyio.current_time()))
        return await super().renew(job, fence)


@pytest.mark.looptime
async def test_only_runs_that_outlast_a_third_of_the_lease_renew_it() -> None:
    """Short runs end before their first renewal is due and send none; a run as long
    as 1.7 leases renews every third of the lease, from its claim. (Virtual time:
    the memory store's leases follow the scheduler's clock.)"""
    renewals: list[tuple[str, float]] = []
    began: list[float] = []
    scheduler = virtual_scheduler(store=Renewals(renewals, lease=1.2, timeout=0.39))

    @scheduler.every(seconds=0.1)
    async def short() -> None:
        pass

    @scheduler.every(days=36500, run_on_startup=True)
    async def long() -> None:
        began.append(anyio.current_time())
        await anyio.sleep(2.0)

    async with scheduler.running():
        await anyio.sleep(2.05)
    assert scheduler.job_status("long").runs == 1
    assert scheduler.job_status("long").last_outcome == "ok"
    assert scheduler.job_status("short").runs == 20
    assert [job for job, _ in renewals] == ["long"] * 4
    assert [round(at - began[0], 6) for _, at in renewals] == [0.4, 0.8, 1.2, 1.6]


class Renewing(MemoryStore):
    """A memory store whose renewals answer as ``answer`` says (raise, hang, or
    say the job is held elsewhere), each noted with when it was sent."""

    def __init__(self, answer: str, **options: float) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.answer = answer
        self.sent: list[float] = []

    async def renew(self, job: str, fence: int) -> bool:
        self.sent.append(anyio.current_time())
        if self.answer == "raise":
            raise ConnectionError("down")
        if self.answer == "hang":
            await anyio.sleep_forever()
        return False


class LeaseLosses(Observer):
    def __init__(self) -> None:
        self.lost: list[LeaseLost] = []

    def lease_lost(self, event: LeaseLost) -> None:
        self.lost.append(event)


async def _cut_by_the_lease(store: Renewing) -> tuple[list[float], float, str]:
    """A 2 s run under the store's 1.2 s lease: when its renewals were sent and
    when the run was cancelled, from its start, and why its lease was lost."""
    losses = LeaseLosses()
    scheduler = virtual_scheduler(store=store, observers=[losses])
    began: list[float] = []
    cut: list[float] = []

    @scheduler.every(days=36500, run_on_startup=True)
    async def long() -> None:
        began.append(anyio.current_time())
        try:
            await anyio.sleep(2.0)
        except anyio.get_cancelled_exc_class():
            cut.append(anyio.current_time())
            raise

    async with scheduler.running():
        await anyio.sleep(2.05)
    [lost] = losses.lost
    sent = [round(at - began[0], 6) for at in store.sent]
    return sent, round(cut[0] - began[0], 6), lost.reason


@pytest.mark.looptime
async def test_a_failing_renewal_is_retried_each_quarter_interval_until_the_lease_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A renewal that fails is logged and sent again a quarter of the renewal
    interval later, until the lease ends: then the run is cancelled, its lease
    lost for having run out."""
    store = Renewing("raise", lease=1.2, timeout=0.39)
    sent, cut, reason = await _cut_by_the_lease(store)
    assert sent == [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    assert (cut, reason) == (1.2, "its lease ran out before it could be renewed")
    failed = [r.getMessage() for r in caplog.records if "renewal failed" in r.getMessage()]
    assert failed == ["job 'long': lease renewal failed (ConnectionError('down')), retrying"] * 8


@pytest.mark.looptime
async def test_a_renewal_that_hangs_is_given_up_when_the_lease_ends() -> None:
    """A renewal that gets no answer waits at most the store's timeout, and never
    past the lease's end: the run is cancelled as the lease ends, not later."""
    store = Renewing("hang", lease=1.2, timeout=0.39)
    sent, cut, reason = await _cut_by_the_lease(store)
    assert sent == [0.4, 0.89]  # timed out at 0.79, sent again 0.1 later
    assert (cut, reason) == (1.2, "its lease ran out before it could be renewed")


@pytest.mark.looptime
async def test_a_renewal_refused_cancels_the_run_as_held_elsewhere() -> None:
    """A renewal the store refuses (another instance holds the job) cancels the
    run at once, its lease lost to that instance."""
    store = Renewing("refuse", lease=1.2, timeout=0.39)
    sent, cut, reason = await _cut_by_the_lease(store)
    assert (sent, cut, reason) == ([0.4], 0.4, "another instance claimed the job")


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_lease_that_cannot_be_renewed_cancels_the_run(
    postgres: PostgresServer, driver: str
) -> None:
    """The database goes away mid-run for longer than the lease: the run is cancelled
    and recorded as a lost lease, before a peer could take over."""
    url = postgres.url(postgres.create_database(), driver=driver)
    progress: list[str] = []
    lost: list[LeaseLost] = []
    async with engine_for(url) as engine:
        # The tables made and a connection open beforehand: the startup run's claim,
        # within its 0.3 s timeout, is then one statement, not a connection as well.
        async with open_store(engine):
            pass
        scheduler = instance(engine, lease=1.2, timeout=0.3)

        class Observing:
            def lease_lost(self, event: LeaseLost) -> None:
                lost.append(event)

        scheduler.add_observer(Observing())

        @scheduler.every(days=36500)  # triggered only
        async def long(ctx: JobContext) -> None:
            progress.append("start")
            await anyio.sleep(3)
            progress.append("end")

        async def started() -> bool:  # a claim may pass the 0.3 s timeout: ask again
            if not progress:
                with contextlib.suppress(StoreError, JobRunningError):
                    await scheduler.trigger("long")
            return bool(progress)

        async with scheduler.running({"db": engine}):
            await poll(started)  # mid-run
            await anyio.to_thread.run_sync(postgres.stop)
            await anyio.sleep(2.0)  # longer than the lease
            status = scheduler.job_status("long")
            await anyio.to_thread.run_sync(postgres.start)
    assert progress == ["start"]
    assert status.last_outcome == "cancelled"
    assert status.last_error is not None
    assert status.last_error.type == "LeaseLostError"
    assert "lease ran out" in status.last_error.message
    assert status.running is False
    assert [e.job for e in lost] == ["long"]  # observers are told
    assert "lease ran out" in lost[0].reason


async def test_a_lease_lost_to_a_locked_sqlite_file_cancels_the_run(tmp_path: Path) -> None:
    """Another client locks the SQLite file mid-run, for as long as it takes: the
    lease cannot be renewed, so the run is cancelled and recorded as a lost
    lease, and the observers are told, while the file is still locked (before
    any peer could have claimed the job)."""
    path = tmp_path / "jobs.sqlite3"
    progress: list[str] = []
    lost: list[LeaseLost] = []
    unlock = threading.Event()

    def lock() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        progress.append("locked")
        unlock.wait(30)
        conn.execute("COMMIT")
        conn.close()

    async with engine_for(f"sqlite+aiosqlite:///{path}") as engine:
        scheduler = instance(engine, lease=0.3, timeout=0.09)

        class Observing:
            def lease_lost(self, event: LeaseLost) -> None:
                lost.append(event)

        scheduler.add_observer(Observing())

        @scheduler.every(days=36500)  # triggered only
        async def long(ctx: JobContext) -> None:
            progress.append("start")
            await anyio.sleep(30)
            progress.append("end")

        async def started() -> bool:  # a claim may pass the 0.09 s timeout: ask again
            if not progress:
                with contextlib.suppress(StoreError, JobRunningError):
                    await scheduler.trigger("long")
            return bool(progress)

        async with scheduler.running({"db": engine}), anyio.create_task_group() as tg:
            await poll(started)
            tg.start_soon(anyio.to_thread.run_sync, lock)
            try:
                await poll(lambda: scheduler.job_status("long").last_outcome == "cancelled")
                status = scheduler.job_status("long")
                told = list(lost)
            finally:
                unlock.set()
    assert progress == ["start", "locked"]
    assert status.last_error is not None and status.last_error.type == "LeaseLostError"
    assert status.running is False
    assert [e.job for e in told] == ["long"]
    assert "lease" in told[0].reason


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_a_sync_job_is_told_its_lease_is_lost_in_a_partition(
    postgres: PostgresServer, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An instance cut off from PostgreSQL (a partition: bytes vanish, nothing
    closes) past the lease, mid-run of a sync job: the run is cancelled as a
    lost lease, the log says its thread cannot be stopped and still runs, and
    the thread, which looks at ctx.cancelled, sees why after the cut and returns
    (long before its own 15 s are up)."""
    database = postgres.create_database()
    steps: list[float] = []
    seen: list[tuple[str | None, float]] = []
    async with Partition(postgres.port).running() as link:
        url = f"postgresql+{driver}://postgres@127.0.0.1:{link.port}/{database}"
        async with engine_for(url) as engine:
            async with open_store(engine):  # the tables made, a connection pooled
                pass
            scheduler = instance(engine, lease=1.2, timeout=0.3)

            @scheduler.every(days=36500)  # triggered only
            def long(ctx: JobContext) -> None:
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    if ctx.cancelled:
                        seen.append((ctx.cancel_reason, time.monotonic()))
                        return
                    steps.append(time.monotonic())
                    time.sleep(0.02)

            async def started() -> bool:  # a claim may pass the 0.3 s timeout: ask again
                if not steps:
                    with contextlib.suppress(StoreError, JobRunningError):
                        await scheduler.trigger("long")
                return bool(steps)

            async with scheduler.running({"db": engine}):
                await poll(started)
                cut_at = time.monotonic()
                link.cut()
                await poll(lambda: bool(seen), within=10)
                status = scheduler.job_status("long")
                link.heal()
    [(reason, at)] = seen
    assert reason is not None and reason.startswith("lease lost"), reason
    assert cut_at < at  # told of the loss, which the cut made
    assert status.last_outcome == "cancelled"
    assert status.last_error is not None and status.last_error.type == "LeaseLostError"
    assert "its thread cannot be stopped and is still running" in caplog.text


async def test_after_a_lost_lease_the_job_runs_on_and_tells_its_own_cancel_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run whose lease is lost (the database locked past the lease) is cancelled:
    one run, one outcome (cancelled, LeaseLostError), counted once and logged once,
    and the metrics read those counts (none goes below zero). The job's task lives
    on: later ticks run, and a later run whose own code raises CancelledError is that
    run's failure, not a cancellation of the job. The run's span has the loss as an
    event (told before the span ends)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    runs: list[str] = []
    registry = CollectorRegistry()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with engine_for(url) as engine:
        scheduler = instance(engine, lease=0.6, timeout=0.15)
        instrument(scheduler, registry)
        tracing.instrument(scheduler, tracer_provider=tracer_provider)

        started = anyio.Event()

        @scheduler.every(seconds=0.5)
        async def job(ctx: JobContext) -> None:
            runs.append("start")
            started.set()
            if len(runs) == 1:
                await anyio.sleep(3)  # the lock comes while this one runs
            elif len(runs) >= 3:
                raise asyncio.CancelledError  # the job's own bug
            runs.append("end")

        with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
            async with scheduler.running({"db": engine}):
                await started.wait()
                await hold_lock(url, engine, 1.2)  # longer than the lease
                lost = scheduler.job_status("job")
                lost_runs = registry.get_sample_value(
                    "fastapi_jobs_runs_total", {"job_name": "job", "outcome": "cancelled"}
                )
                await poll(lambda: scheduler.job_status("job").runs >= 4)
                later = scheduler.job_status("job")
                counts = {
                    outcome: registry.get_sample_value(
                        "fastapi_jobs_runs_total", {"job_name": "job", "outcome": outcome}
                    )
                    for outcome in ("ok", "failed", "timed_out", "cancelled")
                }
    assert runs[:2] == ["start", "start"]  # the first run never ended
    assert lost.last_outcome == "cancelled" and lost.failures == 0 and lost_runs == 1
    assert lost.last_error is not None and lost.last_error.type == "LeaseLostError"
    lines = [r.getMessage() for r in caplog.records if "'job'" in r.getMessage()]
    assert len([line for line in lines if "lost its lease" in line]) == 1
    assert not [line for line in lines if "was cancelled" in line]  # not a second time
    # The second run was ok; the lost lease is the one cancelled run; each run from
    # the third on is a failure: none was taken for a cancellation from outside.
    assert later.failures == later.runs - 2
    ended = later.runs - int(later.running)
    assert counts == {"ok": 1, "failed": later.failures, "timed_out": 0, "cancelled": 1}
    assert sum(counts.values()) == ended  # type: ignore[arg-type]
    assert later.last_outcome == "failed"
    assert later.last_error is not None and later.last_error.type == "CancelledError"
    first = exporter.get_finished_spans()[0]
    assert first.attributes is not None and first.attributes["fastapi_jobs.outcome"] == "cancelled"
    assert [event.name for event in first.events] == ["fastapi_jobs.lease_lost"]


async def test_a_sync_job_past_its_timeout_keeps_its_claim_until_the_thread_returns(
    tmp_path: Path,
) -> None:
    """Two instances; a sync job whose thread runs 1.5 s past a 0.1 s timeout under a
    1.2 s lease: the lease is renewed while the thread runs, so no instance starts
    the job beside it (or before it returned); once it returns, the job runs again."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    lock = threading.Lock()
    active, most = 0, 0
    calls: list[float] = []  # when each call began
    returned: list[float] = []  # when the long one returned

    def blocking() -> None:
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
            long = not calls
            calls.append(time.monotonic())
        time.sleep(1.5 if long else 0.01)
        with lock:
            active -= 1
            if long:
                returned.append(time.monotonic())

    async with engine_for(url) as engine, AsyncExitStack() as stack:
        schedulers = []
        for _ in range(2):
            scheduler = instance(engine, lease=1.2, timeout=0.3)
            scheduler.add_job(blocking, Every(seconds=0.1), name="blocking", timeout=0.1)
            await stack.enter_async_context(scheduler.running({"db": engine}))
            schedulers.append(scheduler)
        await poll(lambda: len(returned) == 1 and len(calls) >= 2)  # it ran again after
        failures = sum(s.job_status("blocking").failures for s in schedulers)
    assert most == 1
    assert all(began > returned[0] for began in calls[1:])  # none while the thread ran
    assert failures >= 1  # the long one's timeout, recorded once its thread returned
