"""Schedules as data (issue 20) on a local PostgreSQL server: 3 processes × N
schedules at 1 min, stored in the store against declared in code (the same task
body, the same store), rounds interleaved. ``python -m bench.schedules`` prints
the Markdown section; ``python -m bench.schedules worker ...`` is one app process.

Per round, each process: its memory per job once started (RSS, as the ticks
benchmark measures it); the cluster's CPU in a window holding one tick of every
job; then (stored rounds) one schedule changed by another client of the
database, and the CPU of the heartbeat's read of the changes in each process,
the one that saw the change against those that saw none.
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
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from .__main__ import REPRODUCE, check_out, write_out

ROOT = Path(__file__).resolve().parent.parent
WORKER = [sys.executable, "-m", "bench.schedules", "worker"]
PROCESSES = 3


class Plan(NamedTuple):
    """The run's sizes: N schedules at ``every`` s, the heartbeat, the rounds."""

    n: int
    every: float
    heartbeat: float
    repeat: int


FULL = Plan(n=10_000, every=60.0, heartbeat=1.0, repeat=5)
QUICK = Plan(n=50, every=2.0, heartbeat=0.5, repeat=1)


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def worker(
    url: str,
    kind: str,
    n: int,
    every: float,
    heartbeat: float,
) -> dict[str, Any]:
    from functools import partial

    import anyio._backends._asyncio  # noqa: F401 - loaded before the baseline, as in an app
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import Every, JobContext, Scheduler
    from fastapi_jobs.stores import SQLAlchemyStore

    on = False
    runs: list[tuple[str, float]] = []
    engine = create_async_engine(url, pool_size=20)
    store = SQLAlchemyStore(engine, heartbeat=heartbeat)
    gc.collect()
    base = rss_kib()
    scheduler = Scheduler(store=store)

    async def report(ctx: JobContext, i: int) -> None:
        if on:
            runs.append((ctx.name, ctx.tick.timestamp()))

    if kind == "declared":
        for i in range(n):
            scheduler.add_job(partial(report, i=i), Every(seconds=every), name=f"d{i}")
    else:
        scheduler.task(report)  # the schedules are rows the driver wrote

    # The heartbeat's read of the stored schedules' changes, timed: its CPU, and
    # whether it applied a change. (The bench reaches into the scheduler's parts:
    # no public API times one read.)
    syncs: list[tuple[float, bool]] = []
    book = scheduler._book
    beats = scheduler._parts.heartbeat
    assert beats is not None

    async def timed_sync() -> None:
        seen = book._seen  # the highest version applied: it moves with a change
        cpu0 = time.process_time()
        await book.sync()
        cpu = time.process_time() - cpu0
        if on_changes:
            syncs.append((cpu, book._seen != seen))

    on_changes = False
    beats.also = [
        (what, timed_sync if what == "the stored schedules" else read) for what, read in beats.also
    ]

    async with scheduler.running({"db": engine}):
        jobs = len(scheduler.status())
        # Started (every job made): the driver answers with the round's times,
        # once every process is, so that no start falls in the window.
        print("ready", flush=True)
        opens, window, ends = map(float, (await asyncio.to_thread(sys.stdin.readline)).split())
        await asyncio.sleep(opens - time.time() - 0.5)
        gc.collect()
        rss = rss_kib()
        await asyncio.sleep(opens - time.time())
        on = True
        profile = os.environ.get("BENCH_PROFILE")  # a file to write the window's profile to
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        cpu0 = time.process_time()
        await asyncio.sleep(opens + window - time.time())
        cpu1 = time.process_time()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}.{kind}.{os.getpid()}")
        on = False
        on_changes = True  # the driver changes one schedule now
        await asyncio.sleep(ends - time.time())
        on_changes = False
    await engine.dispose()
    return {
        "kind": kind,
        "jobs": jobs,
        "runs": runs,
        "cpu_s": cpu1 - cpu0,
        "mem_kib_per_job": (rss - base) / n,
        "syncs": syncs,
    }


async def live_memory(url: str, kind: str, n: int, every: float) -> dict[str, Any]:
    """One process, traced (tracemalloc): the bytes still allocated per job once
    the scheduler runs them (RSS also holds what the allocator keeps after the
    start's reads; this does not)."""
    import tracemalloc
    from functools import partial

    import anyio._backends._asyncio  # noqa: F401 - loaded before the baseline, as in an app
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import Every, JobContext, Scheduler
    from fastapi_jobs.stores import SQLAlchemyStore

    engine = create_async_engine(url)
    store = SQLAlchemyStore(engine, heartbeat=60)

    async def report(ctx: JobContext, i: int) -> None: ...

    gc.collect()
    tracemalloc.start()
    scheduler = Scheduler(store=store)
    if kind == "declared":
        for i in range(n):
            scheduler.add_job(partial(report, i=i), Every(seconds=every), name=f"d{i}")
    else:
        scheduler.task(report)
    async with scheduler.running({"db": engine}):
        await asyncio.sleep(0.5)
        gc.collect()
        traced, _ = tracemalloc.get_traced_memory()
        jobs = len(scheduler.status())
    tracemalloc.stop()
    await engine.dispose()
    return {"kind": kind, "jobs": jobs, "live_kib_per_job": traced / 1024 / n}


async def write_schedules(url: str, n: int, every: float) -> None:
    """N stored schedules of the task ``report``, one run each ``every`` seconds,
    written as `add_schedule` writes them (one row each), in a few statements."""
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import Every
    from fastapi_jobs._dynamic.stored import encode
    from fastapi_jobs.stores import SQLAlchemyStore

    engine = create_async_engine(url)
    table = SQLAlchemyStore(engine).tables.schedules
    stamp = int(time.time() * 1e6)
    rows = [
        {
            "name": f"s{i}",
            "task": "report",
            "spec": encode(Every(seconds=every), {"i": i}, {}),
            "version": stamp + i,
            "updated_at": time.time(),
            "removed": False,
        }
        for i in range(n)
    ]
    async with engine.begin() as conn:
        await conn.run_sync(SQLAlchemyStore(engine).tables.metadata.create_all)
        await conn.execute(sa.delete(table))
        for start in range(0, n, 1000):
            await conn.execute(sa.insert(table), rows[start : start + 1000])
    await engine.dispose()


async def change_one(url: str, plan: Plan, value: int) -> None:
    """One schedule's arguments changed, by another client (the API's statement)."""
    from fastapi_jobs import Every
    from fastapi_jobs._dynamic.stored import encode
    from fastapi_jobs.stores import Instance, SQLAlchemyStore

    store = SQLAlchemyStore(url)
    await store.open({}, Instance())
    try:
        name = f"s{value % plan.n}"
        row = await store.schedules.get(name)
        assert row is not None
        spec = encode(Every(seconds=plan.every), {"i": value}, {})
        changed = await store.schedules.change(name, "report", spec, row.version)
        assert changed is not None
    finally:
        await store.close()


def cluster(url: str, kind: str, plan: Plan, value: int) -> list[dict[str, Any]]:
    """One round: 3 processes of ``kind`` started, then a window around the next
    tick (every job ticks at once, on the epoch grid), then a change."""
    args = [url, kind, plan.n, plan.every, plan.heartbeat]
    with contextlib.ExitStack() as stack:
        # Their logs (a line per schedule read at start: more than a pipe holds
        # unread) go to files, shown on a failure.
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(PROCESSES)]
        procs = [
            subprocess.Popen(
                [*WORKER, *map(str, args)],
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
                raise RuntimeError(f"bench.schedules worker failed ({kind}):\n{log.read()[-3000:]}")
        window = min(6.0, plan.every)
        tick = math.ceil((time.time() + 1.0 + window / 3) / plan.every) * plan.every
        opens = tick - window / 3
        ends = opens + window + 3 * plan.heartbeat + 0.5
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{opens} {window} {ends}\n")
            proc.stdin.flush()
        time.sleep(max(0.0, opens + window + 0.3 - time.time()))
        if kind == "stored":
            asyncio.run(change_one(url, plan, value))
        results = []
        for proc, log in zip(procs, logs, strict=True):
            out, _ = proc.communicate(timeout=300)
            if proc.returncode != 0:
                log.seek(0)
                raise RuntimeError(f"bench.schedules worker failed ({kind}):\n{log.read()[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def run_live(url: str, kind: str, plan: Plan) -> float:
    command = [*WORKER[:-1], "memory", url, kind, str(plan.n), str(plan.every)]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"bench.schedules memory failed ({kind}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["jobs"] == plan.n, result
    return float(result["live_kib_per_job"])


def report(quick: bool = False) -> list[str]:
    """This run's section, then the 100,000 schedules' (`bench.many_schedules`)."""
    from .many_schedules import report as many_report

    return [*stored_vs_declared(quick), "", *many_report(quick=quick)]


def stored_vs_declared(quick: bool = False) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer

    plan = QUICK if quick else FULL
    n, every, repeat = plan.n, plan.every, plan.repeat
    server = PostgresServer()
    server.start()
    rounds: dict[str, list[list[dict[str, Any]]]] = {"declared": [], "stored": []}
    try:
        # A database each: the declared jobs' processes must not read the rows
        # (without the task, each would keep them as schedules left alone).
        urls = {kind: server.url(server.create_database()) for kind in rounds}
        asyncio.run(write_schedules(urls["stored"], n, every))
        for k in range(repeat):  # interleaved: drifts of the machine hit both alike
            for kind, url in urls.items():
                rounds[kind].append(cluster(url, kind, plan, n + k))
        live = {kind: run_live(url, kind, plan) for kind, url in urls.items()}
    finally:
        server.destroy()

    def per_tick(kind: str) -> list[float]:
        return [sum(r["cpu_s"] for r in rs) / n * 1e6 for rs in rounds[kind]]

    def ran(kind: str) -> tuple[int, int]:
        """The fewest (job, tick) pairs run in a round, and the most runs of one pair."""
        pairs = [Counter((j, t) for r in rs for j, t in r["runs"]) for rs in rounds[kind]]
        most = max(max(p.values(), default=0) for p in pairs)
        return min(len(p) for p in pairs), most

    declared, stored = (
        statistics.median(per_tick("declared")),
        statistics.median(per_tick("stored")),
    )
    ratios = [s / d for s, d in zip(per_tick("stored"), per_tick("declared"), strict=True)]
    mem = {
        kind: statistics.median(r["mem_kib_per_job"] for rs in rounds[kind] for r in rs)
        for kind in rounds
    }
    saw = [
        cpu * 1000 for rs in rounds["stored"] for r in rs for cpu, changed in r["syncs"] if changed
    ]
    quiet = [
        cpu * 1000
        for rs in rounds["stored"]
        for r in rs
        for cpu, changed in r["syncs"]
        if not changed
    ]
    jobs = {kind: min(r["jobs"] for rs in rounds[kind] for r in rs) for kind in rounds}
    run_d, twice_d = ran("declared")
    run_s, twice_s = ran("stored")
    med = statistics.median
    return [
        f"## Schedules as data: {PROCESSES} processes × {n:,} schedules at "
        f"{every:g} s, local PostgreSQL 15 (asyncpg)",
        "",
        f"Stored schedules (rows of the store's schedules table, read at start) against the "
        f"same number of declared jobs, the same task body and store (heartbeat "
        f"{plan.heartbeat:g} s); "
        f"medians of {repeat} interleaved round(s), each process fresh.",
        "",
        "| figure | declared | stored | stored / declared (target) |",
        "|---|---|---|---|",
        f"| jobs per process | {jobs['declared']:,} | {jobs['stored']:,} | |",
        f"| (job, tick) pairs run in the window (of {n:,}), most runs of one | "
        f"{run_d:,}, {twice_d} | {run_s:,}, {twice_s} | |",
        f"| cluster CPU per tick of one job, µs | {declared:.1f} | {stored:.1f} | "
        f"{med(ratios):.2f}× (≤ 1.1×; rounds {', '.join(f'{x:.2f}' for x in ratios)}) |",
        f"| memory per job, live (tracemalloc, one process), KiB | {live['declared']:.2f} | "
        f"{live['stored']:.2f} | {live['stored'] - live['declared']:+.2f} KiB (≤ +0.5) |",
        f"| memory per job, RSS (as the ticks table), KiB | {mem['declared']:.2f} | "
        f"{mem['stored']:.2f} | {mem['stored'] - mem['declared']:+.2f} KiB |",
        f"| CPU of the heartbeat's read that applies one change, per process, ms | | "
        f"{med(saw) if saw else float('nan'):.2f} (max {max(saw, default=float('nan')):.2f}, "
        f"{len(saw)} reads) | ≤ 5 ms |",
        f"| CPU of a heartbeat's read with no change, ms | | "
        f"{med(quiet) if quiet else float('nan'):.3f} | |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["worker", "memory", "report"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument(
        "--into",
        default=None,
        help="report: write the section into this file of `python -m bench --out` (BENCHMARKS.md)",
    )
    parser.add_argument("--quick", action="store_true", help="report: tiny N (smoke test)")
    args = parser.parse_args()
    if args.mode == "worker":
        url, kind, n, every, heartbeat = args.rest
        print(json.dumps(asyncio.run(worker(url, kind, int(n), float(every), float(heartbeat)))))
    elif args.mode == "memory":
        url, kind, n, every = args.rest
        print(json.dumps(asyncio.run(live_memory(url, kind, int(n), float(every)))))
    else:
        if args.into:
            check_out(Path(args.into))  # before the run, not minutes into it
        section = report(quick=args.quick)
        if args.into:
            into(Path(args.into), section)
        else:
            print("\n".join(section))


def into(
    path: Path,
    section: list[str],
    command: str = "python -m bench.schedules report --into BENCHMARKS.md",
) -> None:
    """``section`` (one or more ``## `` blocks) written into a file the bench
    wrote, each block in place of the one of the same title or before the
    run's closing line, and its reproduce line made the one a full run writes
    now: the other sections are left as their run measured them."""
    lines = path.read_text().splitlines()
    starts = [k for k, line in enumerate(section) if line.startswith("## ")]
    for begin, stop in zip(starts, [*starts[1:], len(section)], strict=True):
        block = section[begin:stop]
        while block and not block[-1]:
            block.pop()
        head = block[0].split(":", 1)[0]  # "## Schedules as data"
        note = [
            "",
            f"(This section alone: `{command}`; the others are the run the first line names.)",
        ]
        body = [*block, *note, ""]
        closing = next(k for k, line in enumerate(lines) if line.startswith("(The whole run took"))
        start = next((k for k, line in enumerate(lines) if line.startswith(head)), None)
        if start is None:
            lines[closing:closing] = body
        else:
            end = next(
                k
                for k in range(start + 1, len(lines))
                if lines[k].startswith(("## ", "(The whole run took"))
            )
            lines[start:end] = body
    lines = [REPRODUCE if line.startswith("Reproduce:") else line for line in lines]
    write_out(path, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
