"""GET /jobs and GET /jobs/{name}: plain status data, protected by the app's dependencies."""

from __future__ import annotations

import logging
import os
from typing import Any

import anyio
import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException

from fastapi_jobs import Every, Schedule, Scheduler
from fastapi_jobs._core.lifecycle import NEVER_STARTED

from ..conftest import HOUR, serve, virtual_scheduler

pytestmark = pytest.mark.looptime

FIELDS = {
    "overlap",
    "jitter",
    "name",
    "instance",
    "schedule",
    "running",
    "next_run_at",
    "last_started_at",
    "last_finished_at",
    "last_duration_s",
    "last_outcome",
    "last_error",
    "runs",
    "failures",
    "skipped_ticks",
    "skipped",
    "claims",
    "paused",
    "paused_until",
    "retries",
    "hand_off",
    "task",
    "cluster",
    "scheduler",
}


def make_app(**include: object) -> FastAPI:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def expire_sessions() -> None:
        await anyio.sleep(90)

    @scheduler.cron("30 * * * *")
    async def flaky() -> None:
        raise ConnectionError("smtp refused")

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router, **include)  # type: ignore[arg-type]
    return app


async def test_list_jobs_returns_every_field_of_every_job() -> None:
    """GET /jobs lists one object per job, in declaration order, with all documented fields."""
    async with serve(make_app()) as client:
        await anyio.sleep(HOUR + 30)  # flaky failed at 0:30, expire_sessions running since 1:00
        response = await client.get("/jobs")
    assert response.status_code == 200
    body = response.json()
    assert [job["name"] for job in body] == ["expire_sessions", "flaky"]
    assert all(set(job) == FIELDS for job in body)
    running, failed = body
    assert running["running"] is True
    assert running["schedule"] == "every 1h"
    assert running["last_started_at"] == "2026-03-02T01:00:00Z"
    assert running["next_run_at"] == "2026-03-02T02:00:00Z"
    assert running["last_outcome"] is None and running["runs"] == 1
    assert failed["last_outcome"] == "failed"
    assert failed["last_error"] == {"type": "ConnectionError", "message": "smtp refused"}
    assert failed["failures"] == 1
    assert failed["last_duration_s"] == 0
    assert failed["skipped_ticks"] == 0 and failed["skipped"] == {}
    assert failed["hand_off"] is None  # it runs its work itself
    assert failed["task"] is None  # declared in code
    assert (failed["overlap"], failed["jitter"]) == ("skip", None)  # the defaults
    assert failed["schedule"].startswith("cron '30 * * * *' UTC")


async def test_get_one_job() -> None:
    """GET /jobs/{name} returns that job's object."""
    async with serve(make_app()) as client:
        await anyio.sleep(HOUR + 120)
        response = await client.get("/jobs/expire_sessions")
    assert response.status_code == 200
    job = response.json()
    assert job["name"] == "expire_sessions"
    assert job["last_outcome"] == "ok"
    assert job["last_duration_s"] == pytest.approx(90)
    assert job["last_finished_at"] == "2026-03-02T01:01:30Z"


async def test_unknown_job_is_a_404_that_lists_the_jobs() -> None:
    """An unknown name is a 404 whose message names the known jobs."""
    async with serve(make_app()) as client:
        response = await client.get("/jobs/nope")
    assert response.status_code == 404
    assert response.json() == {
        "detail": "no job named 'nope'; the jobs are: 'expire_sessions', 'flaky'"
    }


async def test_router_takes_the_apps_dependencies() -> None:
    """include_router(..., dependencies=[...]) protects the status endpoints."""

    async def require_admin(x_token: str | None = Header(default=None)) -> None:
        if x_token != "secret":
            raise HTTPException(status_code=401, detail="admin only")

    app = make_app(dependencies=[Depends(require_admin)])
    async with serve(app) as client:
        assert (await client.get("/jobs")).status_code == 401
        assert (await client.get("/jobs/flaky")).status_code == 401
        assert (await client.get("/jobs", headers={"x-token": "secret"})).status_code == 200


async def test_openapi_documents_the_status_models() -> None:
    """The response models appear on the OpenAPI page."""
    async with serve(make_app()) as client:
        spec = (await client.get("/openapi.json")).json()
    assert "JobStatus" in spec["components"]["schemas"]
    props = spec["components"]["schemas"]["JobStatus"]["properties"]
    assert set(props) == FIELDS
    assert set(props["last_outcome"]["anyOf"][0]["enum"]) == {
        "ok",
        "failed",
        "timed_out",
        "cancelled",
    }
    assert "/jobs/{name}" in spec["paths"]
    assert "404" in spec["paths"]["/jobs/{name}"]["get"]["responses"]


async def test_requests_are_served_while_a_job_fails() -> None:
    """A failing job never affects requests."""
    app = make_app()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async with serve(app) as client:
        for _ in range(3):
            await anyio.sleep(HOUR)
            assert (await client.get("/health")).json() == {"status": "ok"}
        assert (await client.get("/jobs/flaky")).json()["failures"] == 3


async def test_each_answer_names_the_process_whose_figures_it_gives() -> None:
    """Every job object carries `instance`: the counts are that process's own."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def job() -> None:
        pass

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    async with serve(app) as client:
        listed = (await client.get("/jobs")).json()
        one = (await client.get("/jobs/job")).json()
    assert listed[0]["instance"] == one["instance"] == scheduler.instance.id
    assert f":{os.getpid()}:" in one["instance"]


async def test_a_404_echoes_neither_a_huge_name_nor_every_job() -> None:
    """A 60,000-character name comes back cut, and the list of jobs is capped."""
    scheduler = virtual_scheduler()
    for k in range(30):

        async def job() -> None:
            pass

        scheduler.add_job(job, Every(hours=1), name=f"job{k}")
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    async with serve(app) as client:
        response = await client.get("/jobs/" + "x" * 60_000)
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert len(detail) < 600
    assert "60000 characters" in detail and "and 10 more" in detail


class FarFuture(Schedule):
    """A user's schedule whose next tick no datetime can hold."""

    def next_after(self, ts: float) -> float:
        return 1e15

    def describe(self) -> str:
        return "in the far future"


async def test_one_far_future_schedule_does_not_break_the_status_of_every_job() -> None:
    """GET /jobs answers even when one job's next tick is past year 9999."""
    scheduler = virtual_scheduler()

    async def far() -> None:
        pass

    async def near() -> None:
        pass

    scheduler.add_job(far, FarFuture())
    scheduler.add_job(near, Every(hours=1))
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    async with serve(app) as client:
        await anyio.sleep(10)
        response = await client.get("/jobs")
    assert response.status_code == 200
    far_status, near_status = response.json()
    assert far_status["next_run_at"] is None
    assert near_status["next_run_at"] == "2026-03-02T01:00:00Z"


def routed(scheduler: Scheduler, **app: Any) -> FastAPI:
    made = FastAPI(**app)
    made.include_router(scheduler.router)
    made.include_router(scheduler.control_router(public=True))
    return made


async def test_a_router_whose_scheduler_never_started_says_why_and_what_to_write(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The router included and the lifespan forgotten: /jobs says so in a header
    and in each job, with what to write; the page says it in a banner; the log
    says it once, at ERROR, at the first request, not at each one."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def beat() -> None: ...

    async with serve(routed(scheduler)) as client:  # FastAPI() without its lifespan
        answers = [await client.get(url) for url in ("/jobs", "/jobs/beat", "/jobs/instances")]
        page = await client.get("/jobs/ui")
        refused = await client.post("/jobs/beat/run")
        again = await client.get("/jobs")
    for answer in (*answers, again):
        assert answer.headers["x-scheduler"] == (
            "never started, so no job runs: the app did not run scheduler.lifespan; "
            "write FastAPI(lifespan=scheduler.lifespan)"
        )
    (job,) = answers[0].json()
    assert (job["scheduler"], job["next_run_at"]) == ("never_started", None)
    assert answers[1].json()["scheduler"] == "never_started"
    assert refused.status_code == 503
    banner = page.text.partition('<p class="notice trouble" role="alert">')[2].partition("</p>")[0]
    assert banner.startswith("The scheduler never started, so no job runs: this app did not run")
    assert "<code>FastAPI(lifespan=scheduler.lifespan)</code>" in banner
    assert "scheduler never started</strong>" in page.text
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [f"GET /jobs: {NEVER_STARTED}"]
    assert NEVER_STARTED.startswith("the scheduler never started, so no job runs")
    assert "Write FastAPI(lifespan=scheduler.lifespan)" in NEVER_STARTED


async def test_a_scheduler_stopped_after_running_is_not_one_that_never_started(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the app runs, the header says running; once its lifespan has ended
    (the app shutting down), stopped: no banner and no log line of a lifespan
    forgotten."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def beat() -> None: ...

    app = routed(scheduler, lifespan=scheduler.lifespan)
    async with serve(app) as client:
        running = await client.get("/jobs")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        stopped = await client.get("/jobs")
        page = await client.get("/jobs/ui")
    assert running.headers["x-scheduler"] == "running"
    assert running.json()[0]["scheduler"] == "running"
    assert stopped.headers["x-scheduler"] == "stopped: the app is shutting down"
    assert stopped.json()[0]["scheduler"] == "stopped"
    assert "The scheduler has stopped: the app is shutting down." in page.text
    assert "never started" not in page.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
