"""Jobs that come and go (stored schedules, tenants) leave nothing behind: no
logger in logging's registry, no task, no runner; and each job still logs on
``<scheduler logger>.<job name>``, as the app's logging configuration says."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Iterator

import anyio
import pytest

from fastapi_jobs import Every, JobContext, Scheduler, ScheduleSpec
from fastapi_jobs._logging import job_logger
from fastapi_jobs.testing import MemoryStore

from ..conftest import virtual_scheduler

pytestmark = pytest.mark.looptime


def with_tenants() -> Scheduler:
    scheduler = virtual_scheduler(store=MemoryStore())

    @scheduler.task
    async def report(ctx: JobContext, fail: bool = False) -> None:
        ctx.logger.info("report for %s", ctx.name)
        if fail:
            raise ConnectionError("smtp refused")

    return scheduler


def tenants(first: int, count: int) -> list[ScheduleSpec]:
    return [
        ScheduleSpec(f"tenant{k}", "report", Every(minutes=1), kwargs={"fail": k % 100 == 0})
        for k in range(first, first + count)
    ]


class Keep(logging.Handler):
    """Keeps the records it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every record the scheduler's loggers hand on, as a handler of theirs sees it."""
    keep, top = Keep(), logging.getLogger("fastapi_jobs")
    top.addHandler(keep)
    level, top.level = top.level, logging.INFO
    try:
        yield keep.seen
    finally:
        top.removeHandler(keep)
        top.setLevel(level)


async def test_schedules_that_come_and_go_leave_no_logger_behind(
    records: list[logging.LogRecord],
) -> None:
    """1,000 stored schedules, each run once (logging, some failing) and
    removed: logging's registry holds no more loggers than before."""
    scheduler = with_tenants()
    async with scheduler.running():
        before = len(logging.Logger.manager.loggerDict)
        for first in range(0, 1000, 250):
            await scheduler.apply_schedules("tenants", tenants(first, 250))
            await anyio.sleep(90)  # each runs once
            await scheduler.apply_schedules("tenants", [])
        after = len(logging.Logger.manager.loggerDict)
    assert after == before
    ran = [r for r in records if r.getMessage().startswith("report for")]
    assert len(ran) == 1000
    assert {r.name for r in ran} == {f"fastapi_jobs.tenant{k}" for k in range(1000)}


@pytest.fixture
def unheard() -> Iterator[None]:
    """No record is made: pytest's log capture keeps each one, a failed run's
    traceback with it (and that, its frames and what they hold)."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.usefixtures("unheard")
async def test_a_removed_schedules_task_is_freed() -> None:
    """Once removed (and others after it: ended tasks are let go in batches),
    a stored schedule's task is garbage, and its runner with it."""
    scheduler = with_tenants()
    async with scheduler.running():
        await scheduler.apply_schedules("tenants", tenants(0, 1))
        await anyio.sleep(90)  # it ran: it has its task
        made = scheduler._seam._parts.runners["tenant0"].task
        assert made is not None
        task = weakref.ref(made)
        del made
        for first in range(1, 301, 100):
            await scheduler.apply_schedules("tenants", tenants(first, 100))
            await anyio.sleep(60)
        await scheduler.apply_schedules("tenants", [])
        await anyio.sleep(1)
        gc.collect()
        assert task() is None


class Rows:
    """What a job holds while it runs: a weak reference to it says when it is freed."""


@pytest.mark.usefixtures("unheard")
async def test_a_failed_run_keeps_nothing_of_the_job_alive() -> None:
    """A run that failed leaves its error on the status, as text: not the
    exception, whose traceback would keep the job's frames, and all their
    locals held, alive until the job's next error."""
    scheduler = virtual_scheduler()
    held: list[weakref.ref[Rows]] = []

    @scheduler.every(minutes=1)
    async def export() -> None:
        rows = Rows()
        held.append(weakref.ref(rows))
        raise ConnectionError("smtp refused")

    async with scheduler.running():
        await anyio.sleep(61)
        gc.collect()
        [status] = scheduler.status()
        assert status.failures == 1 and str(status.last_error) == "ConnectionError: smtp refused"
        [rows] = held
        assert rows() is None


async def test_a_jobs_lines_say_what_they_said(records: list[logging.LogRecord]) -> None:
    """A job's lines keep their logger's name, level and fields; the app's
    configuration of a job's logger, or of one above a dotted name, holds."""
    scheduler = with_tenants()
    quiet, acme = logging.getLogger("fastapi_jobs.quiet"), logging.getLogger("fastapi_jobs.acme")
    acme_handler = Keep()
    quiet.setLevel(logging.ERROR)
    acme.addHandler(acme_handler)
    try:
        async with scheduler.running():
            for name, fail in (("quiet", True), ("acme.report", False), ("plain", True)):
                await scheduler.add_schedule(
                    name, "report", Every(minutes=1), kwargs={"fail": fail}
                )
            await anyio.sleep(90)
    finally:
        quiet.setLevel(logging.NOTSET)
        acme.removeHandler(acme_handler)
    said = [(r.name, r.levelno, r.getMessage()) for r in records if r.name != "fastapi_jobs"]
    assert ("fastapi_jobs.plain", logging.INFO, "report for plain") in said
    failed = next(
        r for r in records if r.name == "fastapi_jobs.plain" and r.levelno == logging.ERROR
    )
    assert failed.getMessage().startswith("job 'plain' failed after")
    assert (failed.job, failed.outcome) == ("plain", "failed")  # type: ignore[attr-defined]
    assert failed.exc_info is not None
    # The app's level on the job's own logger: its INFO line is dropped, its error kept.
    assert [(n, level) for n, level, _ in said if n == "fastapi_jobs.quiet"] == [
        ("fastapi_jobs.quiet", logging.ERROR)
    ]
    # A handler of the app's on the logger above a dotted name sees that job's lines.
    assert [r.getMessage() for r in acme_handler.seen] == ["report for acme.report"]
    assert ("fastapi_jobs.acme.report", logging.INFO, "report for acme.report") in said


async def test_the_apps_logging_configuration_holds_as_it_changes(
    records: list[logging.LogRecord],
) -> None:
    """A level set on a job's logger after it first logged, logging.disable()
    and the app's logger class (setLoggerClass) apply to a job's lines."""

    class Tagged(logging.Logger):
        def makeRecord(self, *args: object, **kwargs: object) -> logging.LogRecord:
            record = super().makeRecord(*args, **kwargs)  # type: ignore[arg-type]
            record.tag = "app"
            return record

    scheduler = with_tenants()

    def lines(job: str) -> list[logging.LogRecord]:
        return [r for r in records if r.name == f"fastapi_jobs.{job}"]

    logging.setLoggerClass(Tagged)
    try:
        async with scheduler.running():
            for name in ("late", "tagged"):
                await scheduler.add_schedule(name, "report", Every(minutes=1))
            await anyio.sleep(90)  # each ran once
            assert len(lines("late")) == 1 and lines("tagged")[0].tag == "app"  # type: ignore[attr-defined]
            logging.getLogger("fastapi_jobs.late").setLevel(logging.WARNING)
            logging.disable(logging.INFO)
            await anyio.sleep(60)
            assert len(lines("late")) == 1 and len(lines("tagged")) == 1
            logging.disable(logging.NOTSET)
            await anyio.sleep(60)
    finally:
        logging.disable(logging.NOTSET)
        logging.setLoggerClass(logging.Logger)
        logging.getLogger("fastapi_jobs.late").setLevel(logging.NOTSET)
    assert len(lines("late")) == 1 and len(lines("tagged")) == 2  # not the one disabled


async def test_a_jobs_logger_hangs_where_logging_would_hang_it() -> None:
    """Its parent is the nearest logger above its name (past logging's
    placeholders), the root if none; under the root logger, its name is the job's."""
    top = logging.getLogger("fastapi_jobs")
    logging.getLogger("fastapi_jobs.deep.a.b")  # leaves placeholders above it
    deep = job_logger(top, "deep.x")
    assert (deep.name, deep.parent) == ("fastapi_jobs.deep.x", top)
    loose = job_logger(logging.Logger("unregistered"), "job")
    assert (loose.name, loose.parent) == ("unregistered.job", logging.root)
    assert job_logger(logging.root, "solo").name == "solo"
    assert "fastapi_jobs.deep.x" not in logging.Logger.manager.loggerDict
