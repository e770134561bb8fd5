"""Operating jobs in one process, on virtual time: trigger, pause and resume,
retries within the tick, the run history, and the control router's guards."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.routing import APIRoute

from fastapi_jobs import (
    ConfigurationError,
    Every,
    JobContext,
    JobNotFoundError,
    JobRunningError,
    NotRunningError,
    Scheduler,
)

from ..conftest import HOUR, START, serve, virtual_scheduler

pytestmark = pytest.mark.looptime


async def require_admin(x_token: str | None = Header(default=None)) -> None:
    if x_token != "secret":
        raise HTTPException(status_code=401, detail="admin only")


ADMIN = {"x-token": "secret"}


def make_app(scheduler: Scheduler) -> FastAPI:
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    app.include_router(scheduler.control_router(dependencies=[Depends(require_admin)]))
    return app


def at(hours: float) -> str:
    return (START + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


# -- the control router's guards ---------------------------------------------


def test_control_router_without_auth_is_refused_unless_public_on_purpose() -> None:
    scheduler = virtual_scheduler()
    with pytest.raises(ConfigurationError, match=r"anyone .* public=True"):
        scheduler.control_router()
    with pytest.raises(ConfigurationError):
        scheduler.control_router(dependencies=[])
    routes = {
        (r.path, tuple(sorted(r.methods or ())))
        for r in scheduler.control_router(public=True).routes
        if isinstance(r, APIRoute)
    }
    assert routes == {
        ("/jobs/{name}/run", ("POST",)),
        ("/jobs/{name}/pause", ("POST",)),
        ("/jobs/{name}/resume", ("POST",)),
        ("/jobs/{name}/backfill", ("POST",)),
        ("/jobs/schedules", ("POST",)),
        ("/jobs/schedules", ("PUT",)),
        ("/jobs/schedules/{name}", ("PATCH",)),
        ("/jobs/schedules/{name}", ("DELETE",)),
    }


async def test_control_endpoints_answer_401_without_the_apps_auth() -> None:
    scheduler = virtual_scheduler()
    ran: list[datetime] = []

    @scheduler.every(hours=1)
    async def digest(ctx: JobContext) -> None:
        ran.append(ctx.tick)

    async with serve(make_app(scheduler)) as client:
        for action in ("run", "pause", "resume"):
            response = await client.post(f"/jobs/digest/{action}")
            assert response.status_code == 401, action
        assert (await client.get("/jobs/digest")).json()["paused"] is False
    assert ran == []


# -- trigger -------------------------------------------------------------------


async def test_trigger_runs_the_job_in_its_task_and_answers_202_then_200_with_wait() -> None:
    scheduler = virtual_scheduler()
    seen: list[tuple[datetime, bool]] = []

    @scheduler.every(hours=1, name="running")  # "/run" in its URL twice
    async def digest(ctx: JobContext) -> None:
        seen.append((ctx.tick, ctx.manual))
        await anyio.sleep(5)

    async with serve(make_app(scheduler)) as client:
        await anyio.sleep(60)
        started = await client.post("/jobs/running/run", headers=ADMIN)
        assert started.status_code == 202
        body = started.json()
        assert body["job"] == "running" and body["tick"] == "2026-03-02T00:01:00Z"
        assert body["runs"] == "/jobs/running/runs"
        assert body["id"].startswith(scheduler.instance.id + "#")
        status = (await client.get("/jobs/running")).json()
        assert status["running"] is True
        await anyio.sleep(10)
        waited = await client.post("/jobs/running/run?wait=true", headers=ADMIN)
        assert waited.status_code == 200
        assert waited.json()["outcome"] == "ok" and waited.json()["attempts"] == 1
        assert waited.json()["duration_s"] == pytest.approx(5)
        runs = (await client.get("/jobs/running/runs")).json()
    assert seen == [(START + timedelta(minutes=1), True), (START + timedelta(seconds=70), True)]
    assert [run["manual"] for run in runs] == [True, True]
    assert runs[1]["id"] == body["id"]  # newest first


async def test_a_triggered_runs_link_is_a_url_that_answers_for_any_name() -> None:
    """The ``runs`` link of a job whose name a URL must escape (non-ASCII, a
    space, ``%``, ``?``, ``#``) is encoded: followed, it answers."""
    scheduler = virtual_scheduler()
    name = "ünï cødé 🚀 %2F?#"

    @scheduler.every(hours=1, name=name)
    async def digest() -> None: ...

    async with serve(make_app(scheduler)) as client:
        await anyio.sleep(1)
        started = await client.post(f"/jobs/{quote(name, safe='')}/run", headers=ADMIN)
        assert started.status_code == 202, started.text
        link = started.json()["runs"]
        assert link == f"/jobs/{quote(name, safe='')}/runs"
        await anyio.sleep(1)
        runs = await client.get(link)
    assert runs.status_code == 200 and len(runs.json()) == 1


async def test_trigger_while_running_is_409_with_when_it_started() -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def digest() -> None:
        await anyio.sleep(600)

    async with serve(make_app(scheduler)) as client:
        await anyio.sleep(HOUR + 30)  # the 1:00 tick runs till 1:10
        response = await client.post("/jobs/digest/run", headers=ADMIN)
        assert response.status_code == 409
        body = response.json()  # `detail` a string, as in every other error; times in Z
        assert body["started_at"] == "2026-03-02T01:00:00Z"
        assert body["instance"] == scheduler.instance.id
        assert "is running" in body["detail"]
        with pytest.raises(JobRunningError):
            await scheduler.trigger("digest")


async def test_a_tick_during_a_triggered_run_is_dropped_as_overlap() -> None:
    scheduler = virtual_scheduler()
    runs: list[bool] = []

    @scheduler.every(hours=1)
    async def digest(ctx: JobContext) -> None:
        runs.append(ctx.manual)
        await anyio.sleep(120)

    async with scheduler.running():
        await anyio.sleep(HOUR - 60)
        await scheduler.trigger("digest")  # runs 0:59..1:01: the 1:00 tick is dropped
        await anyio.sleep(HOUR + 120)  # the 2:00 tick runs
        assert scheduler.job_status("digest").skipped == {"overlap": 1}
    assert runs == [True, False]


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


async def test_a_job_first_woken_by_a_request_does_not_carry_its_context() -> None:
    """A job's first run is a trigger over HTTP, whose request set a context
    variable: neither that run nor the scheduled ones after it see the request's
    value (each job's task starts from the scheduler's context)."""
    scheduler = virtual_scheduler()
    seen: list[str] = []

    @scheduler.every(hours=1)
    async def digest() -> None:
        seen.append(REQUEST_ID.get())

    app = make_app(scheduler)

    @app.middleware("http")
    async def tag(request: Request, call_next: Any) -> Any:
        REQUEST_ID.set("req-1")
        return await call_next(request)

    async with serve(app) as client:
        answer = await client.post("/jobs/digest/run?wait=true", headers=ADMIN)
        assert answer.status_code == 200
        await anyio.sleep(2 * HOUR + 1)
    assert seen == ["-", "-", "-"]


async def test_unknown_job_is_404_with_the_names_and_trigger_needs_a_running_app() -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    with pytest.raises(NotRunningError, match="not running"):
        await scheduler.trigger("digest")
    async with serve(make_app(scheduler)) as client:
        for action in ("run", "pause", "resume"):
            response = await client.post(f"/jobs/<script>/{action}", headers=ADMIN)
            assert response.status_code == 404
            assert response.json()["detail"] == "no job named '<script>'; the jobs are: 'digest'"
        assert (await client.get("/jobs/nope/runs")).status_code == 404
    with pytest.raises(JobNotFoundError):
        await scheduler.pause("nope")


# -- pause and resume --------------------------------------------------------------


async def test_pause_skips_ticks_and_counts_them_and_resume_runs_the_next() -> None:
    scheduler = virtual_scheduler()
    ran: list[datetime] = []

    @scheduler.every(hours=1)
    async def digest(ctx: JobContext) -> None:
        ran.append(ctx.tick)

    async with serve(make_app(scheduler)) as client:
        await anyio.sleep(30)
        paused = await client.post("/jobs/digest/pause", headers=ADMIN)
        assert paused.status_code == 200
        assert paused.json() == {"job": "digest", "paused": True, "until": None, "scope": "process"}
        again = await client.post("/jobs/digest/pause", headers=ADMIN)
        assert again.status_code == 200 and again.json() == paused.json()  # idempotent
        await anyio.sleep(3 * HOUR)  # 1:00, 2:00, 3:00 skipped
        status = (await client.get("/jobs/digest")).json()
        assert status["paused"] is True and status["skipped"] == {"paused": 3}
        assert status["next_run_at"] == at(4)  # still placed on its schedule
        resumed = await client.post("/jobs/digest/resume", headers=ADMIN)
        assert resumed.json()["paused"] is False
        await anyio.sleep(HOUR)
    assert ran == [START + timedelta(hours=4)]


async def test_a_pause_with_an_end_is_a_maintenance_window() -> None:
    scheduler = virtual_scheduler()
    ran: list[datetime] = []

    @scheduler.every(hours=1)
    async def digest(ctx: JobContext) -> None:
        ran.append(ctx.tick)

    async with serve(make_app(scheduler)) as client:
        until = at(2.5)
        response = await client.post("/jobs/digest/pause", params={"until": until}, headers=ADMIN)
        assert response.json()["until"] == until
        await anyio.sleep(4 * HOUR + 1)
        status = (await client.get("/jobs/digest")).json()
        assert status["paused"] is False and status["paused_until"] is None
    assert ran == [START + timedelta(hours=3), START + timedelta(hours=4)]


@pytest.mark.parametrize(
    ("until", "message"),
    [
        ("2026-03-01T00:00:00Z", "not in the future"),
        ("2026-03-02T00:00:00Z", "not in the future"),  # now
        ("2026-03-02T05:00:00", "no time zone"),
        # Past what a datetime holds in UTC: it would read back as "until resumed".
        ("9999-12-31T23:00:00-05:00", "too far away"),
        # Before what a datetime holds in UTC: long past, not far away.
        ("0001-01-01T00:00:00+05:00", "not in the future"),
    ],
)
async def test_a_pause_ending_in_the_past_or_without_a_zone_is_422(
    until: str, message: str
) -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    async with serve(make_app(scheduler)) as client:
        response = await client.post("/jobs/digest/pause", params={"until": until}, headers=ADMIN)
        assert response.status_code == 422
        assert message in response.json()["detail"]
        assert (await client.get("/jobs/digest")).json()["paused"] is False  # nothing changed
        bad = await client.post("/jobs/digest/pause", params={"until": "soon"}, headers=ADMIN)
        assert bad.status_code == 422
        huge = "2026-" + "9" * 5_000
        long = await client.post("/jobs/digest/pause", params={"until": huge}, headers=ADMIN)
        assert long.status_code == 422 and "is not an ISO 8601 instant" in long.text
        assert len(long.text) < 300  # said, not echoed
    with pytest.raises(ConfigurationError, match="aware datetime"):
        await scheduler.pause("digest", until="tomorrow")  # type: ignore[arg-type]


async def test_a_pause_until_sent_unencoded_reads_its_offset() -> None:
    """`?until=...+00:00` typed into a URL arrives as `... 00:00` (a '+' is a space
    in a query string): it is read as the offset it was, not refused."""
    scheduler = virtual_scheduler()

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    async with serve(make_app(scheduler)) as client:
        response = await client.post(
            "/jobs/digest/pause?until=2026-03-02T05:00:00+00:00", headers=ADMIN
        )
        assert response.status_code == 200, response.text
        assert response.json()["until"] == "2026-03-02T05:00:00Z"


async def test_a_job_declared_paused_waits_for_an_operator() -> None:
    scheduler = virtual_scheduler()
    ran: list[datetime] = []

    @scheduler.every(hours=1, paused=True)
    async def backfill(ctx: JobContext) -> None:
        ran.append(ctx.tick)

    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 1)
        assert scheduler.job_status("backfill").paused is True
        assert scheduler.job_status("backfill").skipped == {"paused": 2}
        state = await scheduler.resume("backfill")
        assert state.paused is False and state.scope == "process"
        await anyio.sleep(HOUR)
    assert ran == [START + timedelta(hours=3)]


async def test_a_paused_job_can_still_be_triggered() -> None:
    scheduler = virtual_scheduler()
    ran: list[bool] = []

    @scheduler.every(hours=1, paused=True)
    async def backfill(ctx: JobContext) -> None:
        ran.append(ctx.manual)

    async with scheduler.running():
        result = await (await scheduler.trigger("backfill")).wait()
        assert result is not None and result.ok
    assert ran == [True]


# -- retries -------------------------------------------------------------------------


def failing(scheduler: Scheduler, times: int) -> Callable[..., object]:
    """A job that fails its first ``times`` calls; ``job.calls``: when each came."""
    calls: list[datetime] = []

    async def job(ctx: JobContext) -> None:
        calls.append(datetime.fromtimestamp(scheduler.clock.now(), UTC))
        if len(calls) <= times:
            raise ConnectionError("smtp refused")

    job.calls = calls  # type: ignore[attr-defined]
    return job


async def test_a_failed_run_is_retried_with_backoff_and_the_tick_has_one_entry() -> None:
    scheduler = virtual_scheduler()
    job = failing(scheduler, 2)
    scheduler.add_job(job, Every(hours=1), name="digest", retries=3, retry_backoff=10)

    async with scheduler.running():
        await anyio.sleep(HOUR + 120)
        status = scheduler.job_status("digest")
        runs = await scheduler.runs("digest")
    first, second, third = job.calls  # type: ignore[attr-defined]
    assert 5 <= (second - first).total_seconds() <= 10  # backoff 10 s, jittered to [5, 10]
    assert 10 <= (third - second).total_seconds() <= 20  # doubled
    assert status.last_outcome == "ok" and status.retries == 2 and status.runs == 3
    assert len(runs) == 1
    assert runs[0].attempts == 3 and runs[0].outcome == "ok"
    assert runs[0].duration_s == pytest.approx((third - first).total_seconds())


async def test_retries_stop_before_the_next_tick(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = virtual_scheduler()
    job = failing(scheduler, 100)
    scheduler.add_job(job, Every(minutes=1), name="sync", retries=5, retry_backoff=20)

    with caplog.at_level(logging.WARNING):
        async with scheduler.running():
            await anyio.sleep(125)  # the 0:01 tick: tries at 0:01:00, 0:01:10-20, 0:01:30-2:00
    calls = job.calls  # type: ignore[attr-defined]
    # A retry that would start at or after the 0:02 tick is dropped (the fourth
    # try always would: it waits 40-80 s more).
    assert 2 <= len([c for c in calls if c < START + timedelta(minutes=2)]) <= 3
    assert "dropped: it would not end before the job's next tick" in caplog.text
    runs = await scheduler.runs("sync")
    assert runs[-1].outcome == "failed" and runs[-1].attempts >= 2


async def test_no_retry_starts_that_would_not_end_before_the_next_tick() -> None:
    """A retry starts only if, at the pace of the attempt that failed, it ends
    before the job's next tick: that tick runs as usual, never dropped as overlap."""
    scheduler = virtual_scheduler()
    starts: list[float] = []

    async def slow_failure() -> None:
        starts.append(scheduler.clock.now())
        await anyio.sleep(50)
        raise ConnectionError("upstream")

    scheduler.add_job(slow_failure, Every(minutes=1), retries=3, retry_backoff=1)
    async with scheduler.running():
        await anyio.sleep(60 + 65)  # the 0:01 and 0:02 ticks
    first = START.timestamp() + 60
    # 0:01:00 fails at 0:01:50: a retry of 50 s would end past 0:02, so none starts.
    assert starts == [first, first + 60]
    assert scheduler.job_status("slow_failure").skipped == {}


async def test_retries_of_a_job_every_2s_never_cost_a_tick() -> None:
    """A job every 2 s that fails after 0.3 s, with 5 retries 0.5 s apart: every tick
    runs, and every attempt of a tick ends before the next one."""
    scheduler = virtual_scheduler()
    attempts: list[tuple[float, float, float]] = []  # (tick, start, end)

    async def flaky(ctx: JobContext) -> None:
        started = scheduler.clock.now()
        await anyio.sleep(0.3)
        attempts.append((ctx.tick.timestamp(), started, scheduler.clock.now()))
        raise ConnectionError("upstream")

    scheduler.add_job(flaky, Every(seconds=2), retries=5, retry_backoff=0.5)
    async with scheduler.running():
        await anyio.sleep(32.5)
    status = scheduler.job_status("flaky")
    ticks = sorted({tick for tick, _, _ in attempts})
    assert len(ticks) == 16 and status.skipped == {}
    assert all(end < tick + 2 for tick, _, end in attempts)
    assert len(attempts) > len(ticks)  # and they were retried


async def test_a_retry_still_going_at_the_next_tick_is_cut_and_the_tick_runs() -> None:
    """An attempt that fails fast is retried; a retry that runs on is cut just before
    the job's next tick (recorded as timed out), and that tick runs on time."""
    scheduler = virtual_scheduler()
    runs: list[tuple[int, float]] = []

    async def job(ctx: JobContext) -> None:
        runs.append((len(runs), scheduler.clock.now() - START.timestamp()))
        if len(runs) == 1:
            raise ConnectionError("upstream")  # at once: the retry looks affordable
        if len(runs) == 2:
            await anyio.sleep(3600)  # the retry hangs

    scheduler.add_job(job, Every(minutes=1), retries=3, retry_backoff=1)
    async with scheduler.running():
        await anyio.sleep(60 + 65)
        history = await scheduler.runs("job")
    assert [at for _, at in runs][2] == 120  # the 0:02 tick ran on time
    assert scheduler.job_status("job").skipped == {}
    cut = history[-1]  # the 0:01 tick's entry
    assert cut.outcome == "timed_out" and cut.attempts == 2
    assert cut.error is not None and "cut before the job's next tick" in cut.error.message
    assert cut.finished_at is not None and cut.finished_at < START + timedelta(minutes=2)


async def test_without_ticking_retries_still_end_before_the_next_tick() -> None:
    """`running(ticking=False)` (the CLI's run) has no timer, and retries are bounded
    by the job's next tick all the same."""
    scheduler = virtual_scheduler()
    job = failing(scheduler, 100)
    scheduler.add_job(job, Every(minutes=1), name="sync", retries=50, retry_backoff=5)
    async with scheduler.running(ticking=False):
        await anyio.sleep(30)  # 0:00:30: the next tick is 0:01
        result = await (await scheduler.trigger("sync")).wait()
    assert result is not None and result.outcome == "failed"
    calls = job.calls  # type: ignore[attr-defined]
    assert calls[-1] < START + timedelta(minutes=1) and 2 <= len(calls) <= 4


async def test_a_timeout_is_retried_unless_the_job_says_otherwise() -> None:
    scheduler = virtual_scheduler()
    calls: dict[str, int] = {"slow": 0, "slow_once": 0}

    async def slow() -> None:
        calls["slow"] += 1
        await anyio.sleep(60)

    async def slow_once() -> None:
        calls["slow_once"] += 1
        await anyio.sleep(60)

    scheduler.add_job(slow, Every(hours=1), timeout=5, retries=2, retry_backoff=1)
    scheduler.add_job(
        slow_once, Every(hours=1), timeout=5, retries=2, retry_backoff=1, retry_timeouts=False
    )
    async with scheduler.running():
        await anyio.sleep(HOUR + 120)
    assert calls == {"slow": 3, "slow_once": 1}
    assert (await scheduler.runs("slow"))[0].attempts == 3


async def test_shutdown_does_not_wait_for_a_retry() -> None:
    scheduler = virtual_scheduler()
    job = failing(scheduler, 100)
    scheduler.add_job(job, Every(hours=1), name="digest", retries=5, retry_backoff=600)
    async with scheduler.running():
        await anyio.sleep(HOUR + 1)
        stop_at = anyio.current_time()
    assert anyio.current_time() - stop_at < 1  # not the ~10 minutes of the backoff
    assert len(job.calls) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("retries", [-1, 101, 1.5, True, "3"])
def test_retries_out_of_range_are_refused_with_the_range(retries: object) -> None:
    scheduler = virtual_scheduler()
    with pytest.raises(ConfigurationError, match="from 0 to 100"):
        scheduler.add_job(lambda: None, Every(hours=1), name="x", retries=retries)  # type: ignore[arg-type]


def test_a_negative_backoff_is_refused() -> None:
    scheduler = virtual_scheduler()
    with pytest.raises(ConfigurationError, match="retry_backoff"):
        scheduler.add_job(lambda: None, Every(hours=1), name="x", retry_backoff=-1)


# -- history -------------------------------------------------------------------------


async def test_history_without_a_store_keeps_the_last_50_newest_first() -> None:
    scheduler = virtual_scheduler()

    @scheduler.every(minutes=1)
    async def tick(ctx: JobContext) -> None:
        if ctx.tick.minute % 2:
            raise ValueError(f"odd minute <b>{ctx.tick.minute}</b>")

    async with serve(make_app(scheduler)) as client:
        await anyio.sleep(60 * 60 + 1)
        runs = (await client.get("/jobs/tick/runs", params={"limit": 1000})).json()
        three = (await client.get("/jobs/tick/runs", params={"limit": 3})).json()
        for limit in (0, 1001, "x"):
            bad = await client.get("/jobs/tick/runs", params={"limit": limit})
            assert bad.status_code == 422
    assert len(runs) == 50
    assert [r["tick"] for r in runs[:3]] == [at(1), at(59 / 60), at(58 / 60)]
    assert three == runs[:3]
    assert runs[1]["outcome"] == "failed"
    assert runs[1]["error"] == {"type": "ValueError", "message": "odd minute <b>59</b>"}
    assert runs[0]["outcome"] == "ok" and runs[0]["error"] is None
    assert all(r["instance"] == scheduler.instance.id and r["fence"] is None for r in runs)
    with pytest.raises(ConfigurationError, match="from 1 to 1000"):
        await scheduler.runs("tick", limit=0)


async def test_history_keeps_as_many_runs_as_asked_and_zero_keeps_none() -> None:
    for keep in (3, 0):
        scheduler = virtual_scheduler(history=keep)

        @scheduler.every(minutes=1)
        async def tick() -> None: ...

        async with scheduler.running():
            await anyio.sleep(10 * 60 + 1)
        runs = await scheduler.runs("tick")
        assert [r.tick for r in runs] == [START + timedelta(minutes=m) for m in (10, 9, 8)][:keep]


@pytest.mark.parametrize("history", [-1, 10_001, True, 2.0])
def test_history_out_of_range_is_refused(history: object) -> None:
    with pytest.raises(ConfigurationError, match="from 0 to 10000"):
        virtual_scheduler(history=history)
