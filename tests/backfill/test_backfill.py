"""Backfill in one process, on virtual time: the ticks of a past range run
oldest first, each by the job's task as a trigger's run (``ctx.manual``), the
bad inputs refused naming their bound, a live tick during a backfill run
dropped as overlap, a stop mid-backfill; and the control endpoint."""

from __future__ import annotations

from datetime import datetime, timedelta

import anyio
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException

from fastapi_jobs import (
    BackfillResult,
    ConfigurationError,
    JobContext,
    JobNotFoundError,
    JobRunningError,
    NotRunningError,
    Scheduler,
)

from ..conftest import HOUR, START, serve, virtual_scheduler

pytestmark = pytest.mark.looptime

NOW = START + timedelta(days=1)  # where the tests' backfills start from


def hours(n: float) -> datetime:
    return START + timedelta(hours=n)


def hourly(seen: list[tuple[float, bool]], took: float = 1.0) -> Scheduler:
    scheduler = virtual_scheduler(NOW)

    @scheduler.every(hours=1)
    async def report(ctx: JobContext) -> None:
        seen.append((ctx.tick.timestamp(), ctx.manual))
        await anyio.sleep(took)
        if ctx.tick == hours(3):
            raise ValueError("tick 3 fails")

    return scheduler


async def test_each_tick_of_the_range_runs_once_oldest_first_as_a_run_by_hand() -> None:
    seen: list[tuple[float, bool]] = []
    scheduler = hourly(seen)
    told: list[tuple[int, int, str]] = []
    async with scheduler.running(ticking=False):
        result = await scheduler.backfill(
            "report",
            hours(1),
            hours(4),
            progress=lambda n, count, tick: told.append((n, count, tick.describe())),
        )
    assert isinstance(result, BackfillResult)
    assert [tick for tick, _ in seen] == [hours(h).timestamp() for h in (1, 2, 3, 4)]
    assert all(manual for _, manual in seen)
    assert (result.ticks, result.ran, result.failed, result.ok) == (4, 3, 1, False)
    assert [t.outcome for t in result.outcomes] == ["ok", "ok", "failed", "ok"]
    assert [(n, count) for n, count, _ in told] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert told[2][2] == "failed: ValueError: tick 3 fails" and told[0][2] == "ok 1.00s"
    history = await scheduler.runs("report")
    assert sorted(r.tick for r in history if r.tick is not None) == [hours(h) for h in (1, 2, 3, 4)]
    assert all(r.manual for r in history)


async def test_a_range_between_ticks_and_a_range_of_one_instant() -> None:
    seen: list[tuple[float, bool]] = []
    scheduler = hourly(seen)
    async with scheduler.running(ticking=False):
        none = await scheduler.backfill("report", hours(1.2), hours(1.8))
        one = await scheduler.backfill("report", hours(2), hours(2))
    assert (none.ticks, none.ok, one.ticks, one.ran) == (0, True, 1, 1)
    assert [tick for tick, _ in seen] == [hours(2).timestamp()]


@pytest.mark.parametrize(
    ("since", "until", "options", "said"),
    [
        (
            hours(1).replace(tzinfo=None),
            hours(2),
            {},
            "since=2026-03-02T01:00:00): the datetime has no time zone",
        ),
        (
            hours(2),
            hours(1),
            {},
            "the range is reversed: since=2026-03-02T02:00:00+00:00 is "
            "after until=2026-03-02T01:00:00+00:00",
        ),
        (hours(1), NOW + timedelta(seconds=1), {}, "the range must be in the past"),
        (
            hours(0),
            hours(23),
            {"max_ticks": 10},
            "the range has more than max_ticks=10 ticks of job 'report'",
        ),
        (hours(0), hours(1), {"max_ticks": 0}, "max_ticks=0): the most ticks to run"),
        (hours(0), hours(1), {"max_ticks": True}, "max_ticks=True)"),
        # A billion would list a billion ticks before the first run: bounded.
        (hours(0), hours(1), {"max_ticks": 10**9}, "a whole number from 1 to 100,000"),
        ("2026-03-02", hours(1), {}, "since='2026-03-02'): pass an aware datetime"),
    ],
)
async def test_bad_input_is_refused_naming_the_bound(
    since: object, until: datetime, options: dict[str, object], said: str
) -> None:
    scheduler = hourly([])
    async with scheduler.running(ticking=False):
        with pytest.raises(ConfigurationError) as caught:
            await scheduler.backfill("report", since, until, **options)  # type: ignore[arg-type]
    assert said in str(caught.value)


async def test_unknown_job_and_a_scheduler_not_running() -> None:
    scheduler = hourly([])
    with pytest.raises(NotRunningError, match="not running"):
        await scheduler.backfill("report", hours(1), hours(2))
    async with scheduler.running(ticking=False):
        with pytest.raises(JobNotFoundError):
            await scheduler.backfill("nope", hours(1), hours(2))
    # A thousand ticks are allowed; the count stops one past max_ticks.
    async with scheduler.running(ticking=False):
        with pytest.raises(ConfigurationError, match="more than max_ticks=1000"):
            await scheduler.backfill("report", NOW - timedelta(days=365), NOW)


async def test_a_live_tick_during_a_backfill_run_is_dropped_as_overlap() -> None:
    """Each backfill run is the job's task's: the live tick at NOW + 1 h meets it."""
    seen: list[tuple[float, bool]] = []
    scheduler = hourly(seen, took=HOUR * 0.75)
    async with scheduler.running():
        result = await scheduler.backfill("report", hours(1), hours(2))
        status = scheduler.job_status("report")
    assert result.ran == 2
    assert status.skipped["overlap"] == 1
    # No run went beside another: each started after the one before had ended.
    assert [manual for _, manual in seen] == [True, True]


async def test_a_backfill_that_the_stop_meets_says_why_it_stopped() -> None:
    seen: list[tuple[float, bool]] = []
    scheduler = hourly(seen, took=10.0)
    results: list[BackfillResult] = []
    async with anyio.create_task_group() as tg:

        async def app() -> None:
            async with scheduler.running(ticking=False):
                tg.start_soon(backfill)
                await anyio.sleep(15.0)  # then the app stops, the second run going

        async def backfill() -> None:
            results.append(await scheduler.backfill("report", hours(1), hours(5)))

        tg.start_soon(app)
    (result,) = results
    assert [t.outcome for t in result.outcomes] == ["ok", "ok", "not_run"]
    assert result.stopped == "the app is stopping" and not result.ok
    assert len(seen) == 2


async def test_one_backfill_of_a_job_at_a_time() -> None:
    scheduler = hourly([], took=10.0)
    async with scheduler.running(ticking=False), anyio.create_task_group() as tg:
        tg.start_soon(scheduler.backfill, "report", hours(1), hours(2))
        await anyio.sleep(1.0)
        with pytest.raises(JobRunningError, match="a backfill of job 'report' is going"):
            await scheduler.backfill("report", hours(1), hours(2))


# -- the control endpoint ------------------------------------------------------


async def require_admin(x_token: str | None = Header(default=None)) -> None:
    if x_token != "secret":
        raise HTTPException(status_code=401, detail="admin only")


ADMIN = {"x-token": "secret"}


async def test_the_endpoint_starts_a_backfill_202_409_422_401() -> None:
    seen: list[tuple[float, bool]] = []
    scheduler = hourly(seen, took=10.0)
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    app.include_router(scheduler.control_router(dependencies=[Depends(require_admin)]))
    body = {"since": "2026-03-02T01:00:00Z", "until": "2026-03-02T04:00:00Z"}
    async with serve(app) as client:
        assert (await client.post("/jobs/report/backfill", json=body)).status_code == 401
        answer = await client.post("/jobs/report/backfill", json=body, headers=ADMIN)
        assert answer.status_code == 202, answer.text
        assert answer.json() == {
            "job": "report",
            "ticks": 4,
            "since": "2026-03-02T01:00:00Z",
            "until": "2026-03-02T04:00:00Z",
            "runs": "/jobs/report/runs",
        }
        again = await client.post("/jobs/report/backfill", json=body, headers=ADMIN)
        assert again.status_code == 409 and "is going already" in again.json()["detail"]
        bad = {
            "since": {**body, "since": "yesterday"},
            "until": {**body, "until": "2027-01-01T00:00:00Z"},
            "max_ticks": {**body, "max_ticks": "many"},
            "extra": {**body, "when": 1},
        }
        for what, sent in bad.items():
            refused = await client.post("/jobs/other/backfill", json=sent, headers=ADMIN)
            assert refused.status_code in (404, 422), (what, refused.text)
            refused = await client.post("/jobs/report/backfill", json=sent, headers=ADMIN)
            assert refused.status_code in (409, 422), (what, refused.text)
        huge = await client.post(
            "/jobs/report/backfill",
            content=b"{" + b" " * 2000 + b"}",
            headers={**ADMIN, "content-type": "application/json"},
        )
        assert huge.status_code == 422 and "more than 1024 bytes" in huge.json()["detail"]
        await anyio.sleep(60.0)  # the four runs
        runs = (await client.get("/jobs/report/runs")).json()
        assert len(runs) == 4
        unknown = await client.post("/jobs/nope/backfill", json=body, headers=ADMIN)
        assert unknown.status_code == 404
        for what, sent in bad.items():
            refused = await client.post("/jobs/report/backfill", json=sent, headers=ADMIN)
            assert refused.status_code == 422, (what, refused.text)
    assert [tick for tick, _ in seen] == [hours(h).timestamp() for h in (1, 2, 3, 4)]


async def test_a_backfill_started_over_http_stops_with_the_app() -> None:
    """The app stops during the second run: it ends, no later tick starts, and
    the stop is not held up by the rest of the range."""
    seen: list[tuple[float, bool]] = []
    scheduler = hourly(seen, took=10.0)
    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.control_router(public=True))
    body = {"since": "2026-03-02T01:00:00Z", "until": "2026-03-02T05:00:00Z"}
    async with serve(app) as client:
        answer = await client.post("/jobs/report/backfill", json=body)
        assert answer.status_code == 202, answer.text
        await anyio.sleep(15.0)
    assert [tick for tick, _ in seen] == [hours(1).timestamp(), hours(2).timestamp()]
    assert scheduler.job_status("report").last_outcome == "ok"  # the second ran to its end
