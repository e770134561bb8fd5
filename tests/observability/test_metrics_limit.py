"""instrument(per_job_limit=): past that many jobs, a scrape sums this
process's counts over the jobs and leaves out the per-job gauges, so its size
stops growing with the jobs; below it again, the series are per job again."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from fastapi_jobs import ConfigurationError, Every, JobContext, Scheduler
from fastapi_jobs import metrics as metrics_module
from fastapi_jobs.metrics import PER_JOB_LIMIT, Metrics, instrument
from fastapi_jobs.testing import MemoryStore

from ..conftest import HOUR, virtual_scheduler
from .test_metrics import Samples, parse, value

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "metrics.md"


def served(metrics: Metrics) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(metrics.router())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def scraped(metrics: Metrics) -> Samples:
    """A scrape through the router, as Prometheus asks (OpenMetrics), parsed."""
    async with served(metrics) as client:
        answer = await client.get("/metrics", headers={"Accept": OPENMETRICS})
    assert answer.status_code == 200
    return parse(answer.text)


def by_job(samples: Samples) -> set[str]:
    return {dict(labels)["job_name"] for _, labels in samples if "job_name" in dict(labels)}


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "fastapi_jobs.metrics" and r.levelno >= logging.WARNING
    ]


def declare(scheduler: Scheduler, jobs: int) -> None:
    """``jobs`` hourly jobs, each run once at startup; every third fails."""
    for k in range(jobs):

        async def job(k: int = k) -> None:
            if k % 3 == 0:
                raise ConnectionError("smtp refused")

        scheduler.add_job(job, Every(hours=1), name=f"job{k}", run_on_startup=True)


@pytest.mark.looptime
@pytest.mark.parametrize("jobs", [PER_JOB_LIMIT, PER_JOB_LIMIT + 1, 3 * PER_JOB_LIMIT])
async def test_past_the_default_limit_the_counts_are_summed_and_the_scrape_stays_small(
    jobs: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Up to PER_JOB_LIMIT jobs: 12 series a job. Past it: the same counts,
    summed, with no job_name, and no per-job gauge; the size does not grow."""
    scheduler = virtual_scheduler()
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry)
    declare(scheduler, jobs)
    async with scheduler.running():
        await anyio.sleep(HOUR / 2)
        samples = await scraped(metrics)
    failed = len(range(0, jobs, 3))
    summed = jobs > PER_JOB_LIMIT
    assert value(samples, "jobs") == jobs
    assert value(samples, "per_job_series") == (0 if summed else 1)
    if summed:
        assert by_job(samples) == set()
        assert value(samples, "runs_total", outcome="ok") == jobs - failed
        assert value(samples, "runs_total", outcome="failed") == failed
        assert value(samples, "run_duration_seconds_count") == jobs
        assert value(samples, "running") == 0
        assert value(samples, "retries_total") == 0
        # Process-wide: the lateness histogram, the counts, the gauges above.
        assert len(samples) < 40
        assert not any(name.endswith("next_run_timestamp_seconds") for name, _ in samples)
        (warning,) = warnings(caplog)
        assert f"{jobs} jobs, more than per_job_limit={PER_JOB_LIMIT}" in warning.getMessage()
    else:
        assert len(by_job(samples)) == jobs
        per_job = [key for key in samples if "job_name" in dict(key[1])]
        assert len(per_job) == 12 * jobs  # as docs/guides/metrics.md counts them
        assert value(samples, "runs_total", job_name="job0", outcome="failed") == 1
        assert warnings(caplog) == []


@pytest.mark.looptime
@pytest.mark.parametrize("histograms", [False, True])
async def test_the_summed_figures_are_written_as_prometheus_client_writes_them(
    histograms: bool,
) -> None:
    """Past the limit, the router's text is prometheus_client's byte for byte
    (both formats), histograms by job summed into one."""
    scheduler = virtual_scheduler()
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry, histograms_by_job=histograms, per_job_limit=10)
    declare(scheduler, 25)
    async with scheduler.running():
        await anyio.sleep(HOUR / 2)
    async with served(metrics) as client:
        for accept, encoder in (("", generate_latest), (OPENMETRICS, openmetrics_latest)):
            answer = await client.get("/metrics", headers={"Accept": accept})
            assert answer.content == encoder(registry)
    samples = parse(generate_latest(registry).decode())
    assert by_job(samples) == set()
    assert value(samples, "run_duration_seconds_count") == 25
    assert value(samples, "run_lateness_seconds_count") == 25


@pytest.mark.looptime
async def test_the_series_are_per_job_again_when_the_jobs_drop_below_the_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Stored schedules count as jobs: one more than the limit sums the
    figures (one warning, however many scrapes); removing it brings the
    per-job series back (one info line)."""
    caplog.set_level(logging.INFO, logger="fastapi_jobs.metrics")
    scheduler = virtual_scheduler(store=MemoryStore())
    registry = CollectorRegistry()
    instrument(scheduler, registry, per_job_limit=2)

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    @scheduler.task
    async def remind(ctx: JobContext, who: str) -> None: ...

    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level]

    def scrape() -> Samples:
        # prometheus_client's rendering: the router's would be served again
        # for max_age of real time, which the virtual clock does not move.
        return parse(generate_latest(registry).decode())

    async with scheduler.running():
        await scheduler.add_schedule("remind-ada", "remind", Every(hours=1), kwargs={"who": "ada"})
        samples = scrape()
        assert value(samples, "per_job_series") == 1 and value(samples, "jobs") == 2
        assert by_job(samples) == {"digest", "remind-ada"}
        await scheduler.add_schedule("remind-bo", "remind", Every(hours=1), kwargs={"who": "bo"})
        for _ in range(3):
            samples = scrape()
            assert value(samples, "per_job_series") == 0 and value(samples, "jobs") == 3
            assert by_job(samples) == set()
            await anyio.sleep(60)
        assert len(warnings(caplog)) == 1
        await scheduler.remove_schedule("remind-bo")
        samples = scrape()
        assert value(samples, "per_job_series") == 1 and value(samples, "jobs") == 2
        assert by_job(samples) == {"digest", "remind-ada"}
    assert [m for m in said(logging.INFO) if "per job again" in m] == [
        "metrics: 2 jobs, per_job_limit=2: the series are per job again"
    ]


async def test_summing_lets_the_event_loop_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the limit too, other tasks run while the jobs' counts are added up
    (every SUM_STRIDE jobs here, with TURN 0)."""
    monkeypatch.setattr(metrics_module, "TURN", 0.0)
    scheduler = Scheduler()
    metrics = instrument(scheduler, CollectorRegistry(), per_job_limit=0)
    jobs = 2000
    for k in range(jobs):

        async def job() -> None: ...

        scheduler.add_job(job, Every(hours=1), name=f"job{k}")
    turns = 0
    writing = True

    async def other() -> None:
        nonlocal turns
        while writing:
            turns += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        await anyio.lowlevel.checkpoint()
        chunks = await metrics._text(lambda family: "")
        writing = False
    assert turns >= jobs // metrics_module.SUM_STRIDE
    text = b"".join(chunks)
    assert b"job_name" not in text and b"fastapi_jobs_jobs 2000.0" in text


@pytest.mark.parametrize("limit", [-1, 1.5, True, "1000"])
def test_a_limit_that_is_not_a_number_of_jobs_is_refused(limit: object) -> None:
    """per_job_limit is a whole number of jobs, 0 or more, or None."""
    with pytest.raises(ConfigurationError, match=r"per_job_limit=.*a whole number of jobs"):
        instrument(Scheduler(), CollectorRegistry(), per_job_limit=limit)  # type: ignore[arg-type]


def test_the_docs_give_the_default_limit_and_the_gauge_that_says_so() -> None:
    """docs/guides/metrics.md states the default and names the gauge and the switch."""
    page = PAGE.read_text()
    assert f"per_job_limit={PER_JOB_LIMIT:_}" in page or f"{PER_JOB_LIMIT:,} jobs" in page
    for promised in ("fastapi_jobs_per_job_series", "fastapi_jobs_jobs", "per_job_limit=None"):
        assert promised in page
