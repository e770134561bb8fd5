"""A hand-off job's runs in the history carry their tick's queue job id: the
key for queues whose job id it is (arq, Celery), the id the store's outbox
recorded for one that makes its own (procrastinate)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from fastapi_jobs import JobContext, Scheduler
from fastapi_jobs._scheduler import seam_of
from fastapi_jobs.metrics import instrument
from fastapi_jobs.queues import HandoffRequest, handoff_key

from ..conftest import serve
from ..observability.test_metrics import scrape, value
from ..support.instances import engine_for, instance
from ..web.test_page import make_app, page_row


class Keyed:
    """A queue whose job id is the key (as arq's and Celery's are)."""

    name = "keyed queue"

    async def enqueue(self, request: HandoffRequest) -> str:
        if request.kwargs.get("fail"):
            raise ConnectionError("the queue is down")
        return request.key


class OwnIds:
    """A queue in the store's database that numbers its jobs itself (as
    procrastinate does): enqueued through the outbox, in its transaction."""

    name = "own-ids queue"

    async def enqueue(self, request: HandoffRequest) -> str:
        assert request.outbox is not None
        insert = sa.text("SELECT 'q-1' AS id").columns(sa.column("id", sa.String))
        queue_id, _ = await request.outbox.once(request.job, request.tick, self.name, insert)
        return queue_id


async def test_runs_without_a_store_show_the_key_of_the_runs_that_went_through() -> None:
    scheduler = Scheduler()
    fail = False
    scheduler.every(hours=1, name="digest", enqueue=Keyed())(lambda: {"fail": fail})
    ok = await scheduler.run_now("digest")
    fail = True
    failed = await scheduler.run_now("digest")
    assert (ok.outcome, failed.outcome) == ("ok", "failed")
    newest, oldest = await scheduler.runs("digest")
    assert newest.outcome == "failed" and newest.queue_id is None
    assert oldest.tick is not None
    assert oldest.queue_id == handoff_key("digest", oldest.tick)


@pytest.mark.parametrize("queue", [Keyed(), OwnIds()], ids=["keyed", "own-ids"])
async def test_runs_in_the_store_show_the_queue_id(queue: Keyed | OwnIds, tmp_path: Path) -> None:
    async with engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine:
        scheduler = instance(engine)
        scheduler.every(hours=1, name="digest", enqueue=queue)(lambda: None)
        scheduler.every(hours=1, name="plain")(lambda: None)
        async with scheduler.running({"db": engine}):
            await (await scheduler.trigger("digest")).wait()
            await (await scheduler.trigger("plain")).wait()
            [run] = await scheduler.runs("digest")
            recent = await seam_of(scheduler).recent_runs(["digest", "plain"], 5)
    assert run.tick is not None
    expected = handoff_key("digest", run.tick) if isinstance(queue, Keyed) else "q-1"
    assert run.queue_id == expected
    assert [r.queue_id for r in recent["digest"]] == [expected]
    assert [r.queue_id for r in recent["plain"]] == [None]  # not a hand-off


async def test_the_page_says_where_a_job_hands_off_and_what_each_run_queued() -> None:
    scheduler = Scheduler()

    class Hostile(Keyed):
        name = "queue <b>&"

    scheduler.every(hours=1, name="digest", enqueue=Hostile())(lambda: None)
    scheduler.every(hours=1, name="plain")(lambda: None)
    app = make_app(scheduler, control=False)
    async with serve(app) as client:
        await scheduler.run_now("digest")
        page = (await client.get("/jobs/ui")).text
    digest, plain = page_row(page, "digest"), page_row(page, "plain")
    assert "hands off to queue &lt;b&gt;&amp;" in digest
    key = (await scheduler.runs("digest"))[0].queue_id
    assert key is not None and f"queued as {key}" in digest
    assert "hands off" not in plain and "queued as" not in plain


def test_the_metrics_say_which_jobs_hand_off_and_where() -> None:
    """``fastapi_jobs_hand_off{job_name, queue}`` is 1 for a hand-off job, and
    absent for the others."""
    scheduler = Scheduler()
    registry = CollectorRegistry()
    instrument(scheduler, registry)
    scheduler.every(hours=1, name="digest", enqueue=Keyed())(lambda: None)
    scheduler.every(hours=1, name="plain")(lambda: None)
    samples = scrape(registry)
    assert value(samples, "hand_off", job_name="digest", queue="keyed queue") == 1
    assert [key for key in samples if key[0] == "fastapi_jobs_hand_off"] == [
        ("fastapi_jobs_hand_off", (("job_name", "digest"), ("queue", "keyed queue")))
    ]


class Flaky:
    """Fails its first enqueue; records what each attempt was told."""

    name = "flaky"

    def __init__(self) -> None:
        self.told: list[bool] = []

    async def enqueue(self, request: HandoffRequest) -> str:
        self.told.append(request.maybe_sent)
        if len(self.told) == 1:
            raise ConnectionError("the answer was lost")
        return request.key


async def test_only_a_retry_or_an_old_tick_may_have_been_sent(tmp_path: Path) -> None:
    """``maybe_sent`` is False for the first attempt of a tick just claimed (a
    queue without a refusal of its own skips its lookup), True for its retry and
    for a tick older than half the store's lease (one claimed again after its
    claimer died)."""
    flaky = Flaky()
    async with engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine:
        scheduler = instance(engine, lease=30)
        scheduler.every(hours=1, name="digest", enqueue=flaky, retries=1, retry_backoff=0)(
            lambda: None
        )
        async with scheduler.running({"db": engine}):
            result = await (await scheduler.trigger("digest")).wait()
            assert result is not None and result.outcome == "ok"
            assert flaky.told == [False, True]
            old = datetime.now(UTC) - timedelta(seconds=16)
            context = JobContext("digest", old, {}, logging.getLogger("test"))
            await scheduler.jobs["digest"].func(context)
    assert flaky.told == [False, True, True]


async def test_the_task_gets_the_kwargs_as_returned_and_what_json_would_change_fails() -> None:
    """Every queue's task gets the values the job returned: JSON values pass as
    they are, and a tuple (which arq would pickle and Celery send as a list)
    fails the run, saying what to return, before any queue sees it."""
    seen: list[dict[str, object]] = []

    class Seeing(Keyed):
        async def enqueue(self, request: HandoffRequest) -> str:
            seen.append(dict(request.kwargs))
            return request.key

    returned: dict[str, object] = {"pair": [1, 2], "by": {"7": None}}
    scheduler = Scheduler()
    scheduler.every(hours=1, name="digest", enqueue=Seeing())(lambda: returned)
    assert (await scheduler.run_now("digest")).outcome == "ok"
    returned = {"pair": (1, 2)}
    result = await scheduler.run_now("digest")
    assert result.outcome == "failed" and "a tuple becomes a list" in str(result.error)
    assert seen == [{"pair": [1, 2], "by": {"7": None}}]
