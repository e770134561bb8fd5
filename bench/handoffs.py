"""Hand-offs: what handing a tick to a queue costs the app, side by side with
the queue library's own call, on a local server.

- ``call``: CPU per enqueue, the adapter's ``enqueue(request)`` against the
  library's own call with a new job id each time (arq: ``enqueue_job``),
  interleaved in rounds.
- ``ticks``: CPU per tick of N hand-off jobs at 1 s against N ordinary jobs
  whose body makes the same library call under the same key (no store: the
  claims cost both alike, and ``bench.claims`` measures them).

``python -m bench.handoffs [quick]`` prints the Markdown section.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _cpu_per_call(call: Callable[[int], Awaitable[Any]], n: int, offset: int) -> Awaitable[float]:
    async def measured() -> float:
        for k in range(20):  # warm: connections made, code paths taken
            await call(offset + 10_000_000 + k)
        started = time.process_time()
        for k in range(n):
            await call(offset + k)
        return (time.process_time() - started) / n * 1e6

    return measured()


async def arq_calls(socket: str, n: int, rounds: int) -> dict[str, float]:
    """µs of CPU per enqueue: arq's ``enqueue_job`` and ``ArqTask.enqueue``."""
    from arq.connections import ArqRedis

    from fastapi_jobs.queues import HandoffRequest, handoff_key
    from fastapi_jobs.queues.arq import ArqTask

    pool = ArqRedis(unix_socket_path=socket)
    task = ArqTask("noop", pool=pool)
    tick = datetime(2026, 1, 1, tzinfo=UTC).timestamp()

    async def library(k: int) -> None:
        await pool.enqueue_job("noop", _job_id=f"lib-{k}", audience="all")

    async def adapter(k: int) -> None:
        at = datetime.fromtimestamp(tick + k, UTC)
        key = handoff_key("digest", at)
        await task.enqueue(HandoffRequest("digest", at, key, {"audience": "all"}, {}))

    found: dict[str, list[float]] = {"library": [], "adapter": []}
    try:
        for r in range(rounds):  # interleaved: the machine's drifts hit both alike
            await pool.flushall()
            found["library"].append(await _cpu_per_call(library, n, r * n))
            await pool.flushall()
            found["adapter"].append(await _cpu_per_call(adapter, n, r * n))
    finally:
        await pool.aclose()
    return {name: statistics.median(values) for name, values in found.items()}


async def arq_ticks(socket: str, jobs: int, window: float, kind: str) -> float:
    """µs of CPU per tick: ``jobs`` jobs at 1 s for ``window`` seconds, each
    tick enqueued to arq: as hand-off jobs (``kind`` "handoff"), or as ordinary
    jobs making the call ("plain"), or making it under a time limit as the
    adapter does ("bounded": arq waits forever on a Redis that stopped answering)."""
    import anyio
    from arq.connections import ArqRedis

    from fastapi_jobs import JobContext, Scheduler
    from fastapi_jobs.queues import handoff_key
    from fastapi_jobs.queues.arq import ArqTask

    pool = ArqRedis(unix_socket_path=socket, max_connections=jobs + 10)
    await pool.flushall()
    quiet = logging.getLogger("bench.handoffs")
    quiet.setLevel(logging.WARNING)
    scheduler = Scheduler(history=0, logger=quiet)
    task = ArqTask("noop", pool=pool)

    async def kwargs() -> dict[str, str]:  # async, as the ordinary job: no thread
        return {"audience": "all"}

    for k in range(jobs):
        name = f"job{k}"
        if kind == "handoff":
            scheduler.every(seconds=1, name=name, enqueue=task)(kwargs)
            continue

        async def body(ctx: JobContext) -> None:
            key = handoff_key(ctx.name, ctx.tick)
            if kind == "plain":
                await pool.enqueue_job("noop", _job_id=key, audience="all")
                return
            with anyio.move_on_after(5):
                await pool.enqueue_job("noop", _job_id=key, audience="all")

        scheduler.every(seconds=1, name=name)(body)
    try:
        async with scheduler.running():
            await asyncio.sleep(1.5)  # every job placed, its first tick past
            started, ran = time.process_time(), _ran(scheduler)
            await asyncio.sleep(window)
            cpu, ticks = time.process_time() - started, _ran(scheduler) - ran
    finally:
        await pool.aclose()
    return cpu / max(1, ticks) * 1e6


async def procrastinate_calls(server: Any, n: int, rounds: int) -> dict[str, float]:
    """µs of CPU per enqueue: procrastinate's ``defer_async`` (its own pool) and
    ``ProcrastinateTask.enqueue`` through a store on asyncpg and on psycopg."""
    from procrastinate import App, PsycopgConnector

    from fastapi_jobs.queues import HandoffRequest, handoff_key
    from fastapi_jobs.queues.procrastinate import ProcrastinateTask
    from fastapi_jobs.stores import Instance, SQLAlchemyStore

    database = server.create_database()
    dsn = f"postgresql://postgres@127.0.0.1:{server.port}/{database}"
    app = App(connector=PsycopgConnector(conninfo=dsn))
    found: dict[str, list[float]] = {"library": [], "asyncpg": [], "psycopg": []}
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.task(name="noop")(lambda **kwargs: None)
        stores = {}
        for driver in ("asyncpg", "psycopg"):
            store = stores[driver] = SQLAlchemyStore(server.url(database, driver))
            await store.open({}, Instance())
        tick = datetime(2026, 1, 1, tzinfo=UTC).timestamp()

        async def library(k: int) -> None:
            await task.defer_async(audience="all")

        def adapter(driver: str) -> Callable[[int], Awaitable[Any]]:
            handoff, outbox = ProcrastinateTask(task), stores[driver].outbox
            offset = 0.0 if driver == "asyncpg" else 1e9  # ticks of their own

            async def call(k: int) -> None:
                at = datetime.fromtimestamp(tick + offset + k, UTC)
                key = handoff_key("digest", at)
                request = HandoffRequest("digest", at, key, {"audience": "all"}, {}, outbox)
                await handoff.enqueue(request)

            return call

        try:
            for r in range(rounds):
                found["library"].append(await _cpu_per_call(library, n, r * n))
                for driver in ("asyncpg", "psycopg"):
                    found[driver].append(await _cpu_per_call(adapter(driver), n, r * n))
        finally:
            for store in stores.values():
                await store.close()
    return {name: statistics.median(values) for name, values in found.items()}


async def celery_calls(socket: str, postgres: Any, n: int, rounds: int) -> dict[str, float]:
    """µs of CPU per send: Celery's ``send_task`` called directly, and in a
    worker thread (as an async app must call it: it blocks); ``CeleryTask.enqueue``
    without a store, and with a store on PostgreSQL (asyncpg) recording each send."""
    import anyio
    from celery import Celery  # type: ignore[import-untyped]

    from fastapi_jobs.queues import HandoffRequest, handoff_key
    from fastapi_jobs.queues.celery import CeleryTask
    from fastapi_jobs.stores import Instance, SQLAlchemyStore

    app = Celery("bench", broker=f"redis+socket://{socket}")
    app.conf.broker_transport_options = {"socket_timeout": 1, "socket_connect_timeout": 1}
    store = SQLAlchemyStore(postgres.url(postgres.create_database(), "asyncpg"))
    await store.open({}, Instance())
    task = CeleryTask("noop", app=app)
    tick = datetime(2026, 1, 1, tzinfo=UTC).timestamp()

    def send(k: int) -> None:
        app.send_task("noop", kwargs={"audience": "all"}, task_id=f"lib-{k}")

    async def direct(k: int) -> None:
        send(k)

    async def threaded(k: int) -> None:
        await anyio.to_thread.run_sync(send, k)

    def adapter(outbox: Any, offset: float) -> Callable[[int], Awaitable[Any]]:
        async def call(k: int) -> None:
            at = datetime.fromtimestamp(tick + offset + k, UTC)
            key = handoff_key("digest", at)
            request = HandoffRequest("digest", at, key, {"audience": "all"}, {}, outbox, False)
            await task.enqueue(request)

        return call

    calls = {
        "direct": direct,
        "threaded": threaded,
        "no store": adapter(None, 0.0),
        "store": adapter(store.outbox, 1e9),
    }
    found: dict[str, list[float]] = {name: [] for name in calls}
    try:
        for r in range(rounds):
            for name, call in calls.items():
                found[name].append(await _cpu_per_call(call, n, r * n))
    finally:
        await store.close()
        app.close()
    return {name: statistics.median(values) for name, values in found.items()}


def _ran(scheduler: Any) -> int:
    return sum(status.runs for status in scheduler.status())


def report(quick: bool = False) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer
    from tests.support.redis import RedisServer

    calls, rounds, jobs, window = (50, 1, 10, 1.0) if quick else (2000, 5, 100, 5.0)
    logging.getLogger("fastapi_jobs").setLevel(logging.WARNING)  # the stores' "created table"
    server = RedisServer()
    server.start()
    try:
        socket = str(server.socket)
        cost = asyncio.run(arq_calls(socket, calls, rounds))
        kinds = ("plain", "bounded", "handoff")
        per_tick: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(rounds):
            for kind in kinds:
                per_tick[kind].append(asyncio.run(arq_ticks(socket, jobs, window, kind)))
    finally:
        server.destroy()
    plain, bounded, handing = (statistics.median(per_tick[kind]) for kind in kinds)
    postgres = PostgresServer()
    postgres.start()
    server = RedisServer()
    server.start()
    try:
        deferred = asyncio.run(procrastinate_calls(postgres, calls, rounds))
        sent = asyncio.run(celery_calls(str(server.socket), postgres, calls, rounds))
    finally:
        postgres.destroy()
        server.destroy()
    library = deferred["library"]
    return [
        "## Hand-offs to a queue (issue 19)",
        "",
        f"CPU on the app's side, medians of {rounds} interleaved round(s), a local "
        "redis-server on a unix socket (arq; Celery's broker) and a local PostgreSQL 15 "
        "(procrastinate, its schema in the store's database; Celery's outbox). Per call: "
        f"{calls} enqueues each, a new job id each. Per tick: {jobs} jobs at 1 s for "
        f"{window:g} s, no store.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| arq `enqueue_job` (the library's call), µs CPU | {cost['library']:.0f} |",
        f"| `ArqTask.enqueue` (the adapter), µs CPU | {cost['adapter']:.0f} |",
        f"| adapter / library (target ≤ 2×) | {cost['adapter'] / cost['library']:.2f}× |",
        f"| ordinary job making the same call, µs CPU per tick | {plain:.0f} |",
        f"| ordinary job making it bounded (`move_on_after`), µs CPU per tick | {bounded:.0f} |",
        f"| hand-off job, µs CPU per tick | {handing:.0f} |",
        f"| hand-off / ordinary bounded (target ≤ 1×) | {handing / bounded:.2f}× |",
        f"| hand-off / ordinary unbounded | {handing / plain:.2f}× |",
        f"| procrastinate `defer_async` (the library's call), µs CPU | {library:.0f} |",
        *(
            row
            for driver in ("asyncpg", "psycopg")
            for row in (
                f"| `ProcrastinateTask.enqueue`, a store on {driver}, µs CPU | "
                f"{deferred[driver]:.0f} |",
                f"| {driver}: adapter / library (target ≤ 2×) | "
                f"{deferred[driver] / library:.2f}× |",
            )
        ),
        f"| Celery `send_task` (the library's call), µs CPU | {sent['direct']:.0f} |",
        f"| Celery `send_task` in a worker thread (an async app's call), µs CPU | "
        f"{sent['threaded']:.0f} |",
        f"| `CeleryTask.enqueue`, no store, µs CPU | {sent['no store']:.0f} |",
        f"| `CeleryTask.enqueue`, its send recorded in a store on asyncpg, µs CPU | "
        f"{sent['store']:.0f} |",
        f"| Celery: adapter without a store / threaded call (target ≤ 2×) | "
        f"{sent['no store'] / sent['threaded']:.2f}× |",
        f"| Celery: adapter with a store / threaded call (target ≤ 2×) | "
        f"{sent['store'] / sent['threaded']:.2f}× |",
    ]


if __name__ == "__main__":
    print("\n".join(report(quick=sys.argv[1:] == ["quick"])))
