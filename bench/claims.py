"""Claims on a local PostgreSQL server: 3 processes × N jobs at 1 s, with and
without a store. ``python -m bench.claims`` prints the Markdown section;
``python -m bench.claims worker ...`` is one app process."""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER = [sys.executable, "-m", "bench.claims", "worker"]
READY = "running"  # a worker's first line: its scheduler has started


async def worker(url: str | None, n: int, window: float) -> dict[str, Any]:
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import Every, JobContext, Scheduler
    from fastapi_jobs.stores import SQLAlchemyStore

    on = False
    runs: list[tuple[int, float]] = []
    latencies: list[float] = []
    round_trips: list[float] = []  # a claim statement, from sending it to its answer
    statements: Counter[str] = Counter()
    store = None
    engine = None
    if url:
        # BENCH_KEEP_NO_STATEMENTS=1: the app's engine as behind a pooler
        # (see pooler_report); the store then keeps none either.
        keep_none = os.environ.get("BENCH_KEEP_NO_STATEMENTS") == "1"
        engine = create_async_engine(
            url, pool_size=20, connect_args={"statement_cache_size": 0} if keep_none else {}
        )
        # Counted at the store, not with SQLAlchemy's cursor events: a listener
        # on the engine sends the store's statements through SQLAlchemy (where
        # the listener sees them), not to asyncpg directly as they go in an app.
        kinds = {
            "claim": "claim",
            "claim_manual": "claim",
            "claim_replace": "claim",
            "reclaim": "claim",
            "claim_instant": "instant",
            "release": "release",
            "released_runs": "release",
        }

        class TimedStore(SQLAlchemyStore):
            async def open(self, state: Mapping[str, Any], instance: Any) -> None:
                await super().open(state, instance)
                batches = self._statements.batches
                execute = batches.execute

                async def counted(conn: Any, kind: str, params: dict[str, object]) -> Any:
                    t0 = time.perf_counter()
                    result = await execute(conn, kind, params)
                    if on:
                        statements[kinds.get(kind, "other")] += 1
                        if kinds.get(kind) == "claim":
                            round_trips.append((time.perf_counter() - t0) * 1000)
                    return result

                batches.execute = counted  # type: ignore[method-assign]

            async def claim(
                self, wanted: Sequence[tuple[str, float]], **given: Any
            ) -> dict[str, int | Exception]:
                t0 = time.perf_counter()
                fences = await super().claim(wanted, **given)
                if on:
                    latencies.append((time.perf_counter() - t0) * 1000)
                    statements["claim calls"] += len(wanted)
                return fences

            async def renew(self, job: str, fence: int) -> bool:
                statements["renew"] += on
                return await super().renew(job, fence)

            async def beat(self) -> float:
                statements["heartbeat"] += on
                return await super().beat()

            async def pauses(self) -> dict[str, tuple[float, int]]:
                statements["other"] += on
                return await super().pauses()

        # BENCH_HISTORY=0 measures the claims without the run history.
        store = TimedStore(engine, history=int(os.environ.get("BENCH_HISTORY", "100")))
    scheduler = Scheduler(store=store)
    for i in range(n):

        async def job(ctx: JobContext, i: int = i) -> None:
            if on:
                runs.append((i, ctx.tick.timestamp()))

        scheduler.add_job(job, Every(seconds=1), name=f"job{i}")
    async with scheduler.running({} if engine is None else {"db": engine}):
        # Running, the store's tables checked: say so, and wait for the instant
        # the window opens, the same for the three, picked once all are running.
        if store is not None:
            await store._operations.ensure_ready()
        print(READY, flush=True)
        opens = float(await asyncio.to_thread(sys.stdin.readline))
        # Steady state, as in the ticks benchmark: the garbage of starting up is
        # collected before the window, for both clusters alike.
        await asyncio.sleep(opens - time.time() - 0.3)
        gc.collect()
        collections = sum(stat["collections"] for stat in gc.get_stats())
        await asyncio.sleep(opens - time.time())
        on = True
        profile = os.environ.get("BENCH_PROFILE")  # a file to write the window's profile to
        # CPU time, not wall: the window is mostly waiting, and this process shares its cores.
        profiler = cProfile.Profile(time.process_time) if profile else None
        if profiler is not None:
            profiler.enable()
        cpu0 = time.process_time()
        await asyncio.sleep(opens + window - time.time())
        cpu1 = time.process_time()
        collections = sum(stat["collections"] for stat in gc.get_stats()) - collections
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}.{os.getpid()}")
        on = False
    if engine is not None:
        await engine.dispose()
    skipped = sum(s.skipped.get("claimed_elsewhere", 0) for s in scheduler.status())
    return {
        "runs": runs,
        "latencies_ms": latencies,
        "round_trips_ms": round_trips,
        "statements": dict(statements),
        "cpu_s": cpu1 - cpu0,
        "lost": skipped,
        "gc_collections": collections,
    }


def cluster(
    url: str | None, n: int, window: int, env: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Three worker processes; the window opens once all three are running (a
    fixed delay was too short on a loaded machine: the window passed before the
    processes had started, and nothing ran in it), between two whole seconds."""
    procs = [
        subprocess.Popen(
            [*WORKER, url or "", str(n), str(window)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.stdout is not None
        said = proc.stdout.readline().strip()
        if said != READY:
            raise RuntimeError(f"a claims worker did not start (it said {said!r})")
    opens = math.floor(time.time()) + 1.5  # a second of steady state first
    for proc in procs:  # all told before any is waited for
        assert proc.stdin is not None
        proc.stdin.write(f"{opens}\n")
        proc.stdin.flush()  # communicate() closes it
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def report(quick: bool = False, jobs: int = 300, sqlite: bool = False) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import PostgresServer

    n, window = (20, 2) if quick else (jobs, 5)
    if sqlite:  # the three processes share one SQLite file, as workers of one host do
        with tempfile.TemporaryDirectory() as folder:
            with_store = cluster(f"sqlite+aiosqlite:///{folder}/jobs.sqlite3", n, window)
            without = cluster(None, n, window)
    else:
        server = PostgresServer()
        server.start()
        try:
            url = server.url(server.create_database())
            with_store = cluster(url, n, window)
            without = cluster(None, n, window)
        finally:
            server.destroy()
    per_tick = Counter((j, t) for r in with_store for j, t in r["runs"])
    expected = n * window
    wins = sum(len(r["runs"]) for r in with_store)
    statements: Counter[str] = Counter()
    for r in with_store:
        statements.update(r["statements"])
    calls = statements["claim calls"]
    lost = calls - wins
    latencies = sorted(x for r in with_store for x in r["latencies_ms"])
    cpu_store = sum(r["cpu_s"] for r in with_store) / max(1, wins) * 1e6
    cpu_plain = (
        sum(r["cpu_s"] for r in without) / max(1, sum(len(r["runs"]) for r in without)) * 1e6
    )
    cpu_sched_store = sum(r["cpu_s"] for r in with_store) / expected * 1e6
    cpu_sched_plain = sum(r["cpu_s"] for r in without) / expected * 1e6

    median = statistics.median(latencies) if latencies else 0.0
    # A process that won nothing spent its CPU on losing: an upper bound of a loss's
    # cost (its heartbeat and idle loop included).
    losers = [r for r in with_store if not r["runs"] and r["lost"]]
    per_loss = (
        f"{sum(r['cpu_s'] for r in losers) / sum(r['lost'] for r in losers) * 1e6:.1f} µs"
        if losers
        else "n/a (every process won some)"
    )
    trips = sorted(x for r in with_store for x in r["round_trips_ms"])

    def pct(q: float, values: list[float] = latencies) -> float:
        return float(values[min(len(values) - 1, round(q * (len(values) - 1)))]) if values else 0.0

    return [
        f"## Claims: 3 processes × {n} jobs at 1 s, "
        + ("one SQLite file (aiosqlite)" if sqlite else "local PostgreSQL 15 (asyncpg)"),
        "",
        "| figure | value |",
        "|---|---|",
        f"| (job, tick) pairs due in the window | {expected:,} |",
        f"| pairs run, and most runs of one pair | {len(per_tick):,}, "
        f"{max(per_tick.values(), default=0)} |",
        f"| claim latency p50 / p99 (the instant's claim call, to its answer) | {pct(0.5):.2f} / "
        f"{pct(0.99):.2f} ms |",
        f"| claim statement round trip p50 / p99 (sent to answered) | {pct(0.5, trips):.2f} / "
        f"{pct(0.99, trips):.2f} ms |",
        f"| claims asked / claim statements sent (a tick's claims share one) | "
        f"{calls:,} / {statements['claim']:,} |",
        f"| statements per run, winner (its claim, at most one, + release) | "
        f"≤ {(min(wins, statements['claim']) + statements['release']) / max(1, wins):.2f} |",
        f"| statements per losing claim (instants' claims included) | "
        f"≤ {(statements['instant'] + min(lost, statements['claim'])) / max(1, lost):.2f} "
        f"({lost:,} losses) |",
        f"| statements in the window: instants, claims, releases, renewals, heartbeats, other | "
        f"{statements['instant']}, {statements['claim']}, {statements['release']}, "
        f"{statements['renew']}, {statements['heartbeat']}, {statements['other']} |",
        f"| cluster CPU per (job, tick), with store / without | {cpu_sched_store:.1f} / "
        f"{cpu_sched_plain:.1f} µs ({cpu_sched_store / cpu_sched_plain:.2f}×) |",
        f"| CPU per executed run, with store / without (every process runs every tick) "
        f"| {cpu_store:.1f} / {cpu_plain:.1f} µs |",
        f"| CPU per lost claim, in the processes that won nothing (all their CPU) | {per_loss} |",
        "",
        "Without a store each of the 3 processes runs every tick: 3 runs per (job, tick).",
        "Claim latency is from the call to the answer, queueing included: all claims of a",
        f"tick are sent at the same instant (median {median:.2f} ms).",
    ]


def pooler_report(quick: bool = False, jobs: int = 300) -> list[str]:
    """The store's cost behind a pooler: 3 processes × ``jobs`` at 1 s on one
    PostgreSQL server, reached directly (statements kept, the default), directly
    with no statements kept, and through PgBouncer in transaction mode (none
    kept: what the store sets behind a pooler). Side by side in one run."""
    sys.path.insert(0, str(ROOT))
    from tests.support.pgbouncer import PgBouncer
    from tests.support.postgres import PostgresServer

    n, window = (20, 2) if quick else (jobs, 5)
    server = PostgresServer()
    server.start()
    bouncer = PgBouncer(server, "transaction")
    bouncer.start()
    none_kept = {"BENCH_KEEP_NO_STATEMENTS": "1"}
    try:
        ways = {
            "direct, statements kept": cluster(server.url(server.create_database()), n, window),
            "direct, none kept": cluster(
                server.url(server.create_database()), n, window, none_kept
            ),
            "PgBouncer 1.18, transaction mode": cluster(
                bouncer.url(server.create_database()), n, window, none_kept
            ),
        }
        without = cluster(None, n, window)
    finally:
        bouncer.destroy()
        server.destroy()
    expected = n * window
    plain = sum(r["cpu_s"] for r in without) / expected * 1e6
    lines = [
        f"## Behind a pooler: 3 processes × {n} jobs at 1 s, local PostgreSQL 15 (asyncpg)",
        "",
        "| reached | pairs run / due, most runs of one | cluster CPU per (job, tick) "
        "| vs. no store | claim latency p50 / p99 |",
        "|---|---|---|---|---|",
    ]
    for way, results in ways.items():
        per_tick = Counter((j, t) for r in results for j, t in r["runs"])
        cpu = sum(r["cpu_s"] for r in results) / expected * 1e6
        latencies = sorted(x for r in results for x in r["latencies_ms"])

        def pct(q: float, values: list[float] = latencies) -> float:
            return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else 0.0

        lines.append(
            f"| {way} | {len(per_tick):,} / {expected:,}, {max(per_tick.values(), default=0)} "
            f"| {cpu:.1f} µs | {cpu / plain:.2f}× | {pct(0.5):.2f} / {pct(0.99):.2f} ms |"
        )
    lines += [
        "",
        f"Without a store: {plain:.1f} µs per (job, tick) (every process runs every tick).",
        "Behind the pooler every statement is parsed again with its parameters, and",
        "goes through one more process: the CPU above is the app processes' only.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["worker", "report"])
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    if args.mode == "worker":
        url, n, window = args.rest
        result = asyncio.run(worker(url or None, int(n), float(window)))
        print(json.dumps(result))
    else:
        # `report jobs=3000`: another cluster size (the headline's is 3 x 300);
        # `report sqlite`: the three on one SQLite file.
        jobs = [int(arg.split("=", 1)[1]) for arg in args.rest if arg.startswith("jobs=")]
        size = jobs[-1] if jobs else 300
        if "pooler" in args.rest:
            lines = pooler_report(quick="quick" in args.rest, jobs=size)
        else:
            lines = report(quick="quick" in args.rest, jobs=size, sqlite="sqlite" in args.rest)
        print("\n".join(lines))


if __name__ == "__main__":
    main()
