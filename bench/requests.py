"""Request latency of a FastAPI app with no jobs and with 1,000 or 10,000 jobs a second.

A uvicorn process serves a trivial endpoint; a separate client process sends
requests at a fixed rate on loopback and counts each response's latency from
the moment the request was *meant* to be sent (no coordinated omission: a
server that stalls delays the requests queued behind, and they count it).
``python -m bench.requests`` prints the Markdown section.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from . import wait_for

ROOT = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, "-m", "uvicorn", "--factory", "bench.requests:make_app"]
CLIENT = [sys.executable, "-m", "bench.requests", "client"]


def make_app() -> Any:
    """The served app: BENCH_JOBS jobs at 1 s with a trivial body, and GET /ping.

    The jobs run on fastapi_jobs, or with BENCH_IMPL=minimal on the benchmark's
    floor (a bare asyncio loop per job), to show what the burst itself costs.
    """
    from fastapi import FastAPI

    from fastapi_jobs import Every, Scheduler

    from .worker import Recorder, start_minimal

    jobs = int(os.environ.get("BENCH_JOBS", "0"))
    if os.environ.get("BENCH_IMPL") == "minimal":

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            stop = await start_minimal(Recorder(), jobs, 1.0, 0.0)
            yield
            await stop()

        app = FastAPI(lifespan=lifespan)
    else:
        scheduler = Scheduler()
        for i in range(jobs):

            async def job() -> None:
                pass

            scheduler.add_job(job, Every(seconds=1), name=f"job{i}")
        app = FastAPI(lifespan=scheduler.lifespan)

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    return app


async def client(port: int, rate: float, seconds: float) -> list[float]:
    import httpx

    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        for _ in range(20):  # warm the connection pool
            await http.get("/ping")

        async def one(intended: float) -> None:
            response = await http.get("/ping")
            response.raise_for_status()
            latencies.append((time.perf_counter() - intended) * 1000)

        async with asyncio.TaskGroup() as tg:
            start = time.perf_counter()
            for k in range(int(rate * seconds)):
                intended = start + k / rate
                await asyncio.sleep(max(0.0, intended - time.perf_counter()))
                tg.create_task(one(intended))
    return latencies


def measure(
    jobs: int, rate: float, seconds: float, impl: str = "fastapi_jobs", loop: str = "asyncio"
) -> list[float]:
    sys.path.insert(0, str(ROOT))
    from tests.support.ports import free_port

    port = free_port()
    server = subprocess.Popen(
        [*SERVER, "--port", str(port), "--log-level", "warning", "--loop", loop],
        cwd=ROOT,
        env={**os.environ, "BENCH_JOBS": str(jobs), "BENCH_IMPL": impl},
    )
    try:
        wait_for(port)  # started (a loaded machine takes more than a fixed time)
        time.sleep(1 + jobs / 5000)  # the jobs through their first burst
        out = subprocess.run(
            [*CLIENT, str(port), str(rate), str(seconds)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=True,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    latencies: list[float] = json.loads(out.stdout)
    return latencies


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def report(quick: bool = False, loops: tuple[str, ...] = ("asyncio", "uvloop")) -> list[str]:
    """Each (loop, jobs, impl) served ``rounds`` times, rounds interleaved; medians."""
    rate, seconds, rounds = (50.0, 2.0, 1) if quick else (200.0, 10.0, 3)
    sizes = [50] if quick else [1000, 10000]
    if quick:
        loops = ("asyncio",)
    cases = [(loop, 0, "none") for loop in loops] + [
        (loop, n, impl) for loop in loops for n in sizes for impl in ("minimal", "fastapi_jobs")
    ]
    p50s: dict[tuple[str, int, str], list[float]] = {case: [] for case in cases}
    p99s: dict[tuple[str, int, str], list[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for loop, n, impl in cases:
            latencies = measure(n, rate, seconds, impl, loop)
            p50s[loop, n, impl].append(statistics.median(latencies))
            p99s[loop, n, impl].append(_p99(latencies))
    rows = []
    for loop, n, impl in cases:
        p50 = statistics.median(p50s[loop, n, impl])
        p99 = statistics.median(p99s[loop, n, impl])
        none = statistics.median(p99s[loop, 0, "none"])
        rows.append(f"| {loop} | {n:,} | {impl} | {p50:.2f} | {p99:.2f} | {p99 / none:.2f}× |")
    return [
        f"## Requests: GET /ping at {rate:.0f} requests/s for {seconds:.0f} s, "
        "client in its own process",
        "",
        "Latency from each request's intended send time; medians of "
        f"{rounds} rounds (p99 of each round).",
        "",
        "| loop | jobs at 1 s in the app | jobs run by | p50 ms | p99 ms | p99 × no jobs |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        port, rate, seconds = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
        print(json.dumps(asyncio.run(client(port, rate, seconds))))
    else:
        print("\n".join(report(quick="quick" in sys.argv)))
