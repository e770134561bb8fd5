"""Metrics.router(): GET /metrics answers 200, writes what prometheus_client
writes, lets the event loop run while it writes, and serves a rendering again
for max_age; in multiprocess mode, the live gauges of ended workers are dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import anyio
import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from fastapi_jobs import Every, Scheduler
from fastapi_jobs import metrics as metrics_module
from fastapi_jobs.metrics import Metrics, instrument
from fastapi_jobs.metrics._scrape import Exposition, forget_dead_processes
from fastapi_jobs.stores import SQLAlchemyStore

from ..conftest import HOUR, serve, virtual_scheduler
from ..support.waiting import poll
from .test_metrics import parse, value

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
# Names the text formats must escape (a quote, a backslash), and non-ASCII.
ODD = ['say "hi"', "back\\slash", "<img src=x onerror=alert(1)>", "café"]


def served(metrics: Metrics) -> httpx.AsyncClient:
    """A client of an app that only serves metrics.router() (no lifespan)."""
    app = FastAPI()
    app.include_router(metrics.router())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_metrics_answer_200_at_metrics_in_the_format_and_encoding_asked_for() -> None:
    """GET /metrics (no slash, no redirect): Prometheus's text format by default,
    OpenMetrics when asked, gzipped when accepted."""
    scheduler = Scheduler()
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry)

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    async with served(metrics) as client:
        plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert plain.status_code == 200
        assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "content-encoding" not in plain.headers
        assert 'fastapi_jobs_paused{job_name="digest"} 0.0' in plain.text
        assert not plain.text.endswith("# EOF\n")

        packed = await client.get(
            "/metrics", headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"}
        )
        assert packed.status_code == 200
        assert packed.headers["content-type"].startswith("application/openmetrics-text")
        assert packed.headers["content-encoding"] == "gzip"
        assert packed.text.endswith("# EOF\n")  # httpx has decompressed it
        assert "# TYPE fastapi_jobs_runs counter" in packed.text
        assert parse(packed.text.removesuffix("# EOF\n")) == parse(plain.text)


@pytest.mark.parametrize("by_job", [False, True], ids=["default", "histograms_by_job"])
@pytest.mark.looptime
async def test_the_router_writes_byte_for_byte_what_prometheus_client_writes(
    by_job: bool,
) -> None:
    """Both formats, every family (counts, skips, retries, histograms or summaries),
    names to escape: the router's own text is prometheus_client's, exactly."""
    scheduler = virtual_scheduler()
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry, histograms_by_job=by_job)
    calls: list[str] = []

    def body(name: str) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            calls.append(name)

        return job

    for name in ODD:
        scheduler.add_job(body(name), Every(hours=1), name=name)

    @scheduler.every(hours=1, retries=1, retry_backoff=5)
    async def broken() -> None:
        raise ConnectionError("smtp refused")

    @scheduler.every(minutes=30)
    async def slow() -> None:
        await anyio.sleep(45 * 60)  # outlasts the next tick: skipped as overlap

    @scheduler.cron("0 9 * * 1-5")
    async def weekdays() -> None: ...

    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 60)
    # Stopped: nothing moves between the two renderings.
    async with served(metrics) as client:
        for accept, encoder in (("", generate_latest), (OPENMETRICS, openmetrics_latest)):
            answer = await client.get("/metrics", headers={"Accept": accept})
            assert answer.content == encoder(registry)
    assert calls


async def test_the_cluster_figures_are_written_as_prometheus_client_writes_them(
    tmp_path: Path,
) -> None:
    """With a store: the cluster's families (last run, outcome, running, instances),
    the same bytes from the router as from prometheus_client."""
    store = SQLAlchemyStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}", heartbeat=1)
    scheduler = Scheduler(store=store)
    registry = CollectorRegistry()
    metrics = instrument(scheduler, registry, max_age=0.2)

    @scheduler.every(hours=1, run_on_startup=True, name=ODD[0])
    async def fine() -> None: ...

    @scheduler.every(hours=1, run_on_startup=True, name=ODD[1])
    async def broken() -> None:
        raise ConnectionError("smtp refused")

    app = FastAPI(lifespan=scheduler.lifespan)
    async with serve(app):

        def read() -> bool:
            samples = parse(generate_latest(registry).decode())
            return all(
                value(samples, "last_outcome", job_name=name, outcome=outcome) == 1
                for name, outcome in ((ODD[0], "ok"), (ODD[1], "failed"))
            )

        await poll(read, within=15, every=0.1)
    async with served(metrics) as client:
        for accept, encoder in (("", generate_latest), (OPENMETRICS, openmetrics_latest)):
            answer = await client.get("/metrics", headers={"Accept": accept})
            assert answer.content == encoder(registry)
            assert "fastapi_jobs_cluster_running" in answer.text


async def test_the_router_takes_the_apps_own_auth() -> None:
    """include_router(metrics.router(), dependencies=[...]) guards /metrics."""

    def token(authorization: Annotated[str, Header()] = "") -> None:
        if authorization != "Bearer scrape-token":
            raise HTTPException(401, "send the scrape token")

    metrics = instrument(Scheduler(), CollectorRegistry())
    app = FastAPI()
    app.include_router(metrics.router(), dependencies=[Depends(token)])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/metrics")).status_code == 401
        allowed = await client.get("/metrics", headers={"Authorization": "Bearer scrape-token"})
        assert allowed.status_code == 200 and "fastapi_jobs_scheduler_running 0.0" in allowed.text


async def test_the_figures_are_written_with_turns_of_the_event_loop_in_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While thousands of jobs' figures are written, other tasks run (every
    STRIDE jobs here, with TURN 0): a scrape does not hold the app's requests."""
    monkeypatch.setattr(metrics_module, "TURN", 0.0)
    scheduler = Scheduler()
    metrics = instrument(scheduler, CollectorRegistry(), per_job_limit=None)
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
    assert turns >= jobs // metrics_module.STRIDE
    assert b"".join(chunks).count(b"fastapi_jobs_paused{") == jobs


async def test_a_rendering_is_served_again_for_max_age_then_made_anew() -> None:
    """Two scrapes within max_age get the same body; after it, the new figures."""
    scheduler = Scheduler()
    registry = CollectorRegistry()
    cached = instrument(scheduler, registry, max_age=3600)

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    other = Scheduler()
    fresh = instrument(other, CollectorRegistry(), max_age=0.1)

    @other.every(hours=1)
    async def report() -> None: ...

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(cached.router())

    def ok_runs(text: str, job: str) -> float | None:
        return value(parse(text), "runs_total", job_name=job, outcome="ok")

    async with serve(app) as client:
        assert ok_runs((await client.get("/metrics")).text, "digest") == 0
        assert (await scheduler.run_now("digest")).ok
        assert ok_runs((await client.get("/metrics")).text, "digest") == 0  # as served before
        assert ok_runs(generate_latest(registry).decode(), "digest") == 1  # what it is

    async with other.running(), served(fresh) as client:
        assert ok_runs((await client.get("/metrics")).text, "report") == 0
        assert (await other.run_now("report")).ok

        async def renewed() -> bool:
            return ok_runs((await client.get("/metrics")).text, "report") == 1

        await poll(renewed, within=10, every=0.05)


async def test_scrapes_that_come_together_share_one_rendering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scrapes that arrive while one is being made wait for it, and are served
    it, however long it took (one rendering)."""
    scheduler = Scheduler()
    metrics = instrument(scheduler, CollectorRegistry(), max_age=0.1)

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    made = 0
    render = metrics._render

    async def counted(encoder: Callable[[CollectorRegistry], bytes], kind: str) -> list[bytes]:
        nonlocal made
        made += 1
        await anyio.sleep(0.3)  # longer than max_age
        return await render(encoder, kind)

    monkeypatch.setattr(metrics, "_render", counted)
    bodies: list[bytes] = []
    async with served(metrics) as client:

        async def scrape() -> None:
            bodies.append((await client.get("/metrics")).content)

        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(scrape)
    assert made == 1
    assert len(bodies) == 5 and len(set(bodies)) == 1


# -- multiprocess mode: the files of ended workers ---------------------------

_WORKER = textwrap.dedent(
    """
    import sys
    from prometheus_client import Counter, Gauge
    Gauge("fastapi_jobs_running", "", ["job_name"], multiprocess_mode="livesum").labels("a").inc()
    Counter("fastapi_jobs_runs", "", ["job_name"]).labels("a").inc()
    print("ready", flush=True)
    if sys.argv[1] == "wait":
        sys.stdin.read()
    """
)


def _worker(directory: Path, mode: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _WORKER, mode],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


def test_ended_workers_live_gauges_are_marked_dead_and_their_counts_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that exited, one SIGKILLed and not yet reaped (a zombie): their
    live gauges go; a running worker's stay, and every worker's counters stay."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    exited = _worker(tmp_path, "exit")
    exited.communicate()
    killed = _worker(tmp_path, "wait")
    killed.send_signal(signal.SIGKILL)
    poll_until_zombie(killed.pid)
    alive = _worker(tmp_path, "wait")
    try:
        assert forget_dead_processes() == sorted([exited.pid, killed.pid])
        files = sorted(path.name for path in tmp_path.iterdir())
        assert files == sorted(
            [f"gauge_livesum_{alive.pid}.db"]
            + [f"counter_{pid}.db" for pid in (exited.pid, killed.pid, alive.pid)]
        )
        assert forget_dead_processes() == []  # nothing left to do
    finally:
        for process in (killed, alive):
            process.kill()
            process.communicate()


async def test_each_rendering_first_marks_ended_workers_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In multiprocess mode the router's scrape drops an ended worker's live
    gauges before prometheus_client reads the files."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    ended = _worker(tmp_path, "exit")
    ended.communicate()
    seen: list[list[str]] = []

    async def render(encoder: Callable[[CollectorRegistry], bytes], kind: str) -> list[bytes]:
        seen.append(sorted(os.listdir(tmp_path)))
        return [b""]

    exposition = Exposition(render, max_age=1, multiprocess=True)
    await exposition.answer("", "")
    assert seen == [[f"counter_{ended.pid}.db"]]


def poll_until_zombie(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0] != b"Z":
        assert time.monotonic() < deadline, "the killed process did not end"
        time.sleep(0.01)


def test_without_a_multiprocess_directory_nothing_is_looked_at(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No PROMETHEUS_MULTIPROC_DIR, or one that is not there: nothing to mark."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert forget_dead_processes() == []
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent/fastapi_jobs")
    assert forget_dead_processes() == []
