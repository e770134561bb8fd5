"""Hand-off jobs with arq: a real Redis server, a real arq worker process, a real
SQLite store. Real time, short intervals, wide margins (the worker and Redis run
on their own clocks)."""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from fastapi_jobs import ConfigurationError, JobContext, Scheduler
from fastapi_jobs.queues import Handoff, HandoffRequest, handoff_key
from fastapi_jobs.queues.arq import ArqTask

from ..conftest import serve
from ..support.cluster import ROOT
from ..support.instances import engine_for, instance
from ..support.redis import RedisServer
from ..support.waiting import poll
from ..support.workers import spawn, stop


@dataclass
class Worker:
    """An arq worker process serving ``queue``; what it ran is in Redis."""

    queue: str
    proc: subprocess.Popen[bytes]
    log: Path

    async def executions(self, pool: ArqRedis) -> list[dict[str, Any]]:
        raw = await pool.lrange(f"executions:{self.queue}", 0, -1)  # type: ignore[misc]
        return [json.loads(entry) for entry in raw]


def start_worker(settings: str, cwd: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``python -m arq <settings>`` in ``cwd``, its output in ``log``."""
    return spawn(["arq", settings], cwd, log, **env)


@pytest.fixture
def worker(redis: RedisServer, tmp_path: Path) -> Iterator[Worker]:
    """A real arq worker (``python -m arq``) on a queue of the test's own."""
    with running_worker(redis, tmp_path) as started:
        yield started


@contextmanager
def running_worker(redis: RedisServer, tmp_path: Path) -> Iterator[Worker]:
    """An arq worker process on a queue of its own, stopped at the end (the
    queue contract's too: tests/queues/test_queue_contract.py)."""
    queue = f"fj-test:{uuid.uuid4().hex[:8]}"
    log = tmp_path / "arq_worker.log"
    proc = start_worker(
        "tests.apps.arq_worker.WorkerSettings",
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
async def arq_pool(redis: RedisServer) -> AsyncIterator[ArqRedis]:
    pool = await create_pool(RedisSettings(unix_socket_path=str(redis.socket), conn_retries=0))
    try:
        yield pool
    finally:
        await pool.aclose()


def _by_key(executions: list[dict[str, Any]]) -> dict[str, int]:
    """How many times each tick's key was executed."""
    counts: dict[str, int] = {}
    for entry in executions:
        counts[entry["key"]] = counts.get(entry["key"], 0) + 1
    return counts


async def _count(worker: Worker, pool: ArqRedis, n: int) -> bool:
    return len(await worker.executions(pool)) >= n


async def _store_runs(engine: Any, job: str) -> list[dict[str, Any]]:
    """The store's history of ``job``, oldest first, read from its table."""
    import sqlalchemy as sa

    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT tick, outcome, error, attempts FROM fastapi_jobs_runs "
                "WHERE job = :job ORDER BY id"
            ),
            {"job": job},
        )
        return [dict(row._mapping) for row in rows]


async def test_two_apps_with_a_job_of_one_name_on_two_queues_each_enqueue_every_tick(
    redis: RedisServer, tmp_path: Path
) -> None:
    """Two apps, each with its own store and a job ``digest``, hand off to two
    arq queues of one Redis. arq keeps one namespace of job ids per Redis: the
    ids carry the queue, and every tick of each app reaches its own queue."""
    queues = [f"fj-app{n}:{uuid.uuid4().hex[:8]}" for n in range(2)]
    procs = [
        start_worker(
            "tests.apps.arq_worker.WorkerSettings",
            ROOT,
            tmp_path / f"arq_worker{n}.log",
            FJ_REDIS_SOCKET=str(redis.socket),
            FJ_QUEUE=queue,
        )
        for n, queue in enumerate(queues)
    ]
    workers = [
        Worker(q, proc, tmp_path / f"arq_worker{n}.log")
        for n, (q, proc) in enumerate(zip(queues, procs, strict=True))
    ]
    handed: list[list[datetime]] = [[], []]
    try:
        async with (
            arq_pool(redis) as pool,
            engine_for(f"sqlite+aiosqlite:///{tmp_path / 'app0.db'}") as engine0,
            engine_for(f"sqlite+aiosqlite:///{tmp_path / 'app1.db'}") as engine1,
            AsyncExitStack() as stack,
        ):
            for n, engine in enumerate((engine0, engine1)):
                scheduler = instance(engine)
                task = ArqTask("record", pool=lambda s: s["arq"], queue_name=queues[n])

                async def digest(ctx: JobContext, n: int = n) -> dict[str, object]:
                    handed[n].append(ctx.tick)
                    return {"tick": ctx.tick.isoformat()}

                scheduler.every(seconds=0.5, enqueue=task)(digest)
                await stack.enter_async_context(scheduler.running({"db": engine, "arq": pool}))
            await poll(lambda: min(len(h) for h in handed) >= 4, within=30)
            await stack.aclose()
            for worker, ticks in zip(workers, handed, strict=True):
                await poll(partial(_count, worker, pool, len(ticks)), within=30)
            executions = [await worker.executions(pool) for worker in workers]
    finally:
        for proc in procs:
            stop(proc)
    for ticks, ran in zip(handed, executions, strict=True):
        assert _by_key(ran) == {handoff_key("digest", tick): 1 for tick in ticks}


# The cut enqueues' pipelines may be collected at any moment of the test (sooner
# on a loaded machine, where more ticks fail): their ResourceWarning is expected.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_a_frozen_redis_fails_the_runs_and_nothing_runs_twice(
    redis: RedisServer, worker: Worker, tmp_path: Path
) -> None:
    """Redis stopped (SIGSTOP: connected, not answering) for a few seconds: the
    enqueues due meanwhile fail within the adapter's timeout (outcome failed, the
    error recorded); after it resumes, ticks hand off again, and no key runs twice."""
    async with (
        arq_pool(redis) as pool,
        engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
    ):
        scheduler = instance(engine)
        task = ArqTask("record", pool=lambda s: s["arq"], queue_name=worker.queue, timeout=0.3)

        @scheduler.every(seconds=0.5, enqueue=task)
        async def digest(ctx: JobContext) -> dict[str, object]:
            return {"tick": ctx.tick.isoformat()}

        async with scheduler.running({"db": engine, "arq": pool}):
            await poll(lambda: scheduler.job_status("digest").runs >= 2, within=30)
            redis.freeze()
            try:
                await poll(lambda: scheduler.job_status("digest").failures >= 3, within=30)
            finally:
                redis.thaw()
            failed = scheduler.job_status("digest").failures
            ok_before = scheduler.job_status("digest").runs - failed
            await poll(
                lambda: (
                    scheduler.job_status("digest").runs - scheduler.job_status("digest").failures
                    >= ok_before + 2
                ),
                within=30,
            )
        # Each enqueue cut on the frozen Redis left redis-py's pipeline holding its
        # connection (its cleanup needs Redis to answer, and was cut too): Python
        # closes them when it collects them, with a ResourceWarning, as
        # docs/guides/queues.md says. Collected here, so that no later test gets the warning.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        runs = await _store_runs(engine, "digest")
        ok = [r for r in runs if r["outcome"] == "ok"]
        await poll(lambda: _count(worker, pool, len(ok)), within=30)
        executions = await worker.executions(pool)

    failures = [r for r in runs if r["outcome"] == "failed"]
    assert len(failures) >= 3
    assert all("did not answer within 0.3s" in r["error"] for r in failures), failures
    assert set(_by_key(executions).values()) == {1}, "a key ran twice"
    assert len(executions) >= len(ok)


class LostAnswer:
    """Fault injection around the real adapter: the first enqueue reaches Redis
    and then fails as if its answer were lost (a timeout, a dropped connection)."""

    def __init__(self, task: ArqTask) -> None:
        self.task, self.name, self.keys = task, task.name, list[str]()

    async def enqueue(self, request: HandoffRequest) -> str:
        self.keys.append(request.key)
        job_id = await self.task.enqueue(request)
        if len(self.keys) == 1:
            raise ConnectionError("the answer was lost")
        return job_id


async def test_a_retry_within_the_tick_uses_the_same_key(
    redis: RedisServer, worker: Worker, tmp_path: Path
) -> None:
    """An enqueue that went through but failed is retried with the same key,
    which arq refuses as a duplicate: the run ends ok, the task runs once."""
    handoff = LostAnswer(ArqTask("record", pool=lambda s: s["arq"], queue_name=worker.queue))
    async with (
        arq_pool(redis) as pool,
        engine_for(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}") as engine,
    ):
        scheduler = instance(engine)

        @scheduler.every(seconds=3, enqueue=handoff, retries=2, retry_backoff=0.05)
        def digest() -> None:  # sync, no kwargs: the task runs with none
            return None

        async with scheduler.running({"db": engine, "arq": pool}):
            await poll(lambda: len(handoff.keys) >= 2, within=30)
        runs = await _store_runs(engine, "digest")
        await poll(lambda: _count(worker, pool, 1), within=30)
        executions = await worker.executions(pool)

    [first, again] = handoff.keys[:2]
    assert first == again and first.startswith("digest@")
    assert runs[0]["outcome"] == "ok" and runs[0]["attempts"] == 2
    assert [(e["key"], e["kwargs"]) for e in executions] == [(first, {})]


class Kept:
    """A hand-off that keeps what it was given (no queue: the core's side only)."""

    name = "kept"

    def __init__(self) -> None:
        self.calls: list[tuple[str, datetime, Mapping[str, Any]]] = []

    async def enqueue(self, request: HandoffRequest) -> str:
        self.calls.append((request.key, request.tick, dict(request.kwargs)))
        return request.key


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (["a"], "return the queue task's keyword arguments as a dict"),
        ({"x": float("nan")}, "not JSON-able"),  # arq would pickle it; another queue not
        ({1: "a"}, "return the queue task's keyword arguments as a dict"),
        ({"when": datetime(2026, 1, 1, tzinfo=UTC)}, "not JSON-able"),
        # What JSON would change without a word is refused, not changed.
        ({"pair": (1, 2)}, "a tuple becomes a list"),
        ({"by_id": {7: "seven"}}, "a dict's int key a string"),
        ({"deep": [{"x": (1,)}]}, "JSON would change"),
    ],
)
async def test_kwargs_that_are_not_a_json_dict_fail_the_run(returned: object, message: str) -> None:
    """A hand-off job returns a dict of JSON-able values (or None): anything else
    fails the run, says what to return, and enqueues nothing."""
    kept = Kept()
    scheduler = Scheduler()
    scheduler.every(hours=1, name="digest", enqueue=kept)(lambda: returned)
    result = await scheduler.run_now("digest")
    assert result.outcome == "failed" and message in str(result.error)
    assert kept.calls == []


def test_handoff_keys_are_utc_with_microseconds_only_when_there_are_some() -> None:
    """The key is the job and its tick in UTC, to the second unless the tick has less."""
    from datetime import timedelta, timezone

    paris = timezone(timedelta(hours=1))
    assert (
        handoff_key("digest", datetime(2026, 3, 2, 1, tzinfo=paris))
        == "digest@2026-03-02T00:00:00Z"
    )
    assert (
        handoff_key("digest", datetime(2026, 3, 2, 0, 0, 0, 250, tzinfo=UTC))
        == "digest@2026-03-02T00:00:00.000250Z"
    )


def test_enqueue_must_be_a_handoff() -> None:
    """enqueue= takes a hand-off, and says which one otherwise."""
    with pytest.raises(ConfigurationError, match="pass a hand-off such as"):
        Scheduler().every(hours=1, name="d", enqueue="send_digest")(lambda: None)  # type: ignore[arg-type]
    assert isinstance(Kept(), Handoff)


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
    redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's app and worker, as written: a run of the app's job reaches the
    page's worker, which gets the tick's key as its job id and the job's kwargs."""
    (tmp_path / "app.py").write_text(_page_fragment("# fragment: app.py"))
    (tmp_path / "worker.py").write_text(_page_fragment("# fragment: worker.py"))
    monkeypatch.setenv("REDIS_URL", f"unix://{redis.socket}")
    monkeypatch.setenv("DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}")
    # The page's worker serves arq's default queue: a queue of this test's own.
    await _clear_default_queue(redis)
    log = tmp_path / "worker.log"
    proc = start_worker("worker.WorkerSettings", tmp_path, log)
    try:
        spec = importlib.util.spec_from_file_location("fj_docs_queues_app", tmp_path / "app.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        async with serve(module.app):
            scheduler: Scheduler = module.scheduler
            assert scheduler.job_status("digest").hand_off == "arq task send_digest"
            run = await scheduler.trigger("digest")
            result = await run.wait()
            assert result is not None and result.outcome == "ok"
        key = handoff_key("digest", run.tick)
        line = f"{key}: digest for all at {run.tick.isoformat()}"
        await poll(lambda: line in log.read_text(), within=30)
    finally:
        stop(proc)
    assert log.read_text().count(line) == 1


async def _clear_default_queue(redis: RedisServer) -> None:
    async with arq_pool(redis) as pool:
        await pool.delete("arq:queue")


async def test_a_sync_hand_off_job_that_returns_a_coroutine_is_told_to_be_async() -> None:
    """A sync function returning a coroutine fails the run, says to declare it
    `async def`, and leaves no coroutine un-awaited behind."""

    async def kwargs() -> dict[str, object]:
        return {}

    kept = Kept()
    scheduler = Scheduler()
    scheduler.every(hours=1, name="digest", enqueue=kept)(lambda: kwargs())
    result = await scheduler.run_now("digest")
    assert result.outcome == "failed" and "declare the job `async def`" in str(result.error)
    assert kept.calls == []


@pytest.mark.parametrize("option", ["_job_id", "_defer_by", "_expires", "function", "ctx"])
async def test_kwargs_named_like_arqs_own_options_fail_the_run(
    option: str, redis: RedisServer
) -> None:
    """arq reads `_job_id`, `_defer_by`, `_expires`, `function`, … as its own
    parameters of the enqueue, not as the task's arguments (a `_job_id` would replace
    the tick's key, a `_defer_by` delay the task), and passes every task a `ctx`
    first (a `ctx` kwarg failed in the worker on every run, while the run said ok):
    a job returning one fails, says so, and enqueues nothing."""
    await _clear_default_queue(redis)
    async with arq_pool(redis) as pool:
        scheduler = Scheduler()
        task = ArqTask("record", pool=pool)
        scheduler.every(hours=1, name="digest", enqueue=task)(lambda: {option: "x", "n": 1})
        result = await scheduler.run_now("digest")
        assert result.outcome == "failed", result
        assert f"{option} are arq's own" in str(result.error)
        assert await pool.queued_jobs() == []


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"pool": "redis://user:s3cr3t@redis.example:6379/0"}, "pool=<str>"),
        ({"pool": ArqRedis}, "pool=<the class ArqRedis>"),  # callable, but not a pool
        ({"pool": lambda state: None, "timeout": math.inf}, "a finite number of seconds"),
        ({"pool": lambda state: None, "timeout": True}, "a finite number of seconds"),
        ({"pool": lambda state: None, "queue_name": ""}, "the name of a queue a worker reads"),
    ],
)
def test_an_arq_task_that_cannot_work_is_refused_when_declared(
    options: dict[str, Any], said: str
) -> None:
    """Refused with what to pass, never echoing a pool's value (a DSN holds the
    password), and never an enqueue that may wait forever."""
    with pytest.raises(ConfigurationError) as refused:
        ArqTask("send_digest", **options)
    assert said in str(refused.value) and "s3cr3t" not in str(refused.value)


async def test_a_pool_function_that_returns_no_pool_fails_the_run_saying_so() -> None:
    """`pool=` a function that returns no ArqRedis (None, the state, an async
    function's coroutine): the run fails saying what pool= must return."""

    async def made_async(state: Mapping[str, Any]) -> ArqRedis:
        raise AssertionError("never awaited")

    for pool in (lambda state: None, lambda state: state, made_async):
        scheduler = Scheduler()
        task = ArqTask("record", pool=pool)  # type: ignore[arg-type]
        scheduler.every(hours=1, name="digest", enqueue=task)(lambda: None)
        result = await scheduler.run_now("digest")
        assert result.outcome == "failed"
        assert "pool= returned <a " in str(result.error) and "not an ArqRedis" in str(result.error)


async def test_the_cli_hands_the_current_tick_off_once(redis: RedisServer, tmp_path: Path) -> None:
    """``fastapi-jobs run`` on the page's app claims the job's current tick and
    hands it off, saying the key; run again, the tick is taken (exit 3) and the
    worker runs it once."""
    (tmp_path / "app.py").write_text(_page_fragment("# fragment: app.py"))
    (tmp_path / "worker.py").write_text(_page_fragment("# fragment: worker.py"))
    env = {
        **os.environ,
        "REDIS_URL": f"unix://{redis.socket}",
        "DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}",
        "PYTHONPATH": str(tmp_path),
    }
    await _clear_default_queue(redis)
    log = tmp_path / "worker.log"
    proc = start_worker("worker.WorkerSettings", tmp_path, log, REDIS_URL=env["REDIS_URL"])

    def cli() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "fastapi_jobs", "run", "app:app", "digest"]
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )

    handed = r"handed to arq task send_digest under the key '(digest@[^']+)'"
    keys: list[str] = []
    try:
        first = await anyio.to_thread.run_sync(cli)
        said = re.search(handed, first.stderr)
        assert first.returncode == 0 and said, first.stderr
        keys.append(said.group(1))
        await poll(lambda: f"{keys[0]}: digest for all" in log.read_text(), within=30)
        again = await anyio.to_thread.run_sync(cli)
        if again.returncode == 0:
            # An hour began between the two runs: the second is the new hour's
            # tick, handed off once too; a third run finds that one taken.
            later = re.search(handed, again.stderr)
            assert later and later.group(1) > keys[0], again.stderr
            keys.append(later.group(1))
            await poll(lambda: f"{keys[1]}: digest for all" in log.read_text(), within=30)
            again = await anyio.to_thread.run_sync(cli)
    finally:
        stop(proc)
    assert again.returncode == 3, again.stderr  # the tick was claimed: not handed off twice
    worked = log.read_text()
    assert all(worked.count(f"{key}: digest for all") == 1 for key in keys)
