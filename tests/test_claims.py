"""The scheduler with a store, in one process: several schedulers stand for
several instances sharing one real database. Real time, short intervals
(the database's clock decides leases, so virtual time cannot drive them)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fastapi_jobs import (
    Ended,
    Every,
    JobContext,
    JobRunningError,
    LeaseLost,
    Scheduler,
    StoreError,
    TickSkipped,
    tracing,
)
from fastapi_jobs._heartbeat import OffsetEstimate
from fastapi_jobs.metrics import instrument
from fastapi_jobs.stores import SQLAlchemyStore

from .conftest import claim1, open_store, poll, release1
from .postgres import PostgresServer


@asynccontextmanager
async def engine_for(url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the test's database with the store's tables made and (on
    PostgreSQL, where the store uses the app's pool) a connection in its pool: a
    store's first claim is then one statement, within the short timeouts these
    tests use, even on a loaded machine. A database that cannot be reached is
    left as it is (some tests start that way)."""
    engine = create_async_engine(url)
    try:
        with contextlib.suppress(sa.exc.DBAPIError, OSError):
            async with engine.begin() as conn:
                await conn.run_sync(SQLAlchemyStore(engine).tables.metadata.create_all)
        yield engine
    finally:
        await engine.dispose()


def instance(engine: AsyncEngine, **store_options: object) -> Scheduler:
    store = SQLAlchemyStore(lambda state: state["db"], **store_options)  # type: ignore[arg-type]
    return Scheduler(store=store, shutdown_timeout=5)


def ticking(engine: AsyncEngine, ticks: list[datetime], **store_options: object) -> Scheduler:
    """An instance with one job every 100 ms that notes the ticks it runs."""
    scheduler = instance(engine, **store_options)

    @scheduler.every(seconds=0.1)
    async def job(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    return scheduler


async def test_each_tick_runs_once_across_instances(database_url: str) -> None:
    """Three instances, two jobs at 100 ms: every (job, tick) runs exactly once."""
    runs: list[tuple[str, datetime, int | None, str]] = []
    async with engine_for(database_url) as engine, AsyncExitStack() as stack:
        for i in range(3):
            scheduler = instance(engine)
            for name in ("a", "b"):

                async def job(ctx: JobContext, who: str = f"i{i}") -> None:
                    runs.append((ctx.name, ctx.tick, ctx.fence, who))

                scheduler.add_job(job, Every(seconds=0.1), name=name)
            await stack.enter_async_context(scheduler.running({"db": engine}))
            await anyio.sleep(0.05 * i)  # instances start at different moments
        await anyio.sleep(1.2)
    for name in ("a", "b"):
        ticks = [tick for job, tick, _, _ in runs if job == name]
        fences = [fence for job, _, fence, _ in runs if job == name]
        assert len(ticks) >= 8
        assert len(ticks) == len(set(ticks)), "a tick ran twice"
        assert ticks == sorted(ticks)
        assert fences == list(range(1, len(fences) + 1))  # one claim per run, no gaps


async def test_every_instance_jobs_run_everywhere_and_touch_no_claims(database_url: str) -> None:
    """every_instance=True: each instance runs each tick, and no claim row is written."""
    counts = {"i0": 0, "i1": 0}
    async with engine_for(database_url) as engine, AsyncExitStack() as stack:
        for who in counts:
            scheduler = instance(engine)

            @scheduler.every(seconds=0.1, every_instance=True)
            async def cache_refresh(ctx: JobContext, who: str = who) -> None:
                assert ctx.fence is None
                counts[who] += 1

            await stack.enter_async_context(scheduler.running({"db": engine}))
        await poll(lambda: min(counts.values()) >= 4)
        async with engine.connect() as conn:
            claimed = (
                await conn.execute(sa.text("SELECT count(*) FROM fastapi_jobs_claims"))
            ).scalar()
    assert claimed == 0


async def test_a_run_longer_than_its_lease_keeps_it_by_renewal(database_url: str) -> None:
    """Three 2.5 s runs under a 1 s lease, in each of two instances, renew their
    leases (one keeper task per instance); no peer runs a job meanwhile. (The lease
    must outlive pauses of this process, which hold up its renewals too.)"""
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
        await anyio.sleep(2.0)  # two leases long
        assert all(len(job_runs) == 1 for job_runs in runs.values())  # first runs hold on
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


async def test_only_runs_that_outlast_a_third_of_the_lease_renew_it(
    database_url: str, on_statement: Callable[[Callable[..., None]], None]
) -> None:
    """Short runs end before their first renewal is due and send none; a run as long
    as 1.7 leases renews about every third of the lease. (A lease of 1.2 s: the run
    must outlive pauses of this process, which stop its renewals too.)"""
    renewals: list[str] = []

    def count(conn: object, cursor: object, statement: str, params: object, *args: object) -> None:
        if statement.lstrip().startswith("UPDATE fastapi_jobs_claims SET lease_until="):
            renewals.append(str(params))

    async with engine_for(database_url) as engine:
        on_statement(count)
        scheduler = instance(engine, lease=1.2, timeout=0.39)

        @scheduler.every(seconds=0.1)
        async def short() -> None:
            pass

        # Runs once, at startup: no tick of its own comes due during the test (an
        # every-minute job ran twice whenever a minute began in the window, ~2%).
        @scheduler.every(days=36500, run_on_startup=True)
        async def long() -> None:
            await anyio.sleep(2.0)

        async with scheduler.running({"db": engine}):
            await anyio.sleep(2.3)
    assert scheduler.job_status("long").runs == 1
    assert scheduler.job_status("short").runs >= 8
    assert scheduler.job_status("long").last_outcome == "ok"
    assert all("short" not in params for params in renewals)
    assert 3 <= len(renewals) <= 6  # due at 0.4, 0.8, 1.2, 1.6 s into the run


async def serve_until(scheduler: Scheduler, engine: AsyncEngine, stop: anyio.Event) -> None:
    """An instance: runs until `stop` is set, then stops gracefully."""
    async with scheduler.running({"db": engine}):
        await stop.wait()


async def test_graceful_stop_releases_so_a_peer_takes_the_next_tick_at_once(
    database_url: str,
) -> None:
    """Stopping the holder mid-run releases the claim; the peer runs the next tick
    without waiting for the 30 s lease."""
    runs: list[str] = []
    first_run = anyio.Event()
    async with engine_for(database_url) as engine:
        holder, peer = instance(engine), instance(engine)
        holder.shutdown_timeout = 0.1
        for who, scheduler in (("holder", holder), ("peer", peer)):

            @scheduler.every(seconds=0.2)
            async def report(ctx: JobContext, who: str = who) -> None:
                runs.append(who)
                first_run.set()
                await anyio.sleep(10 if who == "holder" else 0)

        stop_holder, stop_peer = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_until, holder, engine, stop_holder)
            await first_run.wait()  # the holder claimed a tick and runs for 10 s
            tg.start_soon(serve_until, peer, engine, stop_peer)
            await poll(lambda: peer.job_status("report").skipped.get("claimed_elsewhere", 0) >= 2)
            assert runs == ["holder"]  # the peer cannot claim while the lease is held
            stop_holder.set()
            await poll(lambda: "peer" in runs, within=10)  # well within the 30 s lease
            stop_peer.set()
    assert runs[0] == "holder"
    assert holder.job_status("report").last_outcome == "cancelled"


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_database_down_skips_ticks_and_recovers_by_itself(
    postgres: PostgresServer, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL stopped: ticks are skipped, logged and counted; once it is back,
    runs resume with no help, and no tick ran twice."""
    url = postgres.url(postgres.create_database(), driver=driver)
    ticks: list[datetime] = []
    async with engine_for(url) as engine:
        scheduler = ticking(engine, ticks, lease=3, timeout=0.5)
        async with scheduler.running({"db": engine}):
            await poll(lambda: len(ticks) >= 2)
            await anyio.to_thread.run_sync(postgres.stop)  # ticks run until it is down
            before = len(ticks)
            await poll(lambda: scheduler.job_status("job").skipped.get("store_unavailable", 0) >= 2)
            during = len(ticks)
            await anyio.to_thread.run_sync(postgres.start)
            await poll(lambda: len(ticks) - during >= 3)  # recovered by itself
    assert during - before <= 1  # at most the run claimed just before the stop
    assert len(ticks) == len(set(ticks))
    assert "store unreachable, tick skipped" in caplog.text


async def test_a_release_the_database_missed_is_sent_again_when_it_is_back(
    postgres: PostgresServer,
) -> None:
    """PostgreSQL is down when a run ends, so its release fails: once the database
    is back, the release goes first and the job runs on its next ticks, instead of
    waiting out its own 30 s lease."""
    url = postgres.url(postgres.create_database(), driver="asyncpg")
    started, gate = anyio.Event(), anyio.Event()
    ticks: list[datetime] = []
    async with engine_for(url) as engine:
        scheduler = instance(engine, lease=30, timeout=0.5)

        @scheduler.every(seconds=0.1)
        async def job(ctx: JobContext) -> None:
            ticks.append(ctx.tick)
            started.set()
            await gate.wait()

        async with scheduler.running({"db": engine}):
            await started.wait()
            await anyio.to_thread.run_sync(postgres.stop)
            gate.set()  # the run ends while the database is down
            await anyio.sleep(0.2)
            await anyio.to_thread.run_sync(postgres.start)
            # Well before the first run's 30 s lease would have freed the job.
            await poll(lambda: len(ticks) >= 1 + 3, within=15)
    assert len(ticks) == len(set(ticks))


class Seeing:
    """An observer that keeps every skip."""

    def __init__(self, seen: list[TickSkipped]) -> None:
        self.seen = seen

    def tick_skipped(self, event: TickSkipped) -> None:
        self.seen.append(event)


async def first_runs(
    engine: AsyncEngine,
    store: SQLAlchemyStore,
    n: int,
    every: float,
    *,
    catch_up: float | None = None,
    run_seconds: float = 0.0,
    seen: list[TickSkipped] | None = None,
) -> tuple[list[tuple[float, float]], dict[str, int]]:
    """Run one job every ``every`` s on ``store`` (each run ``run_seconds`` long)
    until its ``n``th run starts: each run's tick and start, and the job's skips
    until then (a tick that comes while the scheduler stops is not one of them);
    each skip as it came, in ``seen``, for a failure to show."""
    scheduler = Scheduler(store=store, shutdown_timeout=5)
    if seen is not None:
        scheduler.add_observer(Seeing(seen))
    runs: list[tuple[float, float]] = []
    skipped: dict[str, int] = {}
    nth = anyio.Event()

    @scheduler.every(seconds=every, catch_up=catch_up)
    async def job(ctx: JobContext) -> None:
        runs.append((ctx.tick.timestamp(), time.time()))
        if len(runs) == n:
            skipped.update(scheduler.job_status("job").skipped)
            nth.set()
        await anyio.sleep(run_seconds)

    async with scheduler.running({"db": engine}):
        with anyio.fail_after(10):
            await nth.wait()
    return runs, skipped


class SlowRelease(SQLAlchemyStore):
    """A store whose releases take 0.45 s to reach the database (a lock, a slow link)."""

    async def release(self, ended: Sequence[Ended]) -> dict[str, Exception]:
        await anyio.sleep(0.45)
        return await super().release(ended)


@pytest.mark.parametrize("database_url", ["sqlite", "asyncpg"], indirect=True)
async def test_a_run_that_ends_just_before_its_next_tick_does_not_lose_that_tick(
    database_url: str,
) -> None:
    """Each run (every 0.5 s) takes 0.1 s, and its release reaches the database
    0.05 s after the next tick is due: the next claim goes after this instance's
    own release instead of being refused by it, so no tick is lost."""
    async with engine_for(database_url) as engine:
        store = SlowRelease(lambda state: state["db"], timeout=2)
        seen: list[TickSkipped] = []
        runs, skipped = await first_runs(engine, store, 4, 0.5, run_seconds=0.1, seen=seen)
    ticks = [tick for tick, _ in runs]
    assert "claimed_elsewhere" not in skipped  # refused by its own release: the bug
    # Each tick ran; or was counted as skipped: missed, if this process stood still
    # past one (a pause in CI), or overlap, if a claim waiting for the release
    # before it still waited when the next tick came (a loaded machine: the run
    # and its release take 0.55 s of each 0.5). Only the skips of ticks up to the
    # last run count: the last run may start after the next tick was dispatched.
    counted = sum(e.ticks for e in seen if e.tick is not None and e.tick <= ticks[-1])
    assert accounted(ticks[0] - 0.5, ticks, {"any": counted}, every=0.5), (
        runs,
        seen,
    )


def test_the_clock_offset_keeps_to_the_quickest_recent_beat() -> None:
    """Each beat bounds the database's offset by its round trip; a slow beat whose
    database read its clock late (after a lock wait) does not drag the estimate off,
    a clock stepped by 3 s is followed at once, and so is an hour's drift."""
    estimate = OffsetEstimate()
    assert estimate.add(0.0, 100.0005, 0.001) == pytest.approx(100.0, abs=0.002)
    # 100 ms round trip; the database read its clock 90 ms in (its midpoint: +40 ms).
    assert estimate.add(1.0, 101.09, 1.1) == pytest.approx(100.0, abs=0.002)
    # The local clock stepped back 3 s: the bounds no longer meet.
    assert estimate.add(-1.0, 101.0005, -0.999) == pytest.approx(102.0, abs=0.002)
    # An hour on, the clocks drifted 0.1 s apart (28 ppm): the widened bounds meet it.
    assert estimate.add(3599.0, 3701.1005, 3599.001) == pytest.approx(102.1, abs=0.002)


class SlowFirstBeat(SQLAlchemyStore):
    """A store whose first heartbeat waits 0.3 s before the database reads its
    clock, as a first connection (or a lock) makes it do."""

    slow = True

    async def beat(self) -> float:
        if self.slow:
            self.slow = False
            await anyio.sleep(0.3)
        return await super().beat()


async def test_a_slow_first_beat_does_not_make_the_first_ticks_early(tmp_path: Path) -> None:
    """The first beat's round trip is 0.3 s, all of it before the database read its
    clock: its middle would put the clock 0.15 s ahead until the next beat (a
    minute away). A second beat at start keeps the first ticks on time."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    async with engine_for(url) as engine:
        store = SlowFirstBeat(lambda state: state["db"], heartbeat=60)
        runs, _ = await first_runs(engine, store, 3, 0.1)
    late = [started - tick for tick, started in runs]  # each run's start, after its tick
    assert min(late) > -0.01, late


async def test_sqlite_unreachable_file_skips_ticks_and_recovers(tmp_path: Path) -> None:
    """A SQLite file that cannot be opened: ticks are skipped until it can."""
    folder = tmp_path / "not-yet"
    ticks: list[datetime] = []
    async with engine_for(f"sqlite+aiosqlite:///{folder / 'jobs.sqlite3'}") as engine:
        scheduler = ticking(engine, ticks, lease=3, timeout=0.5)
        async with scheduler.running({"db": engine}):
            await poll(lambda: scheduler.job_status("job").skipped.get("store_unavailable", 0) >= 3)
            assert ticks == []
            await anyio.Path(folder).mkdir()
            await poll(lambda: len(ticks) >= 3)  # a wide margin: the tables are made first


async def hold_lock(url: str, engine: AsyncEngine, seconds: float) -> None:
    """Another client locks the claims for ``seconds``: store statements block."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1]

        def hold() -> None:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            conn.execute("COMMIT")
            conn.close()

        await anyio.to_thread.run_sync(hold)
    else:
        async with engine.begin() as conn:
            await conn.execute(sa.text("LOCK TABLE fastapi_jobs_claims IN ACCESS EXCLUSIVE MODE"))
            await anyio.sleep(seconds)


async def test_statements_blocked_past_the_timeout_leave_nothing_behind(
    database_url: str,
) -> None:
    """Store statements held up by a lock longer than the store timeout: the ticks
    are skipped, runs resume once the lock goes, a claim that came back late does
    not hold the job, and once stopped no task or connection is left behind
    (a statement cut mid-way once left the aiosqlite shim's close pending forever,
    so the event loop could not shut down)."""
    ticks: list[datetime] = []
    async with engine_for(database_url) as engine:
        scheduler = ticking(engine, ticks, lease=9, timeout=0.2)
        async with scheduler.running({"db": engine}):
            # Lock halfway between two ticks: the last run has released its claim
            # (a release the lock held up would keep the job for its 3 s lease).
            await poll(lambda: len(ticks) >= 1)
            await anyio.sleep((0.05 - time.time()) % 0.1)
            before = len(ticks)
            await hold_lock(database_url, engine, 1.0)
            during = len(ticks)
            # Well within the 9 s lease: claims that came back late were freed.
            await poll(lambda: len(ticks) - during >= 3, within=6.0)
        skipped = scheduler.job_status("job").skipped.get("store_unavailable", 0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == []
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert during - before <= 1  # at most the run claimed just before the lock
    assert skipped >= 3
    assert len(ticks) == len(set(ticks))


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


async def test_a_tick_claimed_as_the_app_stops_still_runs(tmp_path: Path) -> None:
    """The app stops while a tick's claim is on its way (held up by a lock): the
    claim comes back won, and the run goes, with shutdown waiting for it, instead
    of the tick being claimed and then thrown away (it could never run elsewhere)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    ticks: list[datetime] = []
    async with engine_for(url) as engine:
        scheduler = instance(engine, lease=6, timeout=1.5)
        first = anyio.Event()

        @scheduler.every(seconds=1)
        async def job(ctx: JobContext) -> None:
            ticks.append(ctx.tick)
            first.set()

        async with anyio.create_task_group() as tg, scheduler.running({"db": engine}):
            await first.wait()
            # Lock from 0.3 s before the next tick to 0.5 s after it; stop at
            # 0.15 s after it, while that tick's claim waits for the lock.
            next_tick = ticks[-1].timestamp() + 1
            await anyio.sleep(next_tick - 0.3 - time.time())
            tg.start_soon(hold_lock, url, engine, 0.8)
            await anyio.sleep(next_tick + 0.15 - time.time())
        async with engine.connect() as conn:
            row = (
                await conn.execute(sa.text("SELECT last_tick, outcome FROM fastapi_jobs_claims"))
            ).one()
    assert [t.timestamp() for t in ticks][-1] == next_tick  # it ran, during shutdown
    assert tuple(row) == (next_tick, "ok")


async def test_catch_up_runs_the_latest_missed_tick_once_within_the_deadline(
    database_url: str,
) -> None:
    """After downtime across many ticks, one catch-up run for the latest missed tick,
    and none for a job whose deadline is shorter than that tick's age."""
    grid = Every(minutes=10)
    latest = datetime.fromtimestamp(grid.last_at_or_before(time.time()), tz=UTC)
    async with engine_for(database_url) as engine, open_store(engine) as seed:
        for name in ("digest", "late"):
            fence = await claim1(seed, name, (latest - timedelta(hours=5)).timestamp())
            assert fence == 1
            await release1(seed, name, fence, "ok", None, 1.0)

        ticks: dict[str, list[datetime]] = {"digest": [], "late": []}
        scheduler = instance(engine)

        # The latest tick is at most 10 minutes old: within the hour, never
        # within a microsecond.
        @scheduler.every(minutes=10, catch_up=timedelta(hours=1))
        async def digest(ctx: JobContext) -> None:
            ticks["digest"].append(ctx.tick)

        @scheduler.every(minutes=10, catch_up=timedelta(microseconds=1))
        async def late(ctx: JobContext) -> None:
            ticks["late"].append(ctx.tick)

        async with scheduler.running({"db": engine}):
            await poll(lambda: bool(ticks["digest"]) and bool(scheduler.job_status("late").skipped))
        view = await seed.read()
    assert ticks["digest"] == [latest]  # 5 h down: 30 ticks missed, one run
    assert scheduler.job_status("digest").skipped == {"missed": 29}
    assert ticks["late"] == []
    assert scheduler.job_status("late").skipped == {"missed": 30}
    assert view.jobs["digest"].last_tick == latest


async def test_catch_up_never_reruns_a_tick_a_peer_ran(database_url: str) -> None:
    """Two instances starting together catch up on the missed tick once between them."""
    async with engine_for(database_url) as engine, open_store(engine) as seed:
        await release1(seed, "digest", await claim1(seed, "digest", 0.0) or 0, "ok", None, 0.0)
        runs: list[datetime] = []
        async with AsyncExitStack() as stack:
            for _ in range(2):
                scheduler = Scheduler(store=SQLAlchemyStore(engine), shutdown_timeout=5)

                @scheduler.every(hours=1, catch_up=timedelta(hours=2))
                async def digest(ctx: JobContext) -> None:
                    runs.append(ctx.tick)

                await stack.enter_async_context(scheduler.running({"db": engine}))
            await poll(lambda: bool(runs))
            await anyio.sleep(0.3)  # time for the other instance's catch-up
    assert len(runs) == 1


class SlowLastTick(SQLAlchemyStore):
    """A store whose read of a job's last tick takes 0.6 s (a slow database)."""

    read_at = 0.0

    async def last_tick(self, job: str) -> float | None:
        tick = await super().last_tick(job)
        await anyio.sleep(0.6)
        self.read_at = time.time()
        return tick


class Announced(logging.Handler):
    """Notes the tick each "catching up" line names; may then stall the event
    loop for ``stall`` s, as a slow synchronous handler would."""

    def __init__(self, stall: float = 0.0) -> None:
        super().__init__(logging.INFO)
        self.stall, self.ticks = stall, list[float]()

    def emit(self, record: logging.LogRecord) -> None:
        said = re.search(r"catching up on the latest, (\S+)", record.getMessage())
        if said:
            self.ticks.append(datetime.fromisoformat(said.group(1)).timestamp())
            time.sleep(self.stall)


async def run_after_downtime(
    url: str, store: SQLAlchemyStore, announced: Announced
) -> tuple[float, list[float], dict[str, int]]:
    """Seed a last tick 5 s ago, then run a job every 0.25 s (catch_up=10 s) on
    ``store`` until its third run: the seeded tick, the ticks run, the skips."""
    grid = Every(seconds=0.25)
    seeded = grid.last_at_or_before(time.time()) - 5
    async with engine_for(url) as engine:
        async with open_store(engine) as seed:
            await release1(seed, "job", await claim1(seed, "job", seeded) or 0, "ok", None, 0.0)
        logger = logging.getLogger("fastapi_jobs")
        logger.addHandler(announced)
        level, logger.level = logger.level, logging.INFO
        try:
            runs, skipped = await first_runs(engine, store, 3, 0.25, catch_up=10)
        finally:
            logger.removeHandler(announced)
            logger.setLevel(level)
    return seeded, [tick for tick, _ in runs], skipped


def accounted(
    seeded: float, ticks: list[float], skipped: dict[str, int], every: float = 0.25
) -> bool:
    """Every tick after ``seeded`` up to the last run either ran once or was counted
    as skipped."""
    due, _ = Every(seconds=every).ticks_between(seeded, ticks[-1])
    return len(set(ticks)) == len(ticks) and len(ticks) + sum(skipped.values()) == due


@pytest.mark.parametrize("database_url", ["sqlite", "asyncpg"], indirect=True)
async def test_a_slow_store_read_announces_and_runs_the_latest_missed_tick(
    database_url: str,
) -> None:
    """The store takes 0.6 s (over two ticks) to say when the job last ran: the
    catch-up is decided on the time after that read, and the tick announced runs."""
    announced = Announced()
    store = SlowLastTick(lambda state: state["db"])
    seeded, ticks, skipped = await run_after_downtime(database_url, store, announced)
    [tick] = announced.ticks
    assert tick > store.read_at - 0.25 - 0.05  # the latest at the end of the read
    assert ticks[0] == tick
    assert accounted(seeded, ticks, skipped)


@pytest.mark.parametrize("database_url", ["sqlite", "asyncpg"], indirect=True)
async def test_a_stall_after_the_catch_up_is_announced_still_runs_that_tick(
    database_url: str,
) -> None:
    """The event loop stalls 0.6 s right after the announcement, so the next ticks
    come due before the dispatcher gets to it: the announced tick runs, and the
    ticks due meanwhile count as missed."""
    announced = Announced(stall=0.6)
    store = SQLAlchemyStore(lambda state: state["db"])
    seeded, ticks, skipped = await run_after_downtime(database_url, store, announced)
    [tick] = announced.ticks
    assert ticks[0] == tick
    assert ticks[1] - ticks[0] > 0.5  # the ticks of the stall did not run
    assert accounted(seeded, ticks, skipped)


def test_catch_up_needs_a_store() -> None:
    """catch_up= without a store cannot remember anything: refused at declaration."""
    from fastapi_jobs import ConfigurationError

    with pytest.raises(ConfigurationError, match="catch_up= needs the store"):
        Scheduler().every(hours=1, catch_up=60)(_noop)


async def _noop() -> None:
    pass


def test_instances_is_a_reserved_job_name() -> None:
    """GET /jobs/instances is the instance list, so no job may be called that."""
    from fastapi_jobs import ConfigurationError

    with pytest.raises(ConfigurationError, match="'instances' is taken"):
        Scheduler().add_job(_noop, Every(hours=1), name="instances")


async def test_warns_when_several_processes_run_without_a_store(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """WEB_CONCURRENCY=4 and no store: one warning naming the jobs that will run N times."""
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    scheduler = Scheduler()
    scheduler.every(hours=1)(_noop)
    scheduler.every(hours=1, name="cache", every_instance=True)(_noop)

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            pass
    [warning] = [r for r in caplog.records if "several processes" in r.getMessage()]
    assert "these jobs on every tick: _noop." in warning.getMessage()
    assert "cache" not in warning.getMessage().split("tick:")[1].split(".")[0]


async def test_no_warning_with_a_single_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One process, or a store: no warning."""
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    scheduler = Scheduler()
    scheduler.every(hours=1)(_noop)

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            pass
    assert caplog.records == []


async def test_status_shows_the_last_run_across_instances_and_the_instances(
    database_url: str,
) -> None:
    """GET /jobs on one instance shows where the job last ran and who runs it now;
    GET /jobs/instances lists both live instances."""
    import httpx
    from fastapi import FastAPI

    async with engine_for(database_url) as engine:
        first, second = instance(engine), instance(engine)
        gate = anyio.Event()
        for scheduler in (first, second):

            @scheduler.every(seconds=0.1)
            async def report(ctx: JobContext) -> None:
                await gate.wait()

            @scheduler.every(hours=1, every_instance=True)
            async def local() -> None:
                pass

        app = FastAPI()
        app.include_router(first.router)
        transport = httpx.ASGITransport(app=app)
        async with (
            first.running({"db": engine}),
            second.running({"db": engine}),
            httpx.AsyncClient(transport=transport, base_url="http://t") as client,
        ):
            running: dict[str, Any] = {}

            async def held() -> bool:  # one of them holds `report`, blocked on the gate
                running.update((j["name"], j) for j in (await client.get("/jobs")).json())
                return (running["report"]["cluster"] or {}).get("running_on") is not None

            await poll(held)
            gate.set()
            done: dict[str, Any] = {}

            async def between_runs() -> bool:  # a run has ended, and the job ran on
                done.update((await client.get("/jobs/report")).json())
                cluster = done["cluster"]
                return cluster["last_outcome"] is not None and cluster["fence"] >= 2

            await poll(between_runs)
            instances = (await client.get("/jobs/instances")).json()
    holder = running["report"]["cluster"]["running_on"]
    assert holder in (first.instance.id, second.instance.id)
    assert running["report"]["claims"] is True
    assert running["local"]["claims"] is False and running["local"]["cluster"] is None
    assert done["cluster"]["last_outcome"] == "ok"
    assert done["cluster"]["last_instance"] in (first.instance.id, second.instance.id)
    assert done["cluster"]["fence"] >= 2
    assert sorted(i["id"] for i in instances) == sorted([first.instance.id, second.instance.id])
    assert all(i["pid"] == os.getpid() for i in instances)


async def test_claims_due_at_one_instant_share_one_statement(
    database_url: str, on_statement: Callable[[Callable[..., None]], None]
) -> None:
    """40 jobs due at the same tick are claimed in one statement, not 40,
    and their runs, which end together, are released in one statement too."""
    claim_statements = release_statements = 0

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        nonlocal claim_statements, release_statements
        if "INSERT INTO fastapi_jobs_claims" in statement:
            claim_statements += 1
        elif "UPDATE fastapi_jobs_claims SET lease_until=NULL" in statement:
            release_statements += 1

    runs: list[tuple[str, datetime, int | None]] = []
    async with engine_for(database_url) as engine:
        on_statement(count)
        scheduler = instance(engine)
        for n in range(40):

            async def job(ctx: JobContext) -> None:
                runs.append((ctx.name, ctx.tick, ctx.fence))

            scheduler.add_job(job, Every(seconds=0.2), name=f"job{n}")
        async with scheduler.running({"db": engine}):
            await poll(lambda: len({tick for _, tick, _ in runs}) >= 3)
    ticks = sorted({tick for _, tick, _ in runs})
    assert len(runs) >= 40 * (len(ticks) - 2)  # most jobs ran at most ticks
    assert len({(name, tick) for name, tick, _ in runs}) == len(runs)
    assert all(fence is not None for *_, fence in runs)
    # One claim statement per instant (the last may have been sent as the
    # scheduler stopped), never one per job.
    assert 1 <= claim_statements <= len(ticks) + 1
    assert claim_statements * 10 <= len(runs)
    assert 1 <= release_statements <= 2 * len(ticks) + 1
    async with engine_for(database_url) as engine, engine.connect() as conn:
        rows = (
            await conn.execute(sa.text("SELECT outcome, lease_until FROM fastapi_jobs_claims"))
        ).all()
    assert rows and all(row == ("ok", None) for row in rows)  # every claim released


async def test_a_failed_query_shows_neither_its_sql_nor_its_parameters(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job's failed INSERT: status and the claims table keep the error's type and
    first line, never the statement or its bound values (an API key); the log has it all."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'app.sqlite3'}"
    async with engine_for(url) as engine:
        async with engine.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE users (email TEXT UNIQUE, api_key TEXT)"))
        scheduler = instance(engine)

        @scheduler.every(seconds=0.1)
        async def import_users(ctx: JobContext) -> None:
            async with ctx.state["db"].begin() as conn:
                for _ in range(2):
                    await conn.execute(
                        sa.text("INSERT INTO users (email, api_key) VALUES (:e, :k)"),
                        {"e": "a@example.com", "k": "sk_live_SECRET"},
                    )

        with caplog.at_level(logging.ERROR, logger="fastapi_jobs"):
            async with scheduler.running({"db": engine}):
                await anyio.sleep(0.35)
                [status] = await scheduler.cluster_status()
        async with engine.connect() as conn:
            stored = (
                await conn.execute(sa.text("SELECT error FROM fastapi_jobs_claims"))
            ).scalar_one()
    assert status.last_error is not None
    shown = status.last_error.model_dump_json() + (stored or "") + str(status.cluster)
    assert status.last_error.type == "IntegrityError"
    assert "UNIQUE constraint failed: users.email" in status.last_error.message
    for secret in ("sk_live_SECRET", "INSERT", "a@example.com", "[SQL", "parameters"):
        assert secret not in shown
    assert "sk_live_SECRET" in caplog.text  # the full detail goes to the log only


def test_an_error_message_is_cut_to_one_printable_line() -> None:
    """A huge, multi-line message with control characters is one short line."""
    from fastapi_jobs import ErrorInfo

    class Odd(Exception):
        def __str__(self) -> str:
            return "first\x1b[31m line " + "x" * 10_000 + "\nDETAIL: Key (email)=(bob@example.com)"

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    info = ErrorInfo.of(Odd())
    assert info.message.startswith("first") and len(info.message) == 300
    assert "\x1b" not in info.message and "bob@" not in info.message
    assert ErrorInfo.of(Unprintable()).message == "(its message could not be read)"


async def test_a_sync_job_past_its_timeout_keeps_its_claim_until_the_thread_returns(
    tmp_path: Path,
) -> None:
    """Two instances; a sync job whose thread runs 1.5 s past a 0.1 s timeout under a
    1.2 s lease: the lease is renewed while the thread runs, so no instance starts
    the job beside it; once the thread returns, the job runs again."""
    import threading

    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    lock = threading.Lock()
    active, most, calls = 0, 0, 0
    first = True

    def blocking() -> None:
        nonlocal active, most, calls, first
        with lock:
            active, calls = active + 1, calls + 1
            most = max(most, active)
            long, first = first, False
        time.sleep(1.5 if long else 0.01)
        with lock:
            active -= 1

    async with engine_for(url) as engine, AsyncExitStack() as stack:
        schedulers = []
        for _ in range(2):
            scheduler = instance(engine, lease=1.2, timeout=0.3)
            scheduler.add_job(blocking, Every(seconds=0.1), name="blocking", timeout=0.1)
            await stack.enter_async_context(scheduler.running({"db": engine}))
            schedulers.append(scheduler)
        await anyio.sleep(1.0)
        calls_while_held = calls
        await anyio.sleep(1.2)
    assert calls_while_held == 1 and most == 1
    assert calls > 2  # it ran again once the thread had returned
    statuses = [s.job_status("blocking") for s in schedulers]
    assert sum(s.failures for s in statuses) == 1  # the one timeout, after 1.5 s


async def test_retries_under_a_claim_never_cost_the_next_tick(database_url: str) -> None:
    """With a store too, a failing job's retries end before its next tick: a job
    every 0.5 s that fails after 150 ms, with five retries, loses no tick to its
    own retries (none skipped as overlap: a retry that started before the tick
    used to run past it)."""
    attempts: list[datetime] = []
    async with engine_for(database_url) as engine:
        scheduler = instance(engine)

        @scheduler.every(seconds=0.5, retries=5, retry_backoff=0.1)
        async def flaky(ctx: JobContext) -> None:
            attempts.append(ctx.tick)
            await anyio.sleep(0.15)
            raise ConnectionError("upstream")

        async with scheduler.running({"db": engine}):
            await poll(lambda: len(set(attempts)) >= 8)
            status = scheduler.job_status("flaky")
    # None lost to a retry, but a stall of this process mid-retry can hold one
    # past the cut (retries that ran past the tick used to cost every other one).
    assert status.skipped.get("overlap", 0) <= 1
    assert len(attempts) > len(set(attempts))  # they were retried
    assert status.retries > 0
