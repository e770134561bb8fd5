"""Schedules as data in one process, on virtual time: tasks, schedules made,
changed and removed while the scheduler runs, and what bad input gets."""

from __future__ import annotations

import logging
from datetime import timedelta, timezone
from typing import Any

import anyio
import pytest

from fastapi_jobs import (
    ConfigurationError,
    Cron,
    Every,
    JobContext,
    JobNotFoundError,
    Schedule,
    Scheduler,
    StoredSchedule,
)

from ..conftest import START, virtual_scheduler

pytestmark = pytest.mark.looptime


class Weekdays(Schedule):
    def next_after(self, ts: float) -> float:
        return ts + 86400

    def describe(self) -> str:
        return "weekdays"


def deep(levels: int) -> list[Any]:
    nested: list[Any] = []
    for _ in range(levels):
        nested = [nested]
    return nested


def with_report(ran: list[tuple[str, float]]) -> Scheduler:
    scheduler = virtual_scheduler()

    @scheduler.task()
    async def report(ctx: JobContext, tenant: str, hour: int = 7) -> None:
        ran.append((tenant, ctx.tick.timestamp() - START.timestamp()))

    return scheduler


async def test_a_schedule_made_while_running_runs_with_its_arguments() -> None:
    ran: list[tuple[str, float]] = []
    scheduler = with_report(ran)
    async with scheduler.running():
        made = await scheduler.add_schedule(
            "acme-report", "report", Every(seconds=10), kwargs={"tenant": "acme"}
        )
        assert isinstance(made, StoredSchedule)
        assert (made.name, made.task, made.kwargs, made.known) == (
            "acme-report",
            "report",
            {"tenant": "acme"},
            True,
        )
        await anyio.sleep(35)
        status = scheduler.job_status("acme-report")
    assert ran == [("acme", 10.0), ("acme", 20.0), ("acme", 30.0)]
    assert status.runs == 3


async def test_a_change_applies_from_the_next_tick_and_keeps_the_counts() -> None:
    ran: list[tuple[str, float]] = []
    scheduler = with_report(ran)
    async with scheduler.running():
        await scheduler.add_schedule("r", "report", Every(seconds=10), kwargs={"tenant": "a"})
        await anyio.sleep(25)  # runs at 10, 20
        changed = await scheduler.update_schedule("r", schedule=Every(seconds=7))
        assert changed.kwargs == {"tenant": "a"}  # kept
        assert changed.version > 0
        await anyio.sleep(10)  # at 32 (7 s ticks lie on the epoch's grid)
        await scheduler.update_schedule("r", kwargs={"tenant": "b"})
        await anyio.sleep(7)  # at 39
        status = scheduler.job_status("r")
    assert ran == [("a", 10.0), ("a", 20.0), ("a", 32.0), ("b", 39.0)]
    assert status.runs == 4
    assert status.schedule == "every 7s"


async def test_a_removed_schedule_runs_no_more_and_its_run_in_flight_ends() -> None:
    scheduler = virtual_scheduler()
    ended: list[float] = []

    @scheduler.task()
    async def slow(ctx: JobContext) -> None:
        await anyio.sleep(5)
        ended.append(ctx.tick.timestamp() - START.timestamp())

    async with scheduler.running():
        await scheduler.add_schedule("slow", slow, Every(seconds=10))
        await anyio.sleep(12)  # the run of 10 goes until 15
        await scheduler.remove_schedule("slow")
        assert await scheduler.schedules() == []
        with pytest.raises(JobNotFoundError, match="no job named 'slow'"):
            scheduler.job_status("slow")
        await anyio.sleep(30)
    assert ended == [10.0]


async def test_a_changed_schedule_does_not_overlap_its_run_in_flight() -> None:
    scheduler = virtual_scheduler()
    started: list[float] = []

    @scheduler.task()
    async def long(ctx: JobContext) -> None:
        started.append(ctx.tick.timestamp() - START.timestamp())
        await anyio.sleep(15)

    async with scheduler.running():
        await scheduler.add_schedule("long", long, Every(seconds=10))
        await anyio.sleep(11)  # the run of 10 goes until 25
        await scheduler.update_schedule("long", schedule=Every(seconds=4))
        await anyio.sleep(20)  # 12, 16, 20, 24 dropped (overlap); 28 runs
        status = scheduler.job_status("long")
    assert started == [10.0, 28.0]
    assert status.skipped.get("overlap") == 4


async def test_schedules_made_before_the_start_run_from_it() -> None:
    ran: list[tuple[str, float]] = []
    scheduler = with_report(ran)
    await scheduler.add_schedule("early", "report", Every(seconds=10), kwargs={"tenant": "x"})
    async with scheduler.running():
        await anyio.sleep(15)
    assert ran == [("x", 10.0)]


async def test_a_sync_task_runs_in_a_thread_with_its_arguments() -> None:
    # Virtual time flies while a thread works: the stop waits for the run.
    scheduler = virtual_scheduler(shutdown_timeout=None)
    got: list[Any] = []

    @scheduler.task(name="sync-one")
    def plain(n: int, names: list[str]) -> None:
        got.append((n, names))

    async with scheduler.running():
        await scheduler.add_schedule(
            "s", "sync-one", Every(seconds=10), kwargs={"n": 1, "names": ("a", "b")}
        )
        await anyio.sleep(11)
    assert got == [(1, ["a", "b"])]  # as JSON gives them back


async def test_options_hold_for_a_stored_schedule() -> None:
    scheduler = virtual_scheduler()
    tries: list[float] = []

    @scheduler.task()
    async def flaky() -> None:
        tries.append(anyio.current_time())
        raise RuntimeError("upstream down")

    async with scheduler.running():
        made = await scheduler.add_schedule(
            "f", flaky, Every(minutes=1), retries=2, retry_backoff=timedelta(seconds=1)
        )
        assert made.options == {"retries": 2, "retry_backoff": 1.0}
        await anyio.sleep(65)
        status = scheduler.job_status("f")
    assert len(tries) == 3
    assert status.last_outcome == "failed"


# -- what bad input gets -------------------------------------------------------


async def test_bad_schedules_are_refused_saying_which() -> None:
    scheduler = with_report([])

    @scheduler.every(hours=1)
    async def declared() -> None: ...

    cases: list[tuple[dict[str, Any], str]] = [
        ({"task": "nope"}, r"no task named 'nope' \(the tasks.*'report'"),
        ({"kwargs": {"tenant": "a", "colour": 1}}, r"takes no argument 'colour'"),
        ({"kwargs": {}}, r"needs the argument\(s\) tenant"),
        ({"kwargs": {"tenant": object()}}, r"not JSON values"),
        ({"kwargs": {"tenant": float("nan")}}, r"not JSON values"),
        ({"kwargs": ["tenant"]}, r"pass a dict with string keys"),
        ({"kwargs": {"tenant": "a", "ctx": 1}}, r"'ctx' is the run's context"),
        ({"kwargs": {"tenant": deep(100_000)}}, r"not JSON values"),
        ({"kwargs": {"tenant": deep(40)}}, r"nested more than 32 levels deep"),
        ({"schedule": Cron("0 7 * * *", tz="Factory")}, r"this host's own zone"),
        ({"kwargs": {"tenant": "x" * 70000}}, r"the most is 65536"),
        ({"name": "declared"}, r"a declared job has that name"),
        ({"name": "instances"}, "the route GET /jobs/instances has that name"),
        ({"name": "a/b"}, r"no '/'"),
        ({"name": "x" * 201}, r"1 to 200"),
        ({"name": "bad\x00name"}, r"holds '\\x00'"),
        ({"schedule": Cron("0 7 * * *", tz=timezone(timedelta(hours=1)))}, r"a named timezone"),
        ({"schedule": Weekdays()}, r"is Every\(...\) or Cron\(...\)"),
        ({"options": {"timeout": -1}}, r"timeout=-1"),
        ({"options": {"enqueue": None}}, r"'enqueue' is not an option of a stored schedule"),
        ({"options": {"retries": True}}, r"retries=True"),
    ]
    async with scheduler.running():
        for case, match in cases:
            args: dict[str, Any] = {
                "name": "r",
                "task": "report",
                "schedule": Every(hours=1),
                "kwargs": {"tenant": "a"},
                **case,
            }
            options = args.pop("options", {})
            with pytest.raises(ConfigurationError, match=match):
                await scheduler.add_schedule(**args, **options)
        assert await scheduler.schedules() == []
        await scheduler.add_schedule("r", "report", Every(hours=1), kwargs={"tenant": "a"})
        with pytest.raises(ConfigurationError, match="a schedule named 'r' exists"):
            await scheduler.add_schedule("r", "report", Every(hours=1), kwargs={"tenant": "a"})
        with pytest.raises(JobNotFoundError, match="no schedule named 'q'; the schedules are: 'r'"):
            await scheduler.update_schedule("q", kwargs={})
        with pytest.raises(JobNotFoundError, match="no schedule named 'q'"):
            await scheduler.remove_schedule("q")
        with pytest.raises(ConfigurationError, match="takes no argument 'x'"):
            await scheduler.update_schedule("r", kwargs={"tenant": "a", "x": 1})
        with pytest.raises(ConfigurationError, match="nothing to change"):
            await scheduler.update_schedule("r")
        assert (await scheduler.schedules())[0].kwargs == {"tenant": "a"}  # unchanged


def test_tasks_are_checked_when_registered() -> None:
    scheduler = Scheduler()
    with pytest.raises(ConfigurationError, match="generator function"):

        @scheduler.task()
        async def gen() -> Any:
            yield 1

    with pytest.raises(ConfigurationError, match="positional-only"):

        @scheduler.task()
        async def positional(ctx: JobContext, tenant: str, /) -> None: ...

    with pytest.raises(ConfigurationError, match="a task is a function"):
        scheduler.task(42)  # type: ignore[call-overload]

    @scheduler.task
    async def bare() -> None: ...

    with pytest.raises(ConfigurationError, match="registered twice"):

        @scheduler.task(name="bare")
        async def other() -> None: ...

    assert list(scheduler.tasks) == ["bare"]


async def test_a_schedule_is_logged_when_made_and_removed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fastapi_jobs")
    scheduler = with_report([])
    async with scheduler.running():
        await scheduler.add_schedule(
            "r", "report", Cron("0 7 * * *", tz="Europe/Lisbon"), kwargs={"tenant": "a"}
        )
        await scheduler.remove_schedule("r")
    text = caplog.text
    assert "schedule 'r' (version 1): task 'report' cron '0 7 * * *' Europe/Lisbon" in text
    assert "schedule 'r' removed" in text


async def test_a_declared_pause_follows_the_spec_and_an_operators_pause_holds() -> None:
    ran: list[tuple[str, float]] = []
    scheduler = with_report(ran)
    async with scheduler.running():
        await scheduler.add_schedule(
            "r", "report", Every(seconds=10), kwargs={"tenant": "a"}, paused=True
        )
        await anyio.sleep(15)
        assert ran == []
        await scheduler.update_schedule("r", paused=False)  # the spec's own default
        await anyio.sleep(10)  # 20 runs
        await scheduler.pause("r")  # an operator's pause holds across a change
        await scheduler.update_schedule("r", kwargs={"tenant": "b"})
        await anyio.sleep(20)  # 30 and 40 paused
        assert scheduler.job_status("r").paused
        await scheduler.resume("r")
        await anyio.sleep(10)  # 50 runs
        await scheduler.update_schedule("r", paused=True)  # over the operator's resume
        await anyio.sleep(20)
        assert scheduler.job_status("r").paused
    assert ran == [("a", 20.0), ("b", 50.0)]


async def test_a_stored_schedule_takes_an_overlap_policy_and_jitter() -> None:
    ran: list[tuple[str, float]] = []
    scheduler = with_report(ran)

    @scheduler.task()
    def blocking() -> None: ...

    async with scheduler.running():
        made = await scheduler.add_schedule(
            "acme",
            "report",
            Every(seconds=10),
            kwargs={"tenant": "acme"},
            overlap="queue_one",
            jitter=5,
        )
        assert dict(made.options) == {"overlap": "queue_one", "jitter": 5.0}
        status = scheduler.job_status("acme")
        assert (status.overlap, status.jitter) == ("queue_one", 5.0)
        await anyio.sleep(21)
        with pytest.raises(ConfigurationError, match="overlap='later': pass one of 'skip'"):
            await scheduler.add_schedule("b", "blocking", Every(seconds=10), overlap="later")
        with pytest.raises(ConfigurationError, match="jitter=0:00:10 must be shorter"):
            await scheduler.add_schedule("c", "blocking", Every(seconds=10), jitter=10)
        with pytest.raises(ConfigurationError, match="thread, which cannot be cancelled"):
            await scheduler.add_schedule("d", "blocking", Every(seconds=10), overlap="replace")
    offset = ran[0][1]  # the name's offset (3.03 s), drawn under 5 s
    assert 0 < offset < 5
    assert ran == [("acme", offset), ("acme", 10 + offset)]  # 21 s of virtual time
