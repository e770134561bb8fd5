"""The scheduler's health: up and serving while every tick is skipped must show.
Real SQLite files that cannot be opened, real time with a short lease; the
tracker's own rules on a clock of the test's."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi import FastAPI

from fastapi_jobs import ConfigurationError, Health, Scheduler
from fastapi_jobs._core.health import StoreHealth

from ..support.instances import engine_for, ticking
from ..support.waiting import poll


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def _probe(app: FastAPI) -> tuple[int, dict[str, object]]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        answer = await client.get("/healthz/jobs")
    return answer.status_code, answer.json()


async def test_a_store_failing_longer_than_its_lease_is_unhealthy_then_mends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A SQLite file that cannot be opened: health turns 'store_failing' once
    every call has failed for longer than the lease, one ERROR line says so,
    the probe answers 503; once the file can be opened, health is 'ok' again,
    the probe answers 200 and a line says the store answers."""
    folder = tmp_path / "not-yet"
    ticks: list[datetime] = []
    async with engine_for(f"sqlite+aiosqlite:///{folder / 'jobs.sqlite3'}") as engine:
        scheduler = ticking(engine, ticks, lease=1.5, timeout=0.4, heartbeat=0.1)
        app = FastAPI()
        app.include_router(scheduler.health_router())
        async with scheduler.running({"db": engine}):
            await poll(lambda: scheduler.health().status == "store_failing")
            failing = scheduler.health()
            status, body = await _probe(app)
            await poll(lambda: _errors(caplog) != [])  # at the next failure: a beat away
            await anyio.Path(folder).mkdir()
            await poll(lambda: scheduler.health().ok and len(ticks) >= 1)
            status_after, _ = await _probe(app)
    assert (status, body["status"], body["ok"]) == (503, "store_failing", False)
    assert not failing.ok and failing.lease_s == 1.5
    assert failing.store_failing_for_s is not None and failing.store_failing_for_s > 1.5
    assert "OperationalError" in failing.detail and str(tmp_path) not in str(body)
    [error] = _errors(caplog)
    assert "failed every" in error and "more than its lease, 1.5s" in error
    assert status_after == 200
    assert "the store answers again" in caplog.text


async def test_a_store_failing_shorter_than_its_lease_stays_healthy(tmp_path: Path) -> None:
    """Claims that fail for less than a lease cost their ticks, counted as
    store_unavailable, and leave the scheduler healthy: a blip is no outage."""
    folder = tmp_path / "not-yet"
    ticks: list[datetime] = []
    async with engine_for(f"sqlite+aiosqlite:///{folder / 'jobs.sqlite3'}") as engine:
        scheduler = ticking(engine, ticks, lease=30, timeout=0.4, heartbeat=0.1)
        async with scheduler.running({"db": engine}):
            await poll(lambda: scheduler.job_status("job").skipped.get("store_unavailable", 0) >= 2)
            health = scheduler.health()
    assert (health.ok, health.status, health.store_failing_for_s) == (True, "ok", None)


async def test_a_scheduler_not_running_is_unhealthy_and_says_why() -> None:
    """Before the lifespan starts it, and after it stops, the probe answers 503
    'not_running', naming the lifespan to pass; while it runs, 200."""
    scheduler = Scheduler()

    @scheduler.every(hours=1)
    async def job() -> None: ...

    app = FastAPI()
    app.include_router(scheduler.health_router())
    before = await _probe(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        head = (await client.head("/healthz/jobs")).status_code
    async with scheduler.running():
        during = await _probe(app)
    after = await _probe(app)
    assert before[0] == after[0] == 503 and during[0] == 200
    assert head == 503  # a load balancer's HEAD is answered as a GET
    assert before[1]["status"] == after[1]["status"] == "not_running"
    assert (before[1]["scheduler"], after[1]["scheduler"]) == ("never_started", "stopped")
    assert "lifespan=scheduler.lifespan" in str(before[1]["detail"])
    assert "shutting down" in str(after[1]["detail"])
    assert during[1] == Health(ok=True, status="ok", detail="the scheduler runs").model_dump()


async def test_the_health_route_refuses_what_it_does_not_take() -> None:
    """A query parameter the route does not take is a 422, as on the other routers."""
    app = FastAPI()
    app.include_router(Scheduler().health_router())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        answer = await client.get("/healthz/jobs?verbose=1")
    assert answer.status_code == 422 and "verbose" in answer.text


def test_the_health_route_takes_a_path_of_its_own() -> None:
    """health_router(path=) serves where the platform probes; a path that is not
    one is refused, saying what to write."""
    scheduler = Scheduler()
    router = scheduler.health_router("/ready")
    assert [route.path for route in router.routes] == ["/ready"]  # type: ignore[attr-defined]
    for bad in ("ready", "/ready/", 7, "/a?x=1", "/a#f", "/a b", "/a/{x}", "/é"):
        with pytest.raises(ConfigurationError, match="starts with '/'"):
            scheduler.health_router(bad)  # type: ignore[arg-type]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_either_call_failing_past_the_lease_is_failing_and_one_line_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Beats failing while claims go through (or the reverse) is failing once
    their failures span more than the lease, counted from the first in a row;
    the ERROR line is written once per outage, and one line when it mends."""
    clock = _Clock()
    health = StoreHealth(logging.getLogger("test.health"), lease=30, now=clock)
    health.failed("heartbeats", OSError("down"))
    clock.now = 10
    health.ok("claims")
    health.failed("heartbeats", OSError("down"))
    assert health.failing_for() is None
    clock.now = 31
    health.failed("heartbeats", OSError("down"))
    assert health.failing_for() == 31
    clock.now = 40
    health.failed("heartbeats", OSError("down"))
    assert len(_errors(caplog)) == 1 and "every heartbeat for 31s" in _errors(caplog)[0]
    health.ok("heartbeats")
    assert health.failing_for() is None and "the store answers again" in caplog.text
    clock.now = 50
    health.failed("claims", OSError("down"))
    clock.now = 70
    health.failed("claims", OSError("down"))
    assert health.failing_for() is None  # 20 s in a row: this outage is new


def test_one_failed_claim_is_no_outage_however_long_the_next_one_takes() -> None:
    """An hourly job's claim fails once: health stays ok through the hour (the
    platform would take the instance out for the whole of it), and only a
    second failure more than a lease later makes it failing."""
    clock = _Clock()
    health = StoreHealth(logging.getLogger("test.health"), lease=30, now=clock)
    health.failed("claims", OSError("locked"))
    clock.now = 3599
    assert health.failing_for() is None
    clock.now = 3600
    health.failed("claims", OSError("locked"))
    assert health.failing_for() == 3600


def test_a_configuration_the_store_refuses_is_failing_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ConfigurationError (a pooler the store cannot run behind, found after
    the start) never mends: failing at its first claim, its fix in the line."""
    health = StoreHealth(logging.getLogger("test.health"), lease=30, now=_Clock())
    health.failed("claims", ConfigurationError("make the engine with connect_args=..."))
    assert health.failing_for() == 0
    assert "connect_args=..." in _errors(caplog)[0]
