"""100,000 stored schedules on one instance (issue 34), on a local PostgreSQL
server. ``python -m bench.many_schedules report`` prints the Markdown section
(``--into BENCHMARKS.md`` writes it there); ``... worker`` is one app process.

The store holds N schedules of one task, every second one at 60 s (a tick
due each minute) and the others once a day (their tick half a day away). One
process is started alone: the time from entering the lifespan to every timer
set (the store read, each row decoded, each job built and placed), its RSS
once started, its CPU over windows with no tick due and over whole minutes
(the N/2 ticks due included). Then 3 processes on the same database run the
minute's ticks: each due tick runs once, counted from the store's runs history.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from fastapi_jobs._dynamic.changes import READ_ALL_EVERY

from .__main__ import check_out
from .schedules import into, rss_kib

ROOT = Path(__file__).resolve().parent.parent
WORKER = [sys.executable, "-m", "bench.many_schedules", "worker"]
PROCESSES = 3


class Plan(NamedTuple):
    """The run's sizes: N schedules, the period of the due half, the heartbeat,
    the idle window, the minutes (periods) measured busy."""

    n: int
    every: float
    heartbeat: float
    idle: float
    periods: int


FULL = Plan(n=100_000, every=60.0, heartbeat=10.0, idle=20.0, periods=2)
QUICK = Plan(n=200, every=4.0, heartbeat=1.0, idle=1.0, periods=1)
SETTLE = 2.0
"""Seconds waited before each reading of the RSS (see `worker`)."""
SLOW = 86_400.0
"""The period of the other half: once a day, its tick half a day from the write."""


async def write_schedules(url: str, n: int, every: float) -> float:
    """N stored schedules of the task ``report`` (as `add_schedule` writes them:
    one row each, the spec from the library's own encoder), by multi-row
    INSERTs. Returns the seconds taken."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import Every
    from fastapi_jobs._dynamic.stored import encode
    from fastapi_jobs.stores import SQLAlchemyStore

    started = time.perf_counter()
    engine = create_async_engine(url)
    tables = SQLAlchemyStore(engine).tables
    now = time.time()
    # Made an hour ago (as a start meets them, not written the moment before):
    # the heartbeat's reads of changes look back a few seconds past the last.
    stamp = int((now - 3600) * 1e6)
    # The slow half's ticks half a day away, whenever the bench runs.
    far = (now + SLOW / 2) % SLOW
    due, slow = Every(seconds=every), Every(seconds=SLOW, offset=far)
    rows = [
        {
            "name": f"s{i:06d}",
            "task": "report",
            "spec": encode(due if i % 2 == 0 else slow, {"i": i}, {}),
            "version": stamp + i,
            "updated_at": now,
            "removed": False,
        }
        for i in range(n)
    ]
    async with engine.begin() as conn:
        await conn.run_sync(tables.metadata.create_all)
        await conn.execute(sa.delete(tables.schedules))
        for start in range(0, n, 5000):
            await conn.execute(sa.insert(tables.schedules), rows[start : start + 5000])
    await engine.dispose()
    return time.perf_counter() - started


async def worker(url: str, plan: Plan, job: str) -> dict[str, Any]:
    """One app process. ``job``: "alone" (started and measured alone), "boot"
    (the start only), or "cluster" (one of 3: says ready, records the ticks
    it runs from the time the driver gives, until the end it gives)."""
    import anyio._backends._asyncio  # noqa: F401 - loaded before the baseline, as in an app
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import JobContext, Scheduler
    from fastapi_jobs.stores import SQLAlchemyStore

    engine = create_async_engine(url, pool_size=20)
    store = SQLAlchemyStore(engine, heartbeat=plan.heartbeat)
    scheduler = Scheduler(store=store)
    ran: list[tuple[int, float]] = []
    record = (math.inf, math.inf)  # the ticks recorded: from, to (excluded)

    @scheduler.task
    async def report(ctx: JobContext, i: int) -> None:
        tick = ctx.tick.timestamp()
        if record[0] <= tick < record[1]:
            ran.append((i, tick))

    gc.collect()
    base = rss_kib()
    profile = os.environ.get("BENCH_PROFILE")  # a file to write the profiles to
    profiler = cProfile.Profile() if profile and job != "cluster" else None
    out: dict[str, Any] = {}
    started, cpu0 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    async with scheduler.running({"db": engine}):
        # Entered: the store read, every job made and its first tick placed.
        out["start_s"] = time.perf_counter() - started
        out["start_cpu_s"] = time.process_time() - cpu0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}.start")
        # The read's rows are let go a few turns of the loop later (the store's
        # task holds its answer until then): what the instance holds, settled.
        await asyncio.sleep(SETTLE)
        gc.collect()
        out["rss_mib"] = rss_kib() / 1024
        out["rss_added_mib"] = (rss_kib() - base) / 1024
        # (Not len(scheduler.status()): a status of every job, made here, would
        # weigh in the RSS after.)
        out["jobs"] = len(scheduler._parts.runners)
        if job == "alone":
            out.update(await steady(scheduler, plan, profile))
        elif job == "cluster":
            print("ready", flush=True)
            opens, ends = map(float, (await asyncio.to_thread(sys.stdin.readline)).split())
            record = (opens, opens + plan.every)  # one tick of each schedule due
            await asyncio.sleep(opens - 1.0 - time.time())
            cpu0, t0 = time.process_time(), time.perf_counter()
            await asyncio.sleep(ends - time.time())
            out["cpu_pct"] = (time.process_time() - cpu0) / (time.perf_counter() - t0) * 100
            out["ran"] = ran
    await engine.dispose()
    return out


def _profiled(profile: str | None) -> cProfile.Profile | None:
    if not profile:
        return None
    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _dump(profiler: cProfile.Profile | None, profile: str | None, what: str) -> None:
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(f"{profile}.{what}")


async def steady(scheduler: Any, plan: Plan, profile: str | None) -> dict[str, Any]:
    """CPU in % of one core: over a window with no tick due (heartbeats in it),
    and over whole periods (the N/2 ticks due in each); then the CPU of one read
    of every row, as each instance makes every ``READ_ALL_EVERY``."""
    every = plan.every
    out: dict[str, Any] = {}
    # The idle window: from a third of a period after a tick (its runs done).
    opens = math.ceil(time.time() / every) * every + every / 3
    await asyncio.sleep(opens - time.time())
    profiler = _profiled(profile)
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(plan.idle)
    out["idle_cpu_pct"] = (time.process_time() - cpu0) / (time.perf_counter() - t0) * 100
    _dump(profiler, profile, "idle")
    # Whole periods, from a second before a tick to a second before the one after the last.
    opens = math.ceil(time.time() / every) * every - 1.0
    await asyncio.sleep(opens - time.time())
    profiler = _profiled(profile)
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(opens + plan.periods * every - time.time())
    out["busy_cpu_pct"] = (time.process_time() - cpu0) / (time.perf_counter() - t0) * 100
    _dump(profiler, profile, "busy")
    gc.collect()
    out["rss_after_mib"] = rss_kib() / 1024  # once the ticks' runs have come and gone
    # A read of every row, as the heartbeat makes one each READ_ALL_EVERY.
    # (The bench reaches into the scheduler: no public API times one read.)
    book = scheduler._book
    book._read_all_at = 0.0
    cpu0 = time.process_time()
    await book.sync()
    out["read_all_cpu_ms"] = (time.process_time() - cpu0) * 1000
    await asyncio.sleep(SETTLE)
    gc.collect()
    out["rss_read_all_mib"] = rss_kib() / 1024
    return out


def run_cluster(url: str, plan: Plan) -> list[dict[str, Any]]:
    """3 processes on one database; the ticks of one period recorded, from a
    tick on the grid a few seconds after all of them started."""
    args = [url, *map(str, plan), "cluster"]
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(PROCESSES)]
        procs = [
            subprocess.Popen(
                [*WORKER, *args],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
            for log in logs
        ]
        for proc, log in zip(procs, logs, strict=True):
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                log.seek(0)
                raise RuntimeError(f"bench.many_schedules worker failed:\n{log.read()[-3000:]}")
        opens = math.ceil((time.time() + 3.0) / plan.every) * plan.every
        # The tick at ``opens`` of each schedule due, and a period for them to run.
        ends = opens + plan.every
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{opens} {ends}\n")
            proc.stdin.flush()
        results = []
        for proc, log in zip(procs, logs, strict=True):
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                log.seek(0)
                raise RuntimeError(f"bench.many_schedules worker failed:\n{log.read()[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def run_alone(url: str, plan: Plan) -> dict[str, Any]:
    command = [*WORKER, url, *map(str, plan), "alone"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"bench.many_schedules worker failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def apply_set(url: str, n: int, every: float) -> dict[str, float]:
    """`Scheduler.apply_schedules` of the same N schedules, into an empty table,
    then again (every one as it is): the public call's bulk figure."""
    import logging

    from fastapi_jobs import Every, JobContext, Scheduler, ScheduleSpec
    from fastapi_jobs.stores import SQLAlchemyStore

    logging.disable(logging.INFO)  # one line per job started is not what is measured
    scheduler = Scheduler(store=SQLAlchemyStore(url), max_schedules=None)

    @scheduler.task()
    async def report(ctx: JobContext, tenant: str) -> None: ...

    wanted = [
        ScheduleSpec(
            f"s{i}", "report", Every(seconds=every if i % 2 else SLOW), {"tenant": f"t{i}"}
        )
        for i in range(n)
    ]
    out: dict[str, float] = {}
    async with scheduler.running():
        for key in ("first_s", "again_s"):
            started = time.perf_counter()
            await scheduler.apply_schedules("bench", wanted)
            out[key] = time.perf_counter() - started
    return out


def run_apply(url: str, plan: Plan) -> dict[str, float]:
    """`apply_set` in a process of its own."""
    done = subprocess.run(
        [*WORKER[:-1], "apply", url, str(plan.n), str(plan.every)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def report(quick: bool = False) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer

    plan = QUICK if quick else FULL
    n, every = plan.n, plan.every
    server = PostgresServer()
    server.start()
    try:
        url = server.url(server.create_database())
        wrote = asyncio.run(write_schedules(url, n, every))
        alone = run_alone(url, plan)
        cluster = run_cluster(url, plan)
        applied = run_apply(server.url(server.create_database()), plan)
    finally:
        server.destroy()
    due = (n + 1) // 2
    pairs = Counter((i, tick) for r in cluster for i, tick in r["ran"])
    most = max(pairs.values(), default=0)
    period = f"{every:g} s"
    return [
        f"## {n:,} stored schedules on one instance, half of them due every {period}: "
        "local PostgreSQL 15 (asyncpg)",
        "",
        f"{n:,} rows in the store's schedules table, written by multi-row INSERTs in "
        f"{wrote:.1f} s. Every second one runs each {period}, the others once a day. "
        f"One process ran alone (heartbeat {plan.heartbeat:g} s). Then {PROCESSES} "
        "processes ran on the same database for one period. One run, each process fresh. "
        "Wall times rise with the machine's load; CPU times less so.",
        "",
        "| figure | measured | target |",
        "|---|---|---|",
        f"| jobs once started | {alone['jobs']:,} | {n:,} |",
        f"| start: entering the lifespan to every timer set (the store read included), s | "
        f"{alone['start_s']:.2f} (CPU {alone['start_cpu_s']:.2f}) | ≤ 2 |",
        f"| RSS {SETTLE:g} s after the start; after a period's ticks; {SETTLE:g} s after a read "
        "of every row, MiB | "
        f"{alone['rss_mib']:.0f}; {alone['rss_after_mib']:.0f}; "
        f"{alone['rss_read_all_mib']:.0f} | ≤ 300 |",
        f"| CPU with no tick due ({plan.idle:g} s, heartbeats in it), % of one core | "
        f"{alone['idle_cpu_pct']:.2f} | ≤ 1 |",
        f"| CPU over {plan.periods} whole period(s), {due:,} ticks due in each, one "
        f"instance alone, % of one core | {alone['busy_cpu_pct']:.1f} | |",
        f"| CPU of a read of every row (each instance, every {READ_ALL_EVERY:g} s), ms | "
        f"{alone['read_all_cpu_ms']:.0f} | |",
        f"| {PROCESSES} instances: ticks of one period run, of {due:,} due; most runs "
        f"of one tick | {len(pairs):,}; {most} | all; 1 |",
        f"| {PROCESSES} instances: CPU of each over the period, % of one core | "
        f"{', '.join(format(r['cpu_pct'], '.1f') for r in cluster)} | |",
        f"| `apply_schedules` of the {n:,} in one call, into an empty table; the same set "
        f"again (each as it is), s | {applied['first_s']:.1f}; {applied['again_s']:.1f} | "
        "≤ 30 |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.many_schedules")
    parser.add_argument("mode", choices=["worker", "write", "apply", "report"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument(
        "--into",
        default=None,
        help="report: write the section into this file of `python -m bench --out` (BENCHMARKS.md)",
    )
    parser.add_argument("--quick", action="store_true", help="report: tiny N (smoke test)")
    args = parser.parse_args()
    if args.mode == "worker":
        url, *sizes, job = args.rest
        n, every, heartbeat, idle, periods = sizes
        plan = Plan(int(n), float(every), float(heartbeat), float(idle), int(periods))
        print(json.dumps(asyncio.run(worker(url, plan, job))))
    elif args.mode == "apply":
        url, n, every = args.rest
        print(json.dumps(asyncio.run(apply_set(url, int(n), float(every)))))
    elif args.mode == "write":
        url, n, every = args.rest
        print(asyncio.run(write_schedules(url, int(n), float(every))))
    else:
        if args.into:
            check_out(Path(args.into))  # before the run, not minutes into it
        section = report(quick=args.quick)
        if args.into:
            into(
                Path(args.into),
                section,
                "python -m bench.many_schedules report --into BENCHMARKS.md",
            )
        else:
            print("\n".join(section))


if __name__ == "__main__":
    main()
