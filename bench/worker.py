"""One measurement, in a fresh process: ``python -m bench.worker IMPL N ...``.

Workloads:
- ``ticks``: N interval jobs at 1 s with a trivial async body; CPU per executed
  tick, lateness of each run against its tick, memory per job, ticks run
  against ticks expected, time to register and start.
- ``idle``: N jobs at 1 h, a window with no tick due: CPU while idle, and the
  time to stop with N idle jobs.

Prints one JSON object. Implementations: ``floor`` (a hand-written asyncio loop
per job), ``fastapi_jobs``, ``apscheduler`` (3.11 AsyncIOScheduler),
``repeat_every`` (fastapi-utils).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

Samples = list[tuple[int, float]]


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Recorder:
    """What every body does: note (job, time) while the window is open."""

    def __init__(self) -> None:
        self.on = False
        self.samples: Samples = []

    def body(self, i: int) -> Callable[[], Awaitable[None]]:
        samples = self.samples

        async def job() -> None:
            if self.on:
                samples.append((i, time.time()))

        job.__name__ = f"job{i}"
        return job


# -- implementations: start N jobs, return an async stop() ---------------------

Stop = Callable[[], Awaitable[None]]


async def start_minimal(rec: Recorder, n: int, interval: float, offset: float) -> Stop:
    """The physical limit of asyncio for N independent periodic coroutines: each
    sleeps to its next tick by adding the interval, then awaits its body."""
    loop = asyncio.get_running_loop()

    async def loop_job(body: Callable[[], Awaitable[None]]) -> None:
        now = time.time()
        nxt = loop.time() + (math.floor((now - offset) / interval) + 1) * interval + offset - now
        while True:
            await asyncio.sleep(nxt - loop.time())
            nxt += interval
            await body()

    tasks = [asyncio.create_task(loop_job(rec.body(i))) for i in range(n)]

    async def stop() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    return stop


async def start_floor(rec: Recorder, n: int, interval: float, offset: float) -> Stop:
    """The grid floor: a loop per job that computes its next tick on the epoch grid."""

    async def loop(body: Callable[[], Awaitable[None]]) -> None:
        while True:
            now = time.time()
            nxt = (math.floor((now - offset) / interval) + 1) * interval + offset
            await asyncio.sleep(nxt - now)
            await body()

    tasks = [asyncio.create_task(loop(rec.body(i))) for i in range(n)]

    async def stop() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    return stop


async def start_fastapi_jobs(rec: Recorder, n: int, interval: float, offset: float) -> Stop:
    from fastapi_jobs import Every, Scheduler

    scheduler = Scheduler(history=int(os.environ.get("BENCH_MEMORY_HISTORY", "50")))
    if os.environ.get("BENCH_OBSERVER"):  # a plain observer of starts and ends: the hooks' cost
        from fastapi_jobs.observers import Observer, RunFinished, RunStarted

        class Counting(Observer):
            def __init__(self) -> None:
                self.started = self.finished = 0

            def run_started(self, event: RunStarted) -> None:
                self.started += 1

            def run_finished(self, event: RunFinished) -> None:
                self.finished += 1

        scheduler.add_observer(Counting())
    if os.environ.get("BENCH_METRICS"):  # Prometheus: the histograms' observer per run
        from prometheus_client import CollectorRegistry

        from fastapi_jobs.metrics import instrument

        instrument(scheduler, CollectorRegistry())
    tracing = os.environ.get("BENCH_TRACING")  # "api": the API's no-op; "sdk": spans recorded
    if tracing:
        from fastapi_jobs.tracing import instrument as trace

        provider = None
        if tracing == "sdk":  # spans made and ended, exported nowhere
            from opentelemetry.sdk.trace import TracerProvider

            provider = TracerProvider()
        trace(scheduler, tracer_provider=provider)
    schedule = Every(seconds=interval, offset=offset)
    for i in range(n):
        scheduler.add_job(rec.body(i), schedule)
    running = scheduler.running()
    await running.__aenter__()

    async def stop() -> None:
        await running.__aexit__(None, None, None)

    return stop


async def start_apscheduler(rec: Recorder, n: int, interval: float, offset: float) -> Stop:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler
    from apscheduler.triggers.interval import IntervalTrigger

    now = time.time()
    first = (math.floor((now - offset) / interval) + 1) * interval + offset
    scheduler = AsyncIOScheduler()
    trigger = IntervalTrigger(
        seconds=interval, start_date=datetime.fromtimestamp(first, UTC), timezone=UTC
    )
    for i in range(n):
        scheduler.add_job(rec.body(i), trigger, max_instances=1, coalesce=True, id=str(i))
    scheduler.start()

    async def stop() -> None:
        scheduler.shutdown(wait=False)

    return stop


async def start_repeat_every(rec: Recorder, n: int, interval: float, offset: float) -> Stop:
    from fastapi_utils.tasks import repeat_every

    before = set(asyncio.all_tasks())
    for i in range(n):
        await repeat_every(seconds=interval)(rec.body(i))()  # type: ignore[arg-type]
    tasks = set(asyncio.all_tasks()) - before

    async def stop() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    return stop


IMPLS: dict[str, Callable[[Recorder, int, float, float], Awaitable[Stop]]] = {
    "minimal": start_minimal,
    "floor": start_floor,
    "fastapi_jobs": start_fastapi_jobs,
    "apscheduler": start_apscheduler,
    "repeat_every": start_repeat_every,
}


def import_impl(impl: str) -> None:
    """Import everything first, so the baseline memory holds the libraries."""
    if impl == "fastapi_jobs":
        # anyio loads its asyncio backend on first use; in an app, Starlette has
        # used it long before the lifespan starts the jobs.
        import anyio._backends._asyncio  # noqa: F401

        import fastapi_jobs

        # What the options load (~2.2 MiB for prometheus_client and the metrics'
        # modules) is a library too, not memory per job: at 1,000 jobs it
        # counted as 2.2 KiB a job.
        if os.environ.get("BENCH_METRICS"):
            import prometheus_client  # noqa: F401

            import fastapi_jobs.metrics
        if os.environ.get("BENCH_TRACING"):
            import fastapi_jobs.tracing
        if os.environ.get("BENCH_TRACING") == "sdk":
            import opentelemetry.sdk.trace  # noqa: F401
        if os.environ.get("BENCH_OBSERVER"):
            import fastapi_jobs.observers  # noqa: F401
    elif impl == "apscheduler":
        import apscheduler.schedulers.asyncio  # noqa: F401
    elif impl == "repeat_every":
        import fastapi_utils.tasks  # noqa: F401


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def ticks(impl: str, n: int, window: int, warmup: int) -> dict[str, Any]:
    rec = Recorder()
    base = rss_kib()
    t0 = time.perf_counter()
    stop = await IMPLS[impl](rec, n, 1.0, 0.0)
    await asyncio.sleep(0)  # every loop has taken its first step
    started_s = time.perf_counter() - t0
    # Open the window half-way between two ticks, so it holds `window` ticks a job.
    now = time.time()
    opens = math.floor(now) + warmup + 0.5
    await asyncio.sleep(opens - now - 0.3)
    # Steady state, as in an app that has run for a while: the garbage of
    # starting up is collected before the window, the same for everyone.
    gc.collect()
    await asyncio.sleep(opens - time.time())
    rss = rss_kib()
    rec.on = True
    cpu0, wall0 = time.process_time(), time.time()
    await asyncio.sleep(opens + window - time.time())
    cpu1, wall1 = time.process_time(), time.time()
    rec.on = False
    t1 = time.perf_counter()
    await stop()
    stop_s = time.perf_counter() - t1
    runs = len(rec.samples)
    lateness = lateness_ms(impl, rec.samples)
    return {
        "impl": impl,
        "n": n,
        "window_s": wall1 - wall0,
        "ticks_expected": n * window,
        "ticks_run": runs,
        "cpu_us_per_tick": (cpu1 - cpu0) / runs * 1e6 if runs else float("nan"),
        "late_p50_ms": percentile(lateness, 0.50),
        "late_p99_ms": percentile(lateness, 0.99),
        "late_max_ms": max(lateness) if lateness else float("nan"),
        "mem_kib_per_job": (rss - base) / n,
        "start_ms": started_s * 1000,
        "stop_busy_ms": stop_s * 1000,
    }


def lateness_ms(impl: str, samples: Samples) -> list[float]:
    if impl != "repeat_every":
        # Grid implementations: each run belongs to the whole second before it.
        return [(t - math.floor(t)) * 1000 for _, t in samples]
    # repeat_every has no grid: each job's k-th run is due k seconds after its
    # first run in the window, and it sleeps a full second after each run.
    first: dict[int, tuple[float, int]] = {}
    out = []
    for i, t in samples:
        if i not in first:
            first[i] = (t, 0)
            out.append(0.0)
            continue
        t_first, k = first[i]
        first[i] = (t_first, k + 1)
        out.append((t - (t_first + k + 1)) * 1000)
    return out


async def idle(impl: str, n: int, window: int) -> dict[str, Any]:
    rec = Recorder()
    # Hourly ticks placed half an hour away from now: none is due in the window.
    offset = (time.time() + 1800) % 3600
    stop = await IMPLS[impl](rec, n, 3600.0, offset)
    await asyncio.sleep(1)
    cpu0, wall0 = time.process_time(), time.time()
    await asyncio.sleep(window)
    cpu1, wall1 = time.process_time(), time.time()
    t0 = time.perf_counter()
    await stop()
    stop_s = time.perf_counter() - t0
    return {
        "impl": impl,
        "n": n,
        "idle_cpu_pct": (cpu1 - cpu0) / (wall1 - wall0) * 100,
        "stop_idle_ms": stop_s * 1000,
        "ticks_run": len(rec.samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["ticks", "idle"])
    parser.add_argument("impl", choices=sorted(IMPLS))
    parser.add_argument("n", type=int)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    import_impl(args.impl)
    if args.workload == "ticks":
        main = ticks(args.impl, args.n, args.window, args.warmup)
    else:
        main = idle(args.impl, args.n, args.window)
    if args.loop == "uvloop":
        import uvloop

        result = uvloop.run(main)
    else:
        result = asyncio.run(main)
    result["loop"] = args.loop
    print(json.dumps(result))


if __name__ == "__main__":
    main()
