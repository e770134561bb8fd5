"""Prometheus metrics: this process's figures on virtual time, the cluster's
from a real store (its clock: short intervals, wide margins), and the scrape
through the app's own /metrics."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from prometheus_client.parser import text_string_to_metric_families

from fastapi_jobs import ConfigurationError, Cron, Every, JobContext, Scheduler
from fastapi_jobs.metrics import DURATION_BUCKETS, LATENESS_BUCKETS, instrument
from fastapi_jobs.stores import Ended, SQLAlchemyStore

from ..conftest import HOUR, START, claim1, serve, virtual_scheduler
from ..stores.test_store import opened
from ..support.cluster import App, rows
from ..support.waiting import poll, wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(registry: CollectorRegistry) -> Samples:
    return parse(generate_latest(registry).decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((f"fastapi_jobs_{name}", tuple(sorted(labels.items()))))


@pytest.mark.looptime
async def test_this_processs_figures_come_from_the_schedulers_own_counts() -> None:
    scheduler = virtual_scheduler()
    registry = CollectorRegistry()
    instrument(scheduler, registry)

    @scheduler.every(hours=1)
    async def fine() -> None: ...

    @scheduler.every(hours=1)
    async def broken() -> None:
        raise ConnectionError("smtp refused")

    @scheduler.every(hours=1, timeout=1)
    async def stuck() -> None:
        await anyio.sleep(10)

    @scheduler.every(minutes=30)
    async def slow() -> None:
        await anyio.sleep(45 * 60)  # outlasts the next tick: dropped as overlap

    @scheduler.cron("0 9 * * 1-5")
    async def weekdays() -> None: ...

    @scheduler.every(hours=1, paused=True)
    async def held() -> None: ...

    before = scrape(registry)
    assert value(before, "scheduler_running") == 0
    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 60)
        samples = scrape(registry)
    assert value(samples, "scheduler_running") == 1
    assert value(samples, "runs_total", job_name="fine", outcome="ok") == 2
    assert value(samples, "runs_total", job_name="fine", outcome="failed") == 0
    assert value(samples, "runs_total", job_name="broken", outcome="failed") == 2
    assert value(samples, "runs_total", job_name="broken", outcome="ok") == 0
    assert value(samples, "runs_total", job_name="stuck", outcome="timed_out") == 2
    assert value(samples, "runs_total", job_name="stuck", outcome="failed") == 0
    # slow: ran at 0:30 (ended 1:15) and 1:30 (still going); 1:00 and 2:00 dropped
    assert value(samples, "runs_total", job_name="slow", outcome="ok") == 1
    assert value(samples, "running", job_name="slow") == 1
    assert value(samples, "running", job_name="fine") == 0
    assert value(samples, "skipped_ticks_total", job_name="slow", reason="overlap") == 2
    assert value(samples, "skipped_ticks_total", job_name="held", reason="paused") == 2
    assert value(samples, "paused", job_name="held") == 1
    assert value(samples, "paused", job_name="fine") == 0
    # Durations: a summary per job (count and sum), one sample per run ended.
    assert value(samples, "run_duration_seconds_count", job_name="fine") == 2
    assert value(samples, "run_duration_seconds_count", job_name="slow") == 1
    assert value(samples, "run_duration_seconds_sum", job_name="slow") == pytest.approx(2700)
    assert value(samples, "run_duration_seconds_bucket", job_name="fine", le="+Inf") is None
    # Lateness: one histogram for the process (fine, broken and stuck twice, slow
    # once); a tick's run starts on time on a virtual clock.
    assert value(samples, "run_lateness_seconds_count") == 7
    assert value(samples, "run_lateness_seconds_bucket", le="0.001") == 7
    assert value(samples, "run_lateness_seconds_count", job_name="fine") is None
    # The alert's figures: last success, interval, next tick.
    start = START.timestamp()
    assert value(samples, "last_success_timestamp_seconds", job_name="fine") == pytest.approx(
        start + 2 * HOUR
    )
    assert value(samples, "last_success_timestamp_seconds", job_name="broken") == 0
    assert value(samples, "last_success_timestamp_seconds", job_name="weekdays") is None
    assert value(samples, "interval_seconds", job_name="fine") == HOUR
    assert value(samples, "interval_seconds", job_name="slow") == HOUR / 2
    assert value(samples, "interval_seconds", job_name="weekdays") == 24 * HOUR  # Mon → Tue
    assert value(samples, "next_run_timestamp_seconds", job_name="fine") == start + 3 * HOUR
    assert value(samples, "next_run_timestamp_seconds", job_name="weekdays") == start + 9 * HOUR
    assert value(samples, "store_up") is None  # no store: no cluster figures


@pytest.mark.looptime
async def test_retries_are_counted_and_every_attempt_has_its_outcome() -> None:
    scheduler = virtual_scheduler()
    registry = CollectorRegistry()
    instrument(scheduler, registry)
    calls: list[int] = []

    @scheduler.every(hours=1, retries=2, retry_backoff=10)
    async def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")

    async with scheduler.running():
        await anyio.sleep(HOUR + 120)
    samples = scrape(registry)
    assert value(samples, "retries_total", job_name="flaky") == 2
    assert value(samples, "runs_total", job_name="flaky", outcome="failed") == 2
    assert value(samples, "runs_total", job_name="flaky", outcome="ok") == 1
    assert value(samples, "run_lateness_seconds_count") == 1  # first tries only


@pytest.mark.looptime
async def test_histograms_by_job_are_there_when_asked_for() -> None:
    """histograms_by_job=True: durations and lateness as histograms of each job."""
    scheduler = virtual_scheduler()
    registry = CollectorRegistry()
    instrument(scheduler, registry, histograms_by_job=True)

    @scheduler.every(hours=1)
    async def fine() -> None: ...

    @scheduler.every(minutes=30)
    async def slow() -> None:
        await anyio.sleep(45 * 60)

    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 60)
        samples = scrape(registry)
    assert value(samples, "run_duration_seconds_count", job_name="fine") == 2
    assert value(samples, "run_duration_seconds_bucket", job_name="fine", le="0.005") == 2
    assert value(samples, "run_duration_seconds_bucket", job_name="slow", le="900.0") == 0
    assert value(samples, "run_duration_seconds_bucket", job_name="slow", le="3600.0") == 1
    assert value(samples, "run_duration_seconds_sum", job_name="slow") == pytest.approx(2700)
    assert value(samples, "run_lateness_seconds_count", job_name="fine") == 2
    assert value(samples, "run_lateness_seconds_bucket", job_name="fine", le="0.001") == 2
    assert value(samples, "run_lateness_seconds_count") is None
    series = [
        name
        for name, labels in samples
        if name.startswith("fastapi_jobs_run_") and dict(labels).get("job_name") == "fine"
    ]
    # Each bucket, +Inf, count and sum.
    assert len(series) == len(DURATION_BUCKETS) + 3 + len(LATENESS_BUCKETS) + 3


async def test_instrument_refuses_what_it_cannot_use() -> None:
    scheduler = Scheduler()
    registry = CollectorRegistry()
    with pytest.raises(ConfigurationError, match="give it the Scheduler"):
        instrument(object(), registry)  # type: ignore[arg-type]
    for bad in (0, -1, float("nan"), "2", True, 10_000):
        with pytest.raises(ConfigurationError, match="max_age"):
            instrument(scheduler, registry, max_age=bad)  # type: ignore[arg-type]
    instrument(scheduler, registry)
    with pytest.raises(ConfigurationError, match="instrumented twice"):
        instrument(scheduler, registry)
    assert scrape(registry)  # the first one still serves
    async with scheduler.running():
        with pytest.raises(ConfigurationError, match="before it starts"):
            instrument(scheduler, CollectorRegistry())


async def test_the_store_knows_the_last_success_of_a_job_whose_last_run_failed(
    database_url: str,
) -> None:
    async with opened(database_url) as (store, _):
        for fence, outcome in ((1, "ok"), (2, "ok"), (3, "failed")):
            assert await claim1(store, "digest", 1000.0 + fence) == fence
            await store.release([Ended("digest", fence, outcome, None, 0.1)])  # type: ignore[arg-type]
        assert await claim1(store, "never_ok", 1000.0) == 1
        await store.release([Ended("never_ok", 1, "failed", "ValueError: no", 0.1)])
        assert await claim1(store, "fine", 1000.0) == 1
        await store.release([Ended("fine", 1, "ok", None, 0.1)])
        assert await claim1(store, "going", 1000.0) == 1  # running: no outcome yet
        view = await store.read()
        runs = await store.runs("digest", 3)
    digest = view.jobs["digest"]
    assert digest.last_outcome == "failed"
    assert digest.last_success_at is not None
    assert digest.last_success_at == runs[1].finished_at  # fence 2's end
    assert view.jobs["never_ok"].last_success_at is None
    assert view.jobs["fine"].last_success_at == view.jobs["fine"].last_finished_at
    assert view.jobs["going"].last_success_at is None
    assert view.read_at is not None and view.read_at > 1_700_000_000


async def test_cluster_figures_come_from_the_store_and_a_locked_database_gives_store_up_0(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.sqlite3"
    store = SQLAlchemyStore(f"sqlite+aiosqlite:///{path}", lease=5, timeout=0.5, heartbeat=1)
    scheduler = Scheduler(store=store)
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry, max_age=0.2)
    failing: list[bool] = []

    @scheduler.every(seconds=1)
    async def digest(ctx: JobContext) -> None:
        if failing:
            raise ConnectionError("smtp refused")

    @scheduler.every(seconds=1, every_instance=True)
    async def local() -> None: ...

    app = FastAPI(lifespan=scheduler.lifespan)
    app.mount("/metrics", make_asgi_app(registry))
    async with serve(app) as client:

        async def succeeded() -> bool:
            samples = parse((await client.get("/metrics/")).text)
            return bool(value(samples, "last_success_timestamp_seconds", job_name="digest"))

        await poll(succeeded, within=15, every=0.2)
        failing.append(True)

        async def failed() -> bool:
            samples = parse((await client.get("/metrics/")).text)
            return value(samples, "last_outcome", job_name="digest", outcome="failed") == 1

        await poll(failed, within=15, every=0.2)
        samples = parse((await client.get("/metrics/")).text)
        assert value(samples, "store_up") == 1
        assert value(samples, "instances") == 1
        assert value(samples, "last_outcome", job_name="digest", outcome="ok") == 0
        success = value(samples, "last_success_timestamp_seconds", job_name="digest")
        last_run = value(samples, "last_run_timestamp_seconds", job_name="digest")
        read_at = value(samples, "cluster_read_timestamp_seconds")
        assert success is not None and last_run is not None and read_at is not None
        # (The reading's time is taken as it starts: a release may land during it.)
        assert success < last_run and success < read_at
        assert value(samples, "last_run_timestamp_seconds", job_name="local") is None  # not claimed
        assert value(samples, "last_success_timestamp_seconds", job_name="local")  # this process's

        # The database locked by another process's writer: reads time out. The
        # lock waits for a write of the store's own to end (it took none, with a
        # timeout of 0, on a busy machine), in a thread: the store's write may
        # need this event loop to commit.
        with closing(sqlite3.connect(path, timeout=30, check_same_thread=False)) as locker:
            await anyio.to_thread.run_sync(locker.execute, "BEGIN EXCLUSIVE")

            async def down() -> bool:
                samples = parse((await client.get("/metrics/")).text)
                return value(samples, "store_up") == 0

            await poll(down, within=15, every=0.2)
            samples = parse((await client.get("/metrics/")).text)
            # The last reading stays (store_up says how to read it), and this
            # process's figures go on.
            assert value(samples, "last_success_timestamp_seconds", job_name="digest") == success
            assert value(samples, "runs_total", job_name="local", outcome="ok")
            locker.rollback()

        async def up() -> bool:
            samples = parse((await client.get("/metrics/")).text)
            return value(samples, "store_up") == 1

        await poll(up, within=15, every=0.2)
        # Scraped from a thread (start_http_server, a sync endpoint): the same figures.
        text = await anyio.to_thread.run_sync(generate_latest, registry)
        assert value(parse(text.decode()), "store_up") == 1
    assert metrics.scheduler is scheduler


async def test_a_store_that_is_down_from_the_start_gives_store_up_0_not_a_failed_scrape() -> None:
    store = SQLAlchemyStore(
        "postgresql+asyncpg://nobody:x@127.0.0.1:1/none", lease=3, timeout=0.5, heartbeat=1
    )
    scheduler = Scheduler(store=store)
    registry = CollectorRegistry()
    instrument(scheduler, registry)

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    app = FastAPI(lifespan=scheduler.lifespan)
    app.mount("/metrics", make_asgi_app(registry))
    async with serve(app) as client:
        answer = await client.get("/metrics/")
    assert answer.status_code == 200
    samples = parse(answer.text)
    assert value(samples, "store_up") == 0
    assert value(samples, "scheduler_running") == 1
    assert value(samples, "interval_seconds", job_name="digest") == HOUR
    assert value(samples, "last_success_timestamp_seconds", job_name="digest") is None


def scrape_http(base: str) -> Samples:
    answer = httpx.get(base + "/metrics", timeout=10)
    assert answer.status_code == 200, answer.text
    return parse(answer.text)


@pytest.mark.slow  # 12-23 s of app processes: .ci/run's slow pass
def test_every_worker_reports_the_same_cluster_figures(tmp_path: Path, apps: list[App]) -> None:
    """uvicorn --workers 3 on a SQLite file: whichever worker answers a scrape,
    the cluster's figures are there (one alert rule works on any of them)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'workers.sqlite3'}"
    app = App(url, workers=3, JOBS=2, INTERVAL=0.25, TIMEOUT=1, METRICS=1)
    apps.append(app)
    app.wait_started()
    base = f"http://127.0.0.1:{app.port}"
    wait_until(lambda: len(rows(url, "SELECT 1 FROM runs WHERE finished IS NOT NULL")) >= 6)
    time.sleep(2.0)  # every worker read the store since (each heartbeat: 1 s here)
    for _ in range(12):
        samples = scrape_http(base)
        assert value(samples, "store_up") == 1
        assert value(samples, "instances") == 3
        for job in ("job0", "job1"):
            assert value(samples, "last_success_timestamp_seconds", job_name=job)
            assert value(samples, "interval_seconds", job_name=job) == 0.25


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_multiprocess_mode_sums_the_workers_counts(tmp_path: Path, apps: list[App]) -> None:
    """prometheus_client's multiprocess mode: one scrape counts every worker's runs."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'workers.sqlite3'}"
    files = tmp_path / "prometheus"
    files.mkdir()
    app = App(
        url, workers=2, JOBS=1, INTERVAL=0.25, TIMEOUT=1, METRICS=1, PROMETHEUS_MULTIPROC_DIR=files
    )
    apps.append(app)
    app.wait_started()
    base = f"http://127.0.0.1:{app.port}"
    wait_until(lambda: len({pid for (pid,) in rows(url, "SELECT pid FROM runs")}) == 2, timeout=20)
    assert httpx.post(base + "/jobs/job0/pause", timeout=10).status_code == 200
    time.sleep(1.5)  # the last runs end (both workers know the pause from the claims)
    ran = len(rows(url, "SELECT 1 FROM runs WHERE finished IS NOT NULL"))
    samples = scrape_http(base)
    assert value(samples, "runs_total", job_name="job0", outcome="ok") == ran
    assert value(samples, "run_duration_seconds_count", job_name="job0") == ran
    assert value(samples, "running", job_name="job0") == 0
    skipped = value(samples, "skipped_ticks_total", job_name="job0", reason="claimed_elsewhere")
    paused = value(samples, "skipped_ticks_total", job_name="job0", reason="paused")
    assert skipped is not None and paused  # counted where they happen, summed here
    assert value(samples, "paused", job_name="job0") == 1


@pytest.mark.slow  # 9-16 s of processes: .ci/run's slow pass
def test_a_sigkilled_workers_running_is_gone_once_it_is_respawned(
    tmp_path: Path, apps: list[App]
) -> None:
    """Multiprocess mode: a worker killed mid-run leaves its live gauge file; the
    workers mark it dead (mark_process_dead) and its running 1 is not summed."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'workers.sqlite3'}"
    files = tmp_path / "prometheus"
    files.mkdir()
    app = App(
        url,
        workers=2,
        JOBS=1,
        INTERVAL=0.25,
        RUN_SECONDS=60,  # the run outlasts the test; its lease (30 s) holds the peer off
        TIMEOUT=1,
        METRICS=1,
        PROMETHEUS_MULTIPROC_DIR=files,
    )
    apps.append(app)
    app.wait_started()
    base = f"http://127.0.0.1:{app.port}"
    wait_until(lambda: rows(url, "SELECT pid FROM runs WHERE finished IS NULL"), timeout=20)
    [(pid,)] = rows(url, "SELECT pid FROM runs WHERE finished IS NULL")
    assert value(scrape_http(base), "running", job_name="job0") == 1
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: app.output().count("Application startup complete") == 3, timeout=30)
    # The respawned worker marks it dead as it starts (nothing has scraped since).
    wait_until(lambda: f"gauge_livesum_{pid}.db" not in os.listdir(files), timeout=10)
    # No worker runs it now (0), or none that is alive ever did (no sample).
    assert not value(scrape_http(base), "running", job_name="job0")
    # Its other files (counts, summed across workers) stay.
    left = [name for name in os.listdir(files) if name.endswith(f"_{pid}.db")]
    assert left and not [name for name in left if name.startswith("gauge_live")]
    assert len(rows(url, "SELECT 1 FROM runs WHERE finished IS NULL")) == 1  # no peer took it


@pytest.mark.looptime
async def test_a_schedule_that_raises_leaves_out_its_interval_not_the_scrape() -> None:
    class Flaky(Cron):
        """Hourly, until its next_after breaks."""

        broken = False

        def next_after(self, ts: float) -> float:
            if Flaky.broken:
                raise RuntimeError("broken schedule")
            return super().next_after(ts)

    scheduler = virtual_scheduler()
    registry = CollectorRegistry()
    instrument(scheduler, registry)

    async def job() -> None: ...

    scheduler.add_job(job, Flaky("0 * * * *"), name="flaky")
    scheduler.add_job(job, Every(hours=1), name="fine")
    async with scheduler.running():
        await anyio.sleep(60)
        Flaky.broken = True
        samples = scrape(registry)
    assert value(samples, "interval_seconds", job_name="fine") == HOUR
    assert value(samples, "next_run_timestamp_seconds", job_name="flaky") is not None
    assert value(samples, "interval_seconds", job_name="flaky") is None
