"""What the scheduler's split keeps and adds: background tasks a reader of a task
dump can tell apart, and the job options that every declaration shares."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from fastapi_jobs import Every, Scheduler
from fastapi_jobs.metrics import instrument
from fastapi_jobs.stores import SQLAlchemyStore


async def test_each_background_task_of_a_running_scheduler_has_its_own_name(
    tmp_path: Path,
) -> None:
    """While the jobs run, each task the scheduler started says what it is."""
    store = SQLAlchemyStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}", heartbeat=60)
    scheduler = Scheduler(store=store)
    instrument(scheduler, CollectorRegistry())

    @scheduler.every(hours=1)
    async def digest() -> None: ...

    async with scheduler.running():
        names = {task.name for task in anyio.get_running_tasks()}
    ours = {name for name in names if name and name.startswith("fastapi_jobs")}
    assert ours >= {
        "fastapi_jobs: heartbeat",
        "fastapi_jobs: leases",
        "fastapi_jobs: releases",
        "fastapi_jobs: observers",
        "fastapi_jobs: metrics",
        "fastapi_jobs: dispatcher",
        "fastapi_jobs: the jobs' tasks",
    }
    assert not any("_run_in" in name for name in ours)


@pytest.mark.parametrize(
    "declare",
    [
        lambda s: s.every(hours=1, retrys=3),
        lambda s: s.cron("0 * * * *", retrys=3),
        lambda s: s.add_job(lambda: None, Every(hours=1), name="j", retrys=3),
    ],
    ids=["every", "cron", "add_job"],
)
def test_an_unknown_option_is_refused_as_python_refuses_an_unknown_keyword(
    declare: object,
) -> None:
    """A misspelt option is a TypeError naming the method and the keyword, with
    the option it is close to and the list of them."""
    scheduler = Scheduler()
    with pytest.raises(
        TypeError,
        match=r"Scheduler\.\w+\(\) got an unexpected keyword argument 'retrys' "
        r"\(did you mean 'retries'\? the options are catch_up, enqueue, every_instance, jitter, "
        r"name, overlap, ",
    ):
        declare(scheduler)  # type: ignore[operator]
    assert scheduler.jobs == {}


def test_every_declaration_takes_the_same_options_with_the_same_defaults() -> None:
    """add_job, every and cron make the same job from the same options, and
    leave out what is not given at the defaults."""
    scheduler = Scheduler()
    options = {"timeout": 3, "retries": 2, "retry_backoff": 0.5, "paused": True}

    def job() -> None: ...

    scheduler.add_job(job, Every(hours=1), name="by_add_job", **options)  # type: ignore[arg-type]
    scheduler.every(hours=1, name="by_every", **options)(job)  # type: ignore[arg-type]
    scheduler.cron("0 * * * *", name="by_cron", **options)(job)  # type: ignore[arg-type]
    scheduler.every(hours=1, name="plain")(job)
    made = scheduler.jobs
    fields = ("timeout", "retries", "retry_backoff", "paused", "retry_timeouts", "catch_up")
    wanted = (3.0, 2, 0.5, True, True, None)
    for name in ("by_add_job", "by_every", "by_cron"):
        assert tuple(getattr(made[name], f) for f in fields) == wanted, name
    plain = made["plain"]
    assert (plain.timeout, plain.retries, plain.retry_backoff, plain.paused) == (
        None,
        0,
        1.0,
        False,
    )
    assert (plain.run_on_startup, plain.every_instance, plain.retry_timeouts) == (
        False,
        False,
        True,
    )
