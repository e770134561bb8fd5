"""Hand-off jobs with Celery: a real Redis server as the broker, a real Celery
worker process, a real SQLite store (its outbox). Real time, short intervals,
wide margins (the worker and Redis run on their own clocks)."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from celery import Celery  # type: ignore[import-untyped]
from kombu.exceptions import OperationalError  # type: ignore[import-untyped]
from redis.asyncio import Redis

from fastapi_jobs import ConfigurationError, JobContext, Scheduler
from fastapi_jobs.queues import HandoffRequest, handoff_key
from fastapi_jobs.queues.celery import CeleryTask

from ..conftest import open_store, serve
from ..support.cluster import ROOT, App, rows
from ..support.instances import engine_for, instance
from ..support.postgres import PostgresServer
from ..support.redis import RedisServer
from ..support.ticks import (
    after_a_dead_claimer,
    dropped_while_held,
    refused_after_a_dead_claimer,
)
from ..support.waiting import poll
from ..support.workers import spawn, stop
from .test_handoff_arq import _page_fragment, _store_runs

FAST = {"socket_timeout": 1, "socket_connect_timeout": 1}
"""The app's broker_transport_options the docs give: a frozen broker fails a send in 1 s."""


@dataclass
class Worker:
    """A Celery worker process serving ``queue``; what it ran is in Redis."""

    queue: str
    proc: subprocess.Popen[bytes]
    log: Path

    async def executions(self, r: Redis) -> list[dict[str, Any]]:
        """Every execution of the task, duplicates included."""
        raw = await r.lrange(f"executions:{self.queue}", 0, -1)  # type: ignore[misc]
        return [json.loads(entry) for entry in raw]

    async def work(self, r: Redis) -> list[str]:
        """The task ids whose work ran (the task dedupes on ``self.request.id``)."""
        return [entry.decode() for entry in await r.lrange(f"work:{self.queue}", 0, -1)]  # type: ignore[misc]


def start_worker(app: str, queue: str, cwd: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``celery -A <app> worker`` in ``cwd`` (one process, no pool), its output in ``log``."""
    return spawn(
        [
            *("celery", "-A", app, "worker", "-P", "solo", "-c", "1", "-Q", queue),
            *("--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info"),
        ],
        cwd,
        log,
        **env,
    )


@pytest.fixture
def worker(redis: RedisServer, tmp_path: Path) -> Iterator[Worker]:
    """A real Celery worker on a queue of the test's own."""
    with running_worker(redis, tmp_path) as started:
        yield started


@contextmanager
def running_worker(redis: RedisServer, tmp_path: Path) -> Iterator[Worker]:
    """A Celery worker process on a queue of its own, stopped at the end (the
    queue contract's too: tests/queues/test_queue_contract.py)."""
    queue = f"fj-test-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "celery_worker.log"
    proc = start_worker(
        "tests.apps.celery_worker",
        queue,
        ROOT,
        log,
        FJ_REDIS_SOCKET=str(redis.socket),
        FJ_QUEUE=queue,
    )
    try:
        yield Worker(queue, proc, log)
    finally:
        redis.thaw()  # a test that froze Redis and failed must not leave the worker stuck
        stop(proc)


@asynccontextmanager
async def celery_app(
    redis: RedisServer, *, cls: type[Celery] = Celery, transport: Mapping[str, Any] = FAST
) -> AsyncIterator[Celery]:
    """The app's side: a Celery app sending to the test's Redis (by default set
    to fail fast, as the docs say)."""
    app = cls("fj_test_app", broker=f"redis+socket://{redis.socket}")
    app.conf.broker_transport_options = dict(transport)
    app.conf.broker_connection_timeout = 1
    try:
        yield app
    finally:
        app.close()


@asynccontextmanager
async def redis_client(redis: RedisServer) -> AsyncIterator[Redis]:
    client = Redis(unix_socket_path=str(redis.socket))
    try:
        yield client
    finally:
        await client.aclose()


def _by_id(executions: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in executions:
        counts[entry["id"]] = counts.get(entry["id"], 0) + 1
    return counts


async def _count(worker: Worker, r: Redis, n: int) -> bool:
    return len(await worker.executions(r)) >= n


async def _outbox(engine: Any) -> dict[str, tuple[str | None, bool]]:
    """The store's outbox: each tick's key -> (recorded task id, recorded as sent)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT job, tick, queue_id, sent_at FROM fastapi_jobs_handoffs")
        )
        return {
            handoff_key(row.job, datetime.fromtimestamp(row.tick, UTC)): (
                row.queue_id,
                row.sent_at is not None,
            )
            for row in rows
        }


def _task(worker: Worker, **options: Any) -> CeleryTask:
    return CeleryTask("fj.record", app=lambda s: s["celery"], queue=worker.queue, **options)


class LosingCelery(Celery):  # type: ignore[misc]
    """Fault injection around the real send: the first one reaches the broker and
    then fails as if its answer were lost (a timeout, a dropped connection)."""

    sends = 0

    def send_task(self, *args: Any, **kwargs: Any) -> Any:
        result = super().send_task(*args, **kwargs)
        self.sends += 1
        if self.sends == 1:
            raise OperationalError("the answer was lost")
        return result


async def test_a_send_whose_answer_was_lost_is_sent_again_under_the_same_task_id(
    redis: RedisServer, worker: Worker, tmp_path: Path
) -> None:
    """The duplicate window: a send that went through but failed is not recorded
    as sent, so the retry sends it again, under the same task_id. Celery runs
    both; the task, deduping on request.id, does the work once."""
    async with (
        celery_app(redis, cls=LosingCelery) as app,
        redis_client(redis) as r,
        engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
    ):
        scheduler = instance(engine)

        @scheduler.every(seconds=3, enqueue=_task(worker), retries=2, retry_backoff=0.05)
        def digest() -> None:  # sync, no kwargs: the task runs with none
            return None

        async with scheduler.running({"db": engine, "celery": app}):
            await poll(lambda: app.sends >= 2, within=30)
        runs = await _store_runs(engine, "digest")
        outbox = await _outbox(engine)
        await poll(lambda: _count(worker, r, 2), within=30)
        executions = await worker.executions(r)
        work = await worker.work(r)

    [key] = outbox
    assert runs[0]["outcome"] == "ok" and runs[0]["attempts"] == 2
    assert outbox == {key: (key, True)}
    assert [(e["id"], e["kwargs"]) for e in executions] == [(key, {}), (key, {})]
    assert work == [key]


class LostAfterRecord:
    """Fault injection around the real adapter: the first enqueue goes through
    (sent, and recorded as sent) and then fails, as a run cut after it would."""

    def __init__(self, task: CeleryTask) -> None:
        self.task, self.name, self.keys = task, task.name, list[str]()

    async def enqueue(self, request: HandoffRequest) -> str:
        self.keys.append(request.key)
        task_id = await self.task.enqueue(request)
        if len(self.keys) == 1:
            raise ConnectionError("the run was cut after the send")
        return task_id


async def test_a_tick_recorded_as_sent_is_not_sent_again(
    redis: RedisServer, worker: Worker, tmp_path: Path
) -> None:
    """Once the outbox records a tick sent, neither a retry nor a second scheduler
    on the same store sends it again: they get its task id, Celery gets one task."""
    task = _task(worker)
    handoff = LostAfterRecord(task)
    ticks: list[datetime] = []
    async with (
        celery_app(redis) as app,
        redis_client(redis) as r,
        engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
    ):
        scheduler = instance(engine)

        @scheduler.every(seconds=3, enqueue=handoff, retries=2, retry_backoff=0.05)
        async def digest(ctx: JobContext) -> dict[str, object]:
            ticks.append(ctx.tick)
            return {"tick": ctx.tick.isoformat()}

        async with scheduler.running({"db": engine, "celery": app}):
            await poll(lambda: len(handoff.keys) >= 2, within=30)
        runs = await _store_runs(engine, "digest")
        key = handoff_key("digest", ticks[0])
        async with open_store(engine) as peer:  # a second scheduler's store
            again = HandoffRequest("digest", ticks[0], key, {}, {"celery": app}, peer.outbox)
            assert await task.enqueue(again) == key
        await poll(lambda: _count(worker, r, 1), within=30)
        await anyio.sleep(1)  # a second send, if any, would arrive meanwhile
        executions = await worker.executions(r)

    assert handoff.keys[:2] == [key, key]
    assert runs[0]["outcome"] == "ok" and runs[0]["attempts"] == 2
    assert [e["id"] for e in executions] == [key]


@pytest.mark.slow  # 5-6 s of a frozen Redis: .ci/run's slow pass
async def test_a_frozen_redis_fails_the_runs_and_no_work_runs_twice(
    redis: RedisServer, worker: Worker, tmp_path: Path
) -> None:
    """Redis stopped (SIGSTOP: connected, not answering) for a few seconds: the
    sends due meanwhile fail within the socket timeout (outcome failed, the error
    recorded); a failed send may still land when Redis resumes, and its retry too,
    under the same task id: no tick's work runs twice (counted by request.id)."""
    async with (
        celery_app(redis) as app,
        redis_client(redis) as r,
        engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
    ):
        scheduler = instance(engine)

        @scheduler.every(seconds=0.5, enqueue=_task(worker, timeout=3), retries=1)
        async def digest(ctx: JobContext) -> dict[str, object]:
            return {"tick": ctx.tick.isoformat()}

        def ok() -> int:
            status = scheduler.job_status("digest")
            return status.runs - status.failures

        async with scheduler.running({"db": engine, "celery": app}):
            await poll(lambda: ok() >= 2, within=30)
            redis.freeze()
            try:
                await poll(lambda: scheduler.job_status("digest").failures >= 2, within=30)
            finally:
                redis.thaw()
            ok_before = ok()
            await poll(lambda: ok() >= ok_before + 2, within=30)
        runs = await _store_runs(engine, "digest")
        outbox = await _outbox(engine)
        sent = [key for key, (_, was_sent) in outbox.items() if was_sent]
        await poll(lambda: _count(worker, r, len(sent)), within=30)
        await anyio.sleep(1)  # late landings of the failed sends, if any
        executions = await worker.executions(r)
        work = await worker.work(r)

    failures = [row for row in runs if row["outcome"] == "failed"]
    assert len(failures) >= 2
    assert all("the broker is down or not answering" in row["error"] for row in failures)
    assert len(work) == len(set(work)), "a tick's work ran twice"
    assert set(sent) <= set(work)
    # Nothing but the ticks run (a failed first send is not recorded, and may land).
    ran = {handoff_key("digest", datetime.fromtimestamp(row["tick"], UTC)) for row in runs}
    assert set(_by_id(executions)) <= ran


async def test_an_app_without_a_read_timeout_is_warned_and_bounded_by_timeout(
    redis: RedisServer, worker: Worker
) -> None:
    """Without a socket timeout a frozen broker holds a send forever: the adapter
    warns once, and the run still fails after ``timeout`` (its thread abandoned).
    That send was in doubt: it lands when Redis resumes."""
    async with celery_app(redis, transport={}) as app, redis_client(redis) as r:
        scheduler = Scheduler()
        # timeout=2: the first send is cold (Celery builds its producer pool then).
        scheduler.every(hours=1, name="digest", enqueue=_task(worker, timeout=2))(lambda: None)
        with pytest.warns(RuntimeWarning, match="set no read timeout"):
            warm = await scheduler.run_now("digest", state={"celery": app})
        assert warm.outcome == "ok", warm
        redis.freeze()
        try:
            frozen = await scheduler.run_now("digest", state={"celery": app})
        finally:
            redis.thaw()
        await poll(lambda: _count(worker, r, 2), within=30)
        executions = await worker.executions(r)

    assert frozen.outcome == "failed"
    assert "did not answer within 2s" in str(frozen.error)
    assert "under the same task_id" in str(frozen.error)
    assert len(_by_id(executions)) == 2  # each run_now is a tick of its own


async def test_a_broker_that_is_down_fails_the_run_at_once() -> None:
    """No broker at all: the send fails on its one attempt, saying so."""
    app = Celery("fj_test_down", broker="redis+socket:///nonexistent/redis.sock")
    app.conf.broker_transport_options = FAST
    app.conf.broker_connection_timeout = 1
    try:
        scheduler = Scheduler()
        task = CeleryTask("fj.record", app=app)
        scheduler.every(hours=1, name="digest", enqueue=task)(lambda: {"n": 1})
        result = await scheduler.run_now("digest")
    finally:
        app.close()
    assert result.outcome == "failed"
    assert "the broker is down or not answering" in str(result.error)
    assert isinstance(result.error, ConnectionError)


@pytest.mark.parametrize(
    ("args", "options", "said"),
    [
        (("",), {"app": lambda s: None}, "pass the Celery task's registered name"),
        ((None,), {"app": lambda s: None}, "pass the Celery task's registered name"),
        (("t",), {"app": "redis://user:s3cr3t@redis.example:6379/0"}, "app=<str>"),
        (("t",), {"app": Celery}, "app=<the class Celery>"),  # callable, but not an app
        (("t",), {"app": lambda s: None, "timeout": math.inf}, "a finite number of seconds"),
        (("t",), {"app": lambda s: None, "timeout": 0}, "a finite number of seconds"),
        (("t",), {"app": lambda s: None, "timeout": True}, "a finite number of seconds"),
        (("t",), {"app": lambda s: None, "queue": ""}, "the name of a queue a worker"),
    ],
)
def test_a_celery_task_that_cannot_work_is_refused_when_declared(
    args: tuple[Any, ...], options: dict[str, Any], said: str
) -> None:
    """Refused with what to pass, never echoing an app's value (a broker URL
    holds the password), and never a send that may wait forever."""
    with pytest.raises(ConfigurationError) as refused:
        CeleryTask(*args, **options)
    assert said in str(refused.value) and "s3cr3t" not in str(refused.value)


async def test_an_app_function_that_returns_no_app_fails_the_run_saying_so() -> None:
    """`app=` a function that returns no Celery (None, the state, an async
    function's coroutine): the run fails saying what app= must return."""

    async def made_async(state: Mapping[str, Any]) -> Celery:
        raise AssertionError("never awaited")

    for app in (lambda state: None, lambda state: state, made_async):
        scheduler = Scheduler()
        task = CeleryTask("fj.record", app=app)
        scheduler.every(hours=1, name="digest", enqueue=task)(lambda: None)
        result = await scheduler.run_now("digest")
        assert result.outcome == "failed"
        assert "app= returned <a " in str(result.error)
        assert "not a celery.Celery" in str(result.error)


async def test_the_docs_example_hands_a_tick_to_its_worker(
    redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's app and worker, as written: a run of the app's job reaches the
    page's worker, which gets the tick's key as its request.id and the job's kwargs."""
    (tmp_path / "web.py").write_text(_page_fragment("# fragment: web.py"))
    (tmp_path / "celery_tasks.py").write_text(_page_fragment("# fragment: celery_tasks.py"))
    monkeypatch.setenv("CELERY_BROKER_URL", f"redis+socket://{redis.socket}")
    monkeypatch.setenv("REDIS_URL", f"unix://{redis.socket}")
    monkeypatch.setenv("DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}")
    # The page's worker serves Celery's default queue: a queue of this test's own.
    async with redis_client(redis) as r:
        await r.delete("celery")
    log = tmp_path / "worker.log"
    proc = start_worker("celery_tasks", "celery", tmp_path, log)
    try:
        spec = importlib.util.spec_from_file_location("fj_docs_celery_web", tmp_path / "web.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        scheduler: Scheduler = module.scheduler
        async with serve(module.app):
            assert scheduler.job_status("digest").hand_off == "celery task tasks.send_digest"
            run = await scheduler.trigger("digest")
            result = await run.wait()
            assert result is not None and result.outcome == "ok", result
        key = handoff_key("digest", run.tick)
        line = f"{key}: digest for all at {run.tick.isoformat()}"
        await poll(lambda: line in log.read_text(), within=30)
    finally:
        stop(proc)
    assert log.read_text().count(line) == 1


@pytest.mark.parametrize(
    ("at", "timing"),
    [
        # (interval, lease) in seconds: see tests/queues/test_handoff_reclaim.py's TIMINGS.
        pytest.param("claim", (3, 2), id="claim-3s/2s"),
        pytest.param("send", (3, 2), id="send-3s/2s"),
        pytest.param("record", (3, 2), id="record-3s/2s"),
        pytest.param("claim", (1, 3), id="claim-1s/3s"),
        pytest.param("record", (1, 3), id="record-1s/3s"),
        pytest.param("claim", (10, 30), id="claim-10s/30s"),
    ],
)
@pytest.mark.slow  # minutes of real processes: CI's second run (pytest -m slow)
async def test_a_claimer_killed_around_its_send_leaves_each_tick_worked_once(
    at: str,
    timing: tuple[float, float],
    postgres: PostgresServer,
    redis: RedisServer,
    tmp_path: Path,
    apps: list[App],
) -> None:
    """Three uvicorn instances hand one job off to a real Celery worker; the one
    that won a chosen tick is SIGKILLed after its claim (``claim``), after its
    send but before the outbox recorded it (``send``), or after that record
    (``record``). A peer claims the tick again after its lease: it sends it
    (``claim``: once), sends it again under the same task_id (``send``: the
    window, Celery runs it twice, the task's work once), or sends nothing
    (``record``). Every other tick of the window is executed exactly once,
    whatever the interval and the lease."""
    interval, lease = timing
    url = postgres.url(postgres.create_database())
    queue = f"fj-reclaim-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "celery_worker.log"
    worker = start_worker(
        "tests.apps.celery_worker",
        queue,
        ROOT,
        log,
        FJ_REDIS_SOCKET=str(redis.socket),
        FJ_QUEUE=queue,
    )
    block = tmp_path / "block"
    env: dict[str, object] = {
        "FJ_REDIS_SOCKET": redis.socket,
        "FJ_QUEUE": queue,
        "INTERVAL": interval,
        "LEASE": lease,
        "BLOCK": block,
        "BLOCK_AT": at,
    }
    w = Worker(queue, worker, log)
    try:
        async with redis_client(redis) as r:
            for _ in range(3):
                apps.append(App(url, app="tests.apps.celery_handoff_app:app", **env))  # type: ignore[arg-type]
            for app in apps:
                app.wait_started()
            await poll(lambda: _count(w, r, 1), within=30)
            block.touch()  # the next tick's winner takes it and blocks
            taken = Path(f"{block}.taken")
            await poll(lambda: taken.exists() and " " in taken.read_text(), within=30)
            pid, key = (await anyio.Path(taken).read_text()).split(" ", 1)
            if at != "claim":
                reached = Path(f"{block}.{'sent' if at == 'send' else 'recorded'}")
                await poll(reached.exists, within=30)
            [victim] = [app for app in apps if app.pid == int(pid)]
            victim.signal(signal.SIGKILL)
            victim.proc.wait(10)
            chosen = datetime.fromisoformat(key.split("@", 1)[1].replace("Z", "+00:00"))
            # The chosen tick, then two ticks after those a dead claim may cost.
            end = after_a_dead_claimer(chosen.timestamp(), interval, lease)
            await poll(lambda: _worked_tick_at_least(w, r, end), within=end - time.time() + 45)
            for app in apps:
                if app is not victim:
                    app.terminate()
            await anyio.sleep(1)  # a late duplicate, if any, would arrive meanwhile
            executions = await w.executions(r)
            work = await w.work(r)
    finally:
        stop(worker)
    ids = [entry["id"] for entry in executions]
    assert ids.count(key) == (2 if at == "send" else 1), ids
    assert [i for i in ids if i != key] == list(dict.fromkeys(i for i in ids if i != key)), ids
    assert sorted(work) == sorted(set(ids)), "a tick's work ran twice, or not at all"
    ticks = sorted({datetime.fromisoformat(e["kwargs"]["tick"]).timestamp() for e in executions})
    window = [t for t in ticks if ticks[0] <= t <= end]
    expected = [ticks[0] + interval * k for k in range(round((end - ticks[0]) / interval) + 1)]
    # The ticks due while the dead claim holds the job may be refused
    # (docs/guides/queues.md); no other.
    lost = refused_after_a_dead_claimer(chosen.timestamp(), interval, lease)
    held = dropped_while_held(url, "digest", ticks, interval)
    assert set(expected) - set(window) <= lost | held, ticks
    [(outcome, by)] = rows(
        url,
        "SELECT outcome, instance FROM fastapi_jobs_runs WHERE job = 'digest' AND tick = :t",
        t=chosen.timestamp(),
    )
    assert outcome == "ok" and by.split(":")[1] != pid  # a peer's run of that tick


async def _worked_tick_at_least(worker: Worker, r: Redis, tick: float) -> bool:
    return any(
        datetime.fromisoformat(entry["kwargs"]["tick"]).timestamp() >= tick
        for entry in await worker.executions(r)
    )


async def test_a_send_the_store_cannot_record_is_an_ok_run_and_a_warning(
    redis: RedisServer, worker: Worker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store made before the outbox (``create_tables=False``, no outbox
    table): the send goes out and its record fails; the tick is in the broker,
    so the run is ok (not retried into a second send), and the log says why a
    later retry could send it again."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}"
    async with celery_app(redis) as app, redis_client(redis) as r, engine_for(url) as engine:
        async with engine.begin() as conn:
            await conn.exec_driver_sql("DROP TABLE fastapi_jobs_handoffs")
        scheduler = instance(engine, create_tables=False)
        scheduler.every(hours=1, name="digest", enqueue=_task(worker), retries=2)(lambda: None)
        with caplog.at_level(logging.WARNING, logger="fastapi_jobs"):
            async with scheduler.running({"db": engine, "celery": app}):
                result = await (await scheduler.trigger("digest")).wait()
        await poll(lambda: _count(worker, r, 1), within=30)
        executions = await worker.executions(r)
    assert result is not None and result.outcome == "ok" and result.attempts == 1
    assert len(executions) == 1
    assert "but the store could not record it" in caplog.text


async def test_a_kwarg_named_self_fails_the_run_before_sending() -> None:
    """``self`` is a bound task's own (bind=True): a job returning it would make
    the task fail in the worker, so the run fails here, saying so."""
    scheduler = Scheduler()
    app = Celery("fj_unused", broker="memory://")
    app.conf.broker_transport_options = {"socket_timeout": 1}
    task = CeleryTask("fj.record", app=app)
    scheduler.every(hours=1, name="digest", enqueue=task)(lambda: {"self": 1})
    result = await scheduler.run_now("digest")
    app.close()
    assert result.outcome == "failed" and "'self' is the bound task's own" in str(result.error)
