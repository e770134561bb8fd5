"""Overlap policies and jitter in one process, on virtual time (looptime)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from fastapi import FastAPI

from fastapi_jobs import ConfigurationError, Cron, Every, JobContext, Scheduler
from fastapi_jobs._policies import name_offset
from fastapi_jobs.observers import TickSkipped

from ..conftest import HOUR, START, serve, virtual_scheduler
from ..support.instances import Seeing

pytestmark = pytest.mark.looptime
PINNED = 49.931264  # job-0's first tick after the epoch, jitter 59 s at 1 min


def at(hours: float) -> datetime:
    return START + timedelta(hours=hours)


async def test_skip_is_the_default_and_each_tick_it_drops_is_counted_as_overlap() -> None:
    """With no overlap= given, every tick that comes while the run goes is dropped
    and counted at once as an overlap, in the status (over HTTP too) and to the
    observers; the next tick after the run runs on time."""
    scheduler = virtual_scheduler()
    seen: list[TickSkipped] = []
    scheduler.add_observer(Seeing(seen))
    ticks: list[datetime] = []

    @scheduler.every(hours=1)
    async def long(ctx: JobContext) -> None:
        ticks.append(ctx.tick)
        if len(ticks) == 1:
            await anyio.sleep(2.5 * HOUR)  # 01:00 to 03:30: 02:00 and 03:00 dropped

    app = FastAPI(lifespan=scheduler.lifespan)
    app.include_router(scheduler.router)
    async with serve(app) as client:
        await anyio.sleep(3 * HOUR + 1)
        during = (await client.get("/jobs/long")).json()  # the run still goes
        await anyio.sleep(HOUR)
        after = (await client.get("/jobs/long")).json()
    assert ticks == [at(1), at(4)]
    assert (during["overlap"], during["running"]) == ("skip", True)
    assert during["skipped"] == {"overlap": 2} and during["skipped_ticks"] == 2
    assert after["skipped"] == {"overlap": 2} and after["runs"] == 2
    assert [(e.reason, e.tick, e.ticks) for e in seen] == [
        ("overlap", at(2).timestamp(), 1),
        ("overlap", at(3).timestamp(), 1),
    ]


async def test_queue_one_runs_one_tick_right_after_the_run_and_drops_the_rest() -> None:
    """A first run of 150 minutes on an hourly job: the 01:00 run ends at 03:30;
    of the ticks at 02:00 and 03:00 that came meanwhile, the first runs right
    then (its ctx.tick says 02:00), the second is dropped; 04:00 runs on time."""
    scheduler = virtual_scheduler()
    runs: list[tuple[datetime, float]] = []

    @scheduler.every(hours=1, overlap="queue_one")
    async def long(ctx: JobContext) -> None:
        runs.append((ctx.tick, scheduler.clock.now()))
        if len(runs) == 1:
            await anyio.sleep(2.5 * HOUR)

    async with scheduler.running():
        await anyio.sleep(4 * HOUR + 1)
        status = scheduler.status()[0]
    assert runs == [
        (at(1), at(1).timestamp()),
        (at(2), at(3.5).timestamp()),
        (at(4), at(4).timestamp()),
    ]
    assert status.skipped == {"overlap": 1}
    assert status.overlap == "queue_one"


async def test_queue_one_runs_the_kept_tick_after_a_run_that_failed() -> None:
    scheduler = virtual_scheduler()
    ticks: list[datetime] = []

    @scheduler.every(hours=1, overlap="queue_one")
    async def flaky(ctx: JobContext) -> None:
        ticks.append(ctx.tick)
        if len(ticks) == 1:
            await anyio.sleep(1.5 * HOUR)
            raise RuntimeError("boom")

    async with scheduler.running():
        await anyio.sleep(2.5 * HOUR + 1)
    assert ticks == [at(1), at(2)]
    assert scheduler.status()[0].failures == 1


async def test_replace_cancels_the_run_in_flight_records_it_and_runs_the_new_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = virtual_scheduler()
    started: list[datetime] = []
    ended: list[datetime] = []

    @scheduler.every(hours=1, overlap="replace")
    async def long(ctx: JobContext) -> None:
        started.append(ctx.tick)
        if len(started) == 1:
            await anyio.sleep(10 * HOUR)  # cut by the next tick
        ended.append(ctx.tick)

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(3 * HOUR + 1)
            status = scheduler.status()[0]
            runs = await scheduler.runs("long")
    assert started == [at(1), at(2), at(3)]
    assert ended == [at(2), at(3)]  # the first never ended by itself
    assert status.last_outcome == "ok"
    assert status.skipped == {}
    assert status.overlap == "replace"
    cancelled = [r for r in runs if r.outcome == "cancelled"]
    assert len(cancelled) == 1
    assert cancelled[0].tick == at(1)
    assert cancelled[0].error is not None
    assert cancelled[0].error.type == "RunReplacedError"
    assert cancelled[0].error.message == (
        f"replaced by the tick at {at(2).isoformat().replace('+00:00', 'Z')} (overlap='replace')"
    )
    assert any("replaced by the tick at" in r.getMessage() for r in caplog.records)


async def test_replace_runs_the_newest_tick_when_the_run_ignores_its_cancel() -> None:
    """A run that shields itself from the cancel goes on: the ticks that come
    meanwhile replace each other, and only the newest runs after it."""
    scheduler = virtual_scheduler()
    ticks: list[datetime] = []

    @scheduler.every(hours=1, overlap="replace")
    async def stubborn(ctx: JobContext) -> None:
        ticks.append(ctx.tick)
        if len(ticks) == 1:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(2.5 * HOUR)

    async with scheduler.running():
        await anyio.sleep(3 * HOUR + 1800 + 1)
        status = scheduler.status()[0]
    assert ticks == [at(1), at(3)]
    assert status.skipped == {"overlap": 1}  # 02:00, replaced by 03:00 before it ran


async def test_a_kept_tick_is_counted_when_the_stop_cuts_the_run_before_it() -> None:
    scheduler = virtual_scheduler(shutdown_timeout=2)

    @scheduler.every(hours=1, overlap="queue_one")
    async def endless() -> None:
        await anyio.sleep(10 * HOUR)

    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 1)  # 02:00 kept behind the 01:00 run
    assert scheduler.status()[0].skipped == {"overlap": 1}


async def test_a_replaced_run_that_ignores_the_cancel_is_said_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = virtual_scheduler()
    ticks: list[datetime] = []

    @scheduler.every(hours=1, overlap="replace")
    async def swallowing(ctx: JobContext) -> None:
        ticks.append(ctx.tick)
        if len(ticks) == 1:
            try:
                await anyio.sleep(10 * HOUR)
            except BaseException:  # noqa: BLE001 - what the test is about
                return

    with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
        async with scheduler.running():
            await anyio.sleep(2 * HOUR + 1)
    assert ticks == [at(1), at(2)]
    assert any(
        "did not stop when a newer tick replaced it" in r.getMessage() for r in caplog.records
    )


async def test_a_kept_tick_is_dropped_and_counted_when_the_app_stops() -> None:
    scheduler = virtual_scheduler(shutdown_timeout=None)
    ticks: list[datetime] = []

    @scheduler.every(hours=1, overlap="queue_one")
    async def long(ctx: JobContext) -> None:
        ticks.append(ctx.tick)
        await anyio.sleep(1.5 * HOUR)

    async with scheduler.running():
        await anyio.sleep(2 * HOUR + 1)  # 02:00 is kept behind the 01:00 run
    assert ticks == [at(1)]
    assert scheduler.status()[0].skipped == {"overlap": 1}


async def test_jitter_moves_every_tick_by_the_same_offset_from_the_name() -> None:
    scheduler = virtual_scheduler()
    ticks: list[datetime] = []

    @scheduler.every(hours=1, jitter=timedelta(minutes=10))
    async def spread(ctx: JobContext) -> None:
        ticks.append(ctx.tick)

    async with scheduler.running():
        await anyio.sleep(3 * HOUR + 600)
        status = scheduler.status()[0]
    offset = ticks[0] - at(0)  # the first tick after the start, 00:00
    assert timedelta(0) < offset < timedelta(minutes=10)
    assert ticks == [at(h) + offset for h in (0, 1, 2, 3)]
    assert status.jitter == 600.0
    assert status.next_run_at == at(4) + offset
    # The same name draws the same offset in every scheduler (every instance).
    again = Scheduler()
    again.add_job(spread, Every(hours=1), name="spread", jitter=600)
    assert (
        again.jobs["spread"].schedule.next_after((at(1) + offset).timestamp())
        == (at(2) + offset).timestamp()
    )


def test_jitter_spreads_names_and_is_stable_across_processes() -> None:
    """Offsets come from blake2b of the name, not hash() (salted per process)."""
    scheduler = Scheduler()
    for n in range(200):
        scheduler.add_job(lambda: None, Every(minutes=1), name=f"job-{n}", jitter=59)
    offsets = {job.schedule.next_after(0) for job in scheduler.jobs.values()}
    assert len(offsets) > 150  # spread, not one instant
    # Pinned: a release that changed the draw would move every jittered job.
    assert scheduler.jobs["job-0"].schedule.next_after(0) == PINNED


def test_jitter_on_cron_keeps_the_zone_and_moves_each_tick() -> None:
    scheduler = Scheduler()
    scheduler.add_job(
        lambda: None, Cron("0 9 * * mon-fri", tz="Europe/Lisbon"), name="d", jitter=300
    )
    job = scheduler.jobs["d"]
    base = Cron("0 9 * * mon-fri", tz="Europe/Lisbon")
    now = datetime(2026, 12, 2, tzinfo=UTC).timestamp()
    moved = job.schedule.next_after(now) - base.next_after(now)
    assert 0 <= moved < 300
    nxt = job.schedule.next_after(job.schedule.next_after(now))
    assert nxt - base.next_after(base.next_after(now)) == pytest.approx(moved)
    assert job.schedule.last_at_or_before(nxt) == nxt
    assert "jitter 0:05:00" in job.schedule.describe()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap": "queue"}, "overlap='queue': pass one of 'skip', 'queue_one', 'replace'"),
        ({"overlap": None}, "overlap=None: pass one of"),
        ({"jitter": timedelta(hours=1)}, "must be shorter than the schedule's interval (1:00:00)"),
        ({"jitter": 7200}, "must be shorter than the schedule's interval"),
        ({"jitter": 1e300}, "jitter=1e+300s must be shorter than the schedule's interval"),
        ({"jitter": 10**30}, "must be shorter than the schedule's interval (1:00:00)"),
        ({"jitter": -1}, "jitter=-1"),
        ({"jitter": 0}, "jitter=0"),
        ({"jitter": "5m"}, "not a duration"),
    ],
)
def test_bad_policies_are_refused_with_the_bound(options: dict[str, object], message: str) -> None:
    scheduler = Scheduler()

    async def job() -> None: ...

    with pytest.raises(ConfigurationError) as raised:
        scheduler.add_job(job, Every(hours=1), **options)  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_a_cron_jitter_is_bounded_by_its_shortest_gap() -> None:
    scheduler = Scheduler()

    async def job() -> None: ...

    with pytest.raises(ConfigurationError, match="its shortest gap between two ticks"):
        scheduler.add_job(job, Cron("0,5 9 * * *"), jitter=timedelta(minutes=5))
    scheduler.add_job(job, Cron("0,5 9 * * *"), jitter=timedelta(minutes=4))


def test_replace_needs_an_async_job_and_policies_need_no_hand_off() -> None:
    scheduler = Scheduler()

    def sync_job() -> None: ...

    with pytest.raises(ConfigurationError, match="thread, which cannot be cancelled"):
        scheduler.add_job(sync_job, Every(hours=1), overlap="replace")
    scheduler.add_job(sync_job, Every(hours=1), overlap="queue_one")


async def _async_job() -> None: ...


def _sync_job() -> None: ...


@pytest.mark.parametrize(
    ("func", "schedule", "options", "message"),
    [
        (
            _async_job,
            Every(hours=1),
            {"jitter": 1e-7},
            "job 'digest': jitter=1e-07: must be at least 1 µs",
        ),
        (
            _async_job,
            Every(hours=1),
            {"jitter": "5m"},
            "job 'digest': jitter='5m': not a duration; pass a number of seconds or a timedelta",
        ),
        (
            _async_job,
            Cron("0,5 9 * * *"),
            {"jitter": timedelta(minutes=5)},
            "job 'digest': jitter=0:05:00 must be shorter than the schedule's interval "
            "(0:05:00, its shortest gap between two ticks)",
        ),
        (
            _sync_job,
            Every(hours=1),
            {"overlap": "replace"},
            "job 'digest': overlap='replace' needs an async job: a sync job runs in a thread, "
            "which cannot be cancelled (use 'queue_one', or make it async def)",
        ),
        (
            _async_job,
            Every(hours=1),
            {"overlap": "queue_one", "enqueue": lambda ctx: None},
            "job 'digest': overlap='queue_one' with enqueue=: a hand-off's run is its "
            "enqueue, which takes no time; the queue's worker decides what overlaps",
        ),
    ],
)
def test_a_refused_policy_says_which_job_what_was_given_and_why(
    func: object, schedule: Every | Cron, options: dict[str, object], message: str
) -> None:
    """Each refusal whole: the job's name, the value given, and what to do."""
    with pytest.raises(ConfigurationError) as raised:
        Scheduler().add_job(func, schedule, name="digest", **options)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_a_jittered_schedule_equals_one_made_alike_and_says_its_offset() -> None:
    """Two declarations of one job with one jitter make equal schedules (a stored
    schedule applied again is unchanged), hashed alike; another name, jitter or
    schedule makes another; and the description gives the name's offset."""

    def made(name: str = "digest", jitter: float = 30, every: float = 60) -> object:
        scheduler = Scheduler()
        scheduler.add_job(_async_job, Every(seconds=every), name=name, jitter=jitter)
        return scheduler.jobs[name].schedule

    one = made()
    assert one == made() and hash(one) == hash(made())
    assert one != made(name="other") and one != made(jitter=20) and one != made(every=120)
    assert one != Every(seconds=60) and one != "digest"
    offset = timedelta(seconds=one.next_after(0) % 60)  # type: ignore[attr-defined]
    assert one.describe() == f"every 1m, jitter 0:00:30 (+{offset})"  # type: ignore[attr-defined]


def test_a_names_offset_takes_any_string() -> None:
    """The offset is drawn from the name's UTF-8 bytes, a lone surrogate passed
    through (names are checked elsewhere; this draw never raises)."""
    assert name_offset("a\ud800", 10**6) == name_offset("a\ud800", 10**6)
    assert 0 <= name_offset("a\ud800", 10**6) < 10**6
    assert name_offset("a\ud800", 10**6) != name_offset("a\ud801", 10**6)
