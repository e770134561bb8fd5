"""Hand-off jobs with procrastinate: a real PostgreSQL database holding both the
store's tables and procrastinate's schema, a real procrastinate worker process.
Real time, short intervals, wide margins."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from procrastinate import App, PsycopgConnector
from sqlalchemy.ext.asyncio import AsyncEngine

from fastapi_jobs import ConfigurationError, JobContext, JobStatus, Scheduler
from fastapi_jobs.queues import HandoffRequest, handoff_key
from fastapi_jobs.queues.procrastinate import ProcrastinateTask
from fastapi_jobs.stores import Instance, SQLAlchemyStore

from ..conftest import serve
from ..support.cluster import ROOT
from ..support.cluster import App as Uvicorn  # a uvicorn process (procrastinate has an App)
from ..support.instances import engine_for, instance
from ..support.postgres import PostgresServer
from ..support.ticks import (
    after_a_dead_claimer,
    dropped_while_held,
    refused_after_a_dead_claimer,
)
from ..support.waiting import poll
from ..support.workers import spawn, stop
from .test_handoff_reclaim import TIMINGS

TICK = datetime(2026, 3, 2, 1, 0, tzinfo=UTC)


@dataclass
class Database:
    """A fresh PostgreSQL database with procrastinate's schema applied."""

    server: PostgresServer
    name: str

    def url(self, driver: str = "asyncpg") -> str:
        return self.server.url(self.name, driver)

    @property
    def dsn(self) -> str:
        """For psycopg (procrastinate's connector)."""
        return f"postgresql://postgres@127.0.0.1:{self.server.port}/{self.name}"


async def apply_schema(dsn: str) -> None:
    app = App(connector=PsycopgConnector(conninfo=dsn))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


@pytest.fixture
async def database(postgres: PostgresServer) -> Database:
    return await fresh_database(postgres)


async def fresh_database(postgres: PostgresServer) -> Database:
    """A new database with procrastinate's schema and the worker's ``executions``."""
    db = Database(postgres, postgres.create_database())
    await apply_schema(db.dsn)
    postgres.psql("CREATE TABLE executions (job_id bigint, kwargs jsonb)", db.name)
    return db


def start_worker(app: str, cwd: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``procrastinate --app=<app> worker`` in ``cwd``, its output in ``log``."""
    return spawn(["procrastinate", f"--app={app}", "worker"], cwd, log, PYTHONPATH=str(cwd), **env)


@pytest.fixture
def worker(database: Database, tmp_path: Path) -> Iterator[Path]:
    """A real procrastinate worker process on the test's database; its log."""
    with running_worker(database, tmp_path) as log:
        yield log


@contextmanager
def running_worker(database: Database, tmp_path: Path) -> Iterator[Path]:
    """A procrastinate worker process on ``database``, stopped at the end; its log."""
    log = tmp_path / "worker.log"
    proc = start_worker("tests.apps.procrastinate_worker.app", ROOT, log, FJ_PG_DSN=database.dsn)
    try:
        yield log
    finally:
        stop(proc)


async def _rows(engine: AsyncEngine, sql: str) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        return [dict(row._mapping) for row in await conn.execute(sa.text(sql))]


async def _jobs(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await _rows(engine, "SELECT id, task_name, queue_name, args FROM procrastinate_jobs")


async def _executions(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await _rows(engine, "SELECT job_id, kwargs FROM executions")


async def _handoffs(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await _rows(engine, "SELECT job, tick, queue, queue_id FROM fastapi_jobs_handoffs")


async def _runs(engine: AsyncEngine, job: str) -> list[dict[str, Any]]:
    return await _rows(
        engine,
        f"SELECT tick, outcome, error FROM fastapi_jobs_runs WHERE job = '{job}' ORDER BY id",
    )


async def _executed(engine: AsyncEngine, n: int) -> bool:
    return len(await _executions(engine)) >= n


def _once_each(jobs: list[dict[str, Any]], ticks: list[datetime]) -> None:
    """Each tick is one job in procrastinate_jobs (its kwargs carry the tick)."""
    in_queue = sorted(job["args"]["tick"] for job in jobs)
    assert in_queue == sorted(tick.isoformat() for tick in ticks)


def _ran_once_each(executions: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
    """Each job ran once, with the kwargs it was deferred with."""
    assert sorted((e["job_id"], json.dumps(e["kwargs"])) for e in executions) == sorted(
        (job["id"], json.dumps(job["args"])) for job in jobs
    )


CHILD = """
import asyncio, os, signal, sys
from datetime import datetime
import sqlalchemy as sa
from fastapi_jobs.queues import HandoffRequest, handoff_key
from fastapi_jobs.queues.procrastinate import ProcrastinateTask
from fastapi_jobs.stores import Instance, SQLAlchemyStore

class SlowOutbox:
    # The store's outbox, whose statement sleeps a second in the database
    # after the job's insert and before the outbox's record.

    def __init__(self, outbox):
        self.outbox = outbox

    @property
    def dialect(self):
        return self.outbox.dialect

    async def once(self, job, tick, queue, insert):
        inner = insert.cte("inner")
        sleep = sa.func.pg_sleep(1).table_valued("pause")
        slow = sa.select(inner.c.id).select_from(inner).join(sleep, sa.true())
        return await self.outbox.once(job, tick, queue, slow)

async def main():
    store = SQLAlchemyStore(sys.argv[1])
    await store.open({}, Instance())
    tick = datetime.fromisoformat(sys.argv[2])
    assert (await store.claim([("digest", tick.timestamp())]))["digest"] == 1
    request = HandoffRequest(
        "digest", tick, handoff_key("digest", tick), {"tick": sys.argv[2]}, {},
        SlowOutbox(store.outbox),
    )
    asyncio.get_running_loop().create_task(ProcrastinateTask("record").enqueue(request))
    await asyncio.sleep(0.5)  # the statement is in the database, sleeping
    print("sent", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


async def _in_flight(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        busy = await conn.scalar(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE state = 'active' AND query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()"
            )
        )
    return bool(busy)


async def _settled(engine: AsyncEngine) -> bool:
    return not await _in_flight(engine)


async def test_a_claimer_killed_mid_hand_off_leaves_the_tick_in_the_queue_once(
    database: Database, worker: Path
) -> None:
    """A process SIGKILLed while its hand-off statement runs in the database
    leaves the job and the outbox's record both or neither (one statement);
    a second hand-off of that tick then leaves it in the queue once."""
    async with engine_for(database.url()) as engine:
        with anyio.fail_after(60):
            child = await anyio.run_process(
                [sys.executable, "-c", CHILD, database.url(), TICK.isoformat()],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                check=False,
            )
        assert child.returncode == -signal.SIGKILL, child.stderr.decode()
        assert child.stdout.decode().strip() == "sent"
        # The database goes on with a statement whose client is gone.
        await poll(lambda: _settled(engine), within=30)
        left = (len(await _jobs(engine)), len(await _handoffs(engine)))
        assert left in {(0, 0), (1, 1)}

        store = SQLAlchemyStore(engine)
        await store.open({}, Instance())
        try:
            task = ProcrastinateTask("record")
            key = handoff_key("digest", TICK)
            request = HandoffRequest(
                "digest", TICK, key, {"tick": TICK.isoformat()}, {}, store.outbox
            )
            first = await task.enqueue(request)
            again = await task.enqueue(request)  # a retry, or a peer that reclaimed it
        finally:
            await store.close()
        await poll(lambda: _executed(engine, 1), within=30)
        jobs, executions = await _jobs(engine), await _executions(engine)

    assert first == again == str(jobs[0]["id"])
    _once_each(jobs, [TICK])
    _ran_once_each(executions, jobs)


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_a_locked_queue_fails_the_run_within_the_stores_deadline(
    database: Database, driver: str
) -> None:
    """procrastinate_jobs locked by another client: the runs due meanwhile fail
    within the store's operation deadline, saying so, and leave no job row and
    no outbox row; after the lock ends, ticks hand off again."""
    async with engine_for(database.url(driver)) as engine:
        scheduler = instance(engine, timeout=0.4)

        @scheduler.every(seconds=1, enqueue=ProcrastinateTask("record"))
        async def digest(ctx: JobContext) -> dict[str, object]:
            return {"tick": ctx.tick.isoformat()}

        def status() -> JobStatus:
            return scheduler.job_status("digest")

        async with scheduler.running({"db": engine}):
            await poll(lambda: status().runs >= 1, within=30)
            async with engine.connect() as locker, locker.begin():
                await locker.execute(
                    sa.text("LOCK TABLE procrastinate_jobs IN ACCESS EXCLUSIVE MODE")
                )
                await poll(lambda: status().failures >= 2, within=30)
            ok_before = status().runs - status().failures
            await poll(lambda: status().runs - status().failures >= ok_before + 1, within=30)
        runs = await _runs(engine, "digest")
        jobs, handoffs = await _jobs(engine), await _handoffs(engine)

    failed = [r for r in runs if r["outcome"] == "failed"]
    ok = [r for r in runs if r["outcome"] == "ok"]
    assert len(failed) >= 2
    assert all("did not take 'digest@" in r["error"] for r in failed), failed
    assert all("procrastinate_jobs locked" in r["error"] for r in failed), failed
    # Nothing half-made: only the ticks that ran ok are in the queue and recorded.
    ok_ticks = sorted(datetime.fromtimestamp(r["tick"], UTC) for r in ok)
    _once_each(jobs, ok_ticks)
    assert sorted(h["tick"] for h in handoffs) == sorted(r["tick"] for r in ok)


async def test_without_a_store_the_run_fails_saying_what_store_it_needs() -> None:
    """No store, no outbox: the run fails and says to give the scheduler a store
    on the database that holds procrastinate's schema."""
    scheduler = Scheduler()
    scheduler.every(hours=1, name="digest", enqueue=ProcrastinateTask("record"))(lambda: None)
    result = await scheduler.run_now("digest")
    assert result.outcome == "failed"
    assert "needs Scheduler(store=SQLAlchemyStore(<the PostgreSQL database that holds" in str(
        result.error
    )


async def test_a_sqlite_store_fails_the_run_saying_so(tmp_path: Path) -> None:
    """A SQLite store cannot hold procrastinate's queue: the run fails and says
    which store it needs, and which one it has."""
    async with engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine:
        scheduler = instance(engine)
        scheduler.every(hours=1, name="digest", enqueue=ProcrastinateTask("record"))(lambda: None)
        async with scheduler.running({"db": engine}):
            result = await (await scheduler.trigger("digest")).wait()
        handoffs = await _rows(engine, "SELECT job FROM fastapi_jobs_handoffs")
    assert result is not None and result.outcome == "failed"
    assert "needs Scheduler(store=SQLAlchemyStore(" in str(result.error)
    assert "this store is on sqlite" in str(result.error)
    assert handoffs == []


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_a_database_without_procrastinates_schema_fails_the_run_saying_to_apply_it(
    postgres: PostgresServer, driver: str
) -> None:
    """The store's database has no procrastinate schema: the run fails, says to
    apply it there, and records nothing (a later run, once applied, hands off)."""
    name = postgres.create_database()
    async with engine_for(postgres.url(name, driver)) as engine:
        scheduler = instance(engine)
        scheduler.every(hours=1, name="digest", enqueue=ProcrastinateTask("record"))(lambda: None)
        async with scheduler.running({"db": engine}):
            result = await (await scheduler.trigger("digest")).wait()
            await apply_schema(Database(postgres, name).dsn)
            again = await (await scheduler.trigger("digest")).wait()
        handoffs = await _handoffs(engine)
        jobs = await _jobs(engine)
    assert result is not None and result.outcome == "failed"
    assert "has no procrastinate schema" in str(result.error)
    assert "procrastinate schema --apply" in str(result.error)
    assert again is not None and again.outcome == "ok", again
    assert [h["queue_id"] for h in handoffs] == [str(j["id"]) for j in jobs] and len(jobs) == 1


def test_a_task_object_gives_its_name_queue_priority_and_lock() -> None:
    """A procrastinate Task gives the defaults; the options override them; a
    name alone goes to procrastinate's default queue."""
    app = App(connector=PsycopgConnector(conninfo=""))

    @app.task(name="send_digest", queue="mail", priority=5, lock="digests")
    def send_digest() -> None: ...

    task = ProcrastinateTask(send_digest)
    assert (task.name, task.queue, task.priority, task.lock) == (
        "procrastinate task send_digest",
        "mail",
        5,
        "digests",
    )
    other = ProcrastinateTask(send_digest, queue="bulk", priority=-1, lock="other")
    assert (other.queue, other.priority, other.lock) == ("bulk", -1, "other")
    named = ProcrastinateTask("send_digest")
    assert (named.queue, named.priority, named.lock) == ("default", 0, None)


def _with_queueing_lock() -> Any:
    app = App(connector=PsycopgConnector(conninfo=""))
    return app.task(name="t", queueing_lock="one")(lambda: None)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: ProcrastinateTask(""), "the procrastinate task (what @app.task(...) returns)"),
        (lambda: ProcrastinateTask(len), "or its name as a string"),  # type: ignore[arg-type]
        (lambda: ProcrastinateTask("t", queue=""), "the name of a queue a worker reads"),
        (lambda: ProcrastinateTask("t", priority=True), "pass an int"),
        (lambda: ProcrastinateTask("t", priority=2**31), "PostgreSQL's integer range"),
        (lambda: ProcrastinateTask("t", priority="1"), "pass an int"),  # type: ignore[arg-type]
        (lambda: ProcrastinateTask("t", lock=3), "pass a lock name"),  # type: ignore[arg-type]
        (
            lambda: ProcrastinateTask(_with_queueing_lock()),
            "declare the task without queueing_lock",
        ),
    ],
)
def test_a_task_that_cannot_work_is_refused_when_declared(make: Any, said: str) -> None:
    """Refused at declaration, saying what to pass; a task with a queueing_lock
    too (its AlreadyEnqueued would abort the transaction that records the tick)."""
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        make()


def _page_fragment(first_line_start: str) -> str:
    """The Python block of docs/guides/queues.md whose first line starts so."""
    text = (ROOT / "docs" / "guides" / "queues.md").read_text()
    found: list[str] = [
        code
        for code in re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
        if code.startswith(first_line_start)
    ]
    assert len(found) == 1, first_line_start
    return found[0]


async def test_the_docs_example_hands_a_tick_to_its_worker(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's tasks and app, as written, on a database with procrastinate's
    schema: a run of the app's job is one procrastinate job, which the page's
    worker runs once with the job's kwargs."""
    (tmp_path / "tasks.py").write_text(_page_fragment("# fragment: tasks.py"))
    (tmp_path / "main.py").write_text(_page_fragment("# fragment: main.py"))
    db = Database(postgres, postgres.create_database())
    monkeypatch.setenv("PROCRASTINATE_DSN", db.dsn)
    monkeypatch.setenv("DATABASE_URL", db.url())
    # The page's command: `procrastinate --app=tasks.app schema --apply`.
    schema = await anyio.run_process(
        [sys.executable, "-m", "procrastinate", "--app=tasks.app", "schema", "--apply"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        check=False,
    )
    assert schema.returncode == 0, schema.stderr.decode()
    log = tmp_path / "worker.log"
    proc = start_worker("tasks.app", tmp_path, log)
    monkeypatch.syspath_prepend(tmp_path)
    try:
        spec = importlib.util.spec_from_file_location("fj_docs_procrastinate", tmp_path / "main.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        async with serve(module.app):
            scheduler: Scheduler = module.scheduler
            assert scheduler.job_status("digest").hand_off == "procrastinate task send_digest"
            run = await scheduler.trigger("digest")
            result = await run.wait()
            assert result is not None and result.outcome == "ok", result
        async with engine_for(db.url()) as engine:
            [job] = await _jobs(engine)
        line = f"{run.tick.isoformat()}: digest for all (procrastinate job {job['id']})"
        await poll(lambda: line in log.read_text(), within=30)
    finally:
        stop(proc)
        sys.modules.pop("tasks", None)
    assert job["task_name"] == "send_digest"
    assert job["args"] == {"audience": "all", "tick": run.tick.isoformat()}
    assert log.read_text().count(line) == 1


def _cluster(
    database: Database, block: Path, at: str, apps: list[Uvicorn], timing: tuple[float, float]
) -> None:
    """Three uvicorn instances of tests/apps/procrastinate_handoff_app.py
    (``timing``: the interval and the lease, in seconds) on the test's database."""
    interval, lease = timing
    for _ in range(3):
        apps.append(
            Uvicorn(
                database.url(),
                app="tests.apps.procrastinate_handoff_app:app",
                INTERVAL=str(interval),
                LEASE=str(lease),
                TIMEOUT="0.6",
                BLOCK=str(block),
                BLOCK_AT=at,
            )
        )
    for app in apps:
        app.wait_started()


async def _ticks_run(engine: AsyncEngine) -> list[float]:
    executions = await _executions(engine)
    return sorted(datetime.fromisoformat(e["kwargs"]["tick"]).timestamp() for e in executions)


@pytest.mark.parametrize(("at", "timing"), TIMINGS)
@pytest.mark.slow  # minutes of real processes: CI's second run (pytest -m slow)
async def test_a_claimer_killed_around_its_enqueue_leaves_each_tick_in_the_queue_once(
    at: str,
    timing: tuple[float, float],
    database: Database,
    worker: Path,
    tmp_path: Path,
    apps: list[Uvicorn],
) -> None:
    """Three instances hand one job off; the one that won a chosen tick is
    SIGKILLed before its enqueue (``before``) or after it, before its release
    (``after``: the job row and the outbox row committed). A peer claims the tick
    again after its lease and hands it off (``after``: the outbox row says it
    was, and nothing is inserted): every tick of the window is in
    procrastinate_jobs once and run once, the chosen one included, whatever the
    interval and the lease."""
    interval, lease = timing
    block = tmp_path / "block"
    async with engine_for(database.url()) as engine:
        _cluster(database, block, at, apps, timing)
        await poll(lambda: _executed(engine, 1), within=30)
        block.touch()  # the next tick's winner takes it and blocks
        taken = Path(f"{block}.taken")
        await poll(lambda: taken.exists() and " " in taken.read_text(), within=30)
        pid, key = (await anyio.Path(taken).read_text()).split(" ", 1)
        if at == "after":
            await poll(lambda: Path(f"{block}.enqueued").exists(), within=30)
        [victim] = [app for app in apps if app.pid == int(pid)]
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        chosen = datetime.fromisoformat(key.split("@", 1)[1].replace("Z", "+00:00")).timestamp()
        # The chosen tick, then two ticks after those a dead claim may cost.
        end = after_a_dead_claimer(chosen, interval, lease)

        async def through_end() -> bool:
            return chosen in (ran := await _ticks_run(engine)) and ran[-1] >= end

        await poll(through_end, within=end - time.time() + 30)
        for app in apps:
            if app is not victim:
                app.terminate()
        jobs = await _jobs(engine)
        await poll(lambda: _executed(engine, len(jobs)), within=30)
        executions = await _executions(engine)
        [(outcome, by)] = [
            (r["outcome"], r["instance"])
            for r in await _rows(
                engine,
                f"SELECT outcome, instance FROM fastapi_jobs_runs WHERE job = 'digest' "
                f"AND tick = {chosen}",
            )
        ]
    in_queue = sorted(datetime.fromisoformat(j["args"]["tick"]).timestamp() for j in jobs)
    assert len(in_queue) == len(set(in_queue)), f"a tick is in the queue twice: {in_queue}"
    assert chosen in in_queue
    _ran_once_each(executions, jobs)
    window = [t for t in in_queue if t <= end]
    # The ticks due while the dead claim holds the job may be refused (see
    # docs/guides/queues.md); no other.
    expected = [window[0] + interval * k for k in range(round((end - window[0]) / interval) + 1)]
    lost = refused_after_a_dead_claimer(chosen, interval, lease)
    held = dropped_while_held(database.url(), "digest", in_queue, interval)
    assert set(expected) - set(window) <= lost | held, (expected, window)
    if at == "after":
        # The victim's committed job is the tick's one: the peer inserted none.
        [job] = [j for j in jobs if datetime.fromisoformat(j["args"]["tick"]).timestamp() == chosen]
        assert str(job["id"]) == await anyio.Path(f"{block}.enqueued").read_text()
    assert outcome == "ok" and by.split(":")[1] != pid  # a peer's run of that tick
