"""Prometheus scrapes of an app with thousands of jobs: what a scrape costs, and
GET /ping latency while Prometheus scrapes.

Variants (each server a fresh process):
- ``before``: the code at ``--before`` (a commit; exported to a temporary
  folder and run from there), served as its README said:
  ``app.mount("/metrics", prometheus_client.make_asgi_app(registry))``;
- ``mount``: this tree, the same ``make_asgi_app`` mount (the default series,
  rendered on the event loop);
- ``router``: this tree, ``app.include_router(metrics.router())`` (rendered in a
  worker thread, cached for ``max_age``);
- ``router_by_job``: the same with ``instrument(histograms_by_job=True)``;
- ``unscraped`` (requests only): the ``router`` app, never scraped;
- ``multiprocess`` (cost only): the ``router`` app in prometheus_client's
  multiprocess mode (one process; the counts read from its files).

``cost``: N jobs at 1 h that each ran once at startup (so every series exists
and nothing else runs), scraped 5 times in process as Prometheus asks
(OpenMetrics, gzip): CPU per scrape (all threads), the longest stall of the
event loop during a scrape (a task that wakes every millisecond measures it),
series and bytes.

``requests``: a uvicorn process with N jobs at 1 s; a client process sends
GET /ping at a fixed rate, latency counted from each request's intended send
time (bench/requests.py), while a scraper in the same client scrapes /metrics
every few seconds with Prometheus's headers.

``python -m bench.scrapes [quick] [--before COMMIT]`` prints the Markdown section.

``python -m bench.scrapes many [--jobs 100000] [--rounds 2] [--before 1fd2da2]``:
the same two measures at 100,000 jobs at 1 h (none runs in the window; stored
schedules are runners like these), for ``unscraped``, ``before`` (the code at
``--before``, ``router()``: every job's series) and ``router`` (this tree's
default ``per_job_limit``: the counts summed past it), rounds interleaved.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import wait_for

ROOT = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, "-m", "uvicorn", "--factory", "bench.scrapes:make_app"]
CLIENT = [sys.executable, "-m", "bench.scrapes", "client"]
VARIANTS = ("before", "mount", "router", "router_by_job")
# For the requests: the router's app, never scraped (what the jobs alone cost).
UNSCRAPED = "unscraped"
MULTIPROCESS = "multiprocess"
# What Prometheus 2.x and 3.x send (prometheus_client offers no protobuf).
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
MAX_AGE = 2.0


def make_app() -> Any:
    """BENCH_JOBS jobs (BENCH_HOURLY=1: at 1 h, each run once at startup; else at
    1 s), GET /ping, and /metrics served as BENCH_VARIANT says."""
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry, make_asgi_app

    from fastapi_jobs import Every, Scheduler
    from fastapi_jobs.metrics import instrument

    jobs = int(os.environ["BENCH_JOBS"])
    variant = os.environ["BENCH_VARIANT"]
    # 1: at 1 h, each run once at startup; "quiet": at 1 h, none runs; else at 1 s.
    hourly = os.environ.get("BENCH_HOURLY")
    scheduler = Scheduler()
    schedule = Every(hours=1) if hourly else Every(seconds=1)
    for i in range(jobs):

        async def job() -> None:
            pass

        scheduler.add_job(job, schedule, name=f"job{i}", run_on_startup=hourly == "1")
    # Only when asked: the code at --before has no per_job_limit.
    limit = os.environ.get("BENCH_PER_JOB_LIMIT")
    options: dict[str, Any] = {}
    if limit is not None:
        options["per_job_limit"] = None if limit == "none" else int(limit)
    registry = CollectorRegistry()
    if variant == MULTIPROCESS:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    max_age = float(os.environ.get("BENCH_MAX_AGE", MAX_AGE))
    app = FastAPI(lifespan=scheduler.lifespan)
    if variant in ("before", "mount"):
        instrument(scheduler, registry, max_age=max_age)
        app.mount("/metrics", make_asgi_app(registry))
    else:
        by_job = variant == "router_by_job"
        metrics = instrument(
            scheduler, registry, max_age=max_age, histograms_by_job=by_job, **options
        )
        app.include_router(metrics.router())

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    return app


def _path(variant: str) -> str:
    variant = "router" if variant in (UNSCRAPED, MULTIPROCESS) else variant
    return "/metrics/" if variant in ("before", "mount") else "/metrics"


# -- cost: in process ------------------------------------------------------


async def _get(app: Any, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """One GET straight through the ASGI app: the body as sent (no client on the
    loop to decompress it and stall the loop on the server's account)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


class _Stalls:
    """The longest time the event loop left a task that wakes every millisecond."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._done = False

    async def _watch(self) -> None:
        last = time.perf_counter()
        while not self._done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    async def __aenter__(self) -> _Stalls:
        self._task = asyncio.create_task(self._watch())
        await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._done = True
        await self._task


async def _cost(jobs: int, variant: str, scrapes: int) -> dict[str, Any]:
    import logging

    logging.disable(logging.INFO)  # the start's line per job
    os.environ.update(BENCH_JOBS=str(jobs), BENCH_VARIANT=variant)
    os.environ.setdefault("BENCH_HOURLY", "1")
    os.environ["BENCH_MAX_AGE"] = "0.1"  # every scrape here renders (none is served cached)
    if variant == MULTIPROCESS:  # before prometheus_client is imported: it reads it then
        files = tempfile.mkdtemp(prefix="bench_prometheus_")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = files
    try:
        return await _measure(jobs, variant, scrapes)
    finally:
        if variant == MULTIPROCESS:
            shutil.rmtree(files)


async def _measure(jobs: int, variant: str, scrapes: int) -> dict[str, Any]:
    import gzip

    from asgi_lifespan import LifespanManager

    app = make_app()
    path = _path(variant)
    async with LifespanManager(app, startup_timeout=None, shutdown_timeout=None) as manager:
        app = manager.app
        quiet = os.environ["BENCH_HOURLY"] == "quiet"
        await asyncio.sleep(2.0 if quiet else 1.0 + jobs / 2000)  # the startup runs end
        cpu, stalls, walls = [], [], []
        body = b""
        for _ in range(scrapes):
            await asyncio.sleep(0.3)  # older than max_age
            async with _Stalls() as stalls_now:
                c0, t0 = time.process_time(), time.perf_counter()
                status, body = await _get(app, path, PROMETHEUS_HEADERS)
                walls.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            stalls.append(stalls_now.longest)
            assert status == 200, status
        await asyncio.sleep(0.3)
        _, text = await _get(app, path, {"Accept": PROMETHEUS_HEADERS["Accept"]})
    samples = sum(1 for line in text.split(b"\n") if line and not line.startswith(b"#"))
    return {
        "variant": variant,
        "jobs": jobs,
        "series_per_job": samples / jobs,
        "bytes": len(text),
        "gzip_bytes": len(body) if body[:2] == b"\x1f\x8b" else len(gzip.compress(body)),
        "cpu_us_per_job": statistics.median(cpu) / jobs * 1e6,
        "scrape_ms": statistics.median(walls) * 1000,
        "stall_ms": statistics.median(stalls) * 1000,
        "stall_max_ms": max(stalls) * 1000,
    }


# -- requests while scraped: uvicorn ------------------------------------------


async def client(port: int, rate: float, seconds: float, every: float, path: str) -> dict[str, Any]:
    import httpx

    latencies: list[float] = []
    scrape_ms: list[float] = []
    failed: list[str] = []  # requests that failed or timed out (60 s)
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as scraper,
    ):
        for _ in range(20):  # warm the connection pool
            await http.get("/ping")
        if every > 0:
            assert (await scraper.get(path, headers=PROMETHEUS_HEADERS)).status_code == 200

        async def one(intended: float) -> None:
            try:
                response = await http.get("/ping")
                response.raise_for_status()
            except httpx.HTTPError:
                failed.append("ping")  # counted when it failed (a timeout: 60 s)
            latencies.append((time.perf_counter() - intended) * 1000)

        async def scrapes(until: float) -> None:
            # Off the second's grid, as Prometheus spreads its targets: half a
            # period in, then every ``every`` seconds.
            await asyncio.sleep(every / 2 + 0.37)
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                try:
                    answer = await scraper.get(path, headers=PROMETHEUS_HEADERS)
                    answer.raise_for_status()
                except httpx.HTTPError:
                    failed.append("scrape")
                scrape_ms.append((time.perf_counter() - t0) * 1000)
                await asyncio.sleep(max(0.0, every - (time.perf_counter() - t0)))

        async with asyncio.TaskGroup() as tg:
            start = time.perf_counter()
            if every > 0:
                tg.create_task(scrapes(start + seconds - 0.5))
            for k in range(int(rate * seconds)):
                intended = start + k / rate
                await asyncio.sleep(max(0.0, intended - time.perf_counter()))
                tg.create_task(one(intended))
    return {"latencies": latencies, "scrape_ms": scrape_ms, "timed_out": failed}


def _tree(before: str) -> Path:
    """The code at ``before``, with this tree's bench/, in a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="bench_before_"))
    archive = subprocess.run(
        ["git", "archive", before, "fastapi_jobs"], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    shutil.copytree(ROOT / "bench", folder / "bench")
    return folder


def serve_and_scrape(
    jobs: int,
    variant: str,
    rate: float,
    seconds: float,
    every: float,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.support.ports import free_port

    port = free_port()
    env = {**os.environ, **(env or {}), "BENCH_JOBS": str(jobs), "BENCH_VARIANT": variant}
    server = subprocess.Popen(
        [*SERVER, "--port", str(port), "--log-level", "warning"], cwd=cwd, env=env
    )
    try:
        wait_for(port)  # started (a loaded machine takes more than a fixed time)
        if env.get("BENCH_HOURLY") == "quiet":
            time.sleep(3)  # no job runs in the window
        else:
            time.sleep(1 + jobs / 2000)  # the jobs through their first bursts
        out = subprocess.run(
            [*CLIENT, str(port), str(rate), str(seconds), str(every), _path(variant)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=seconds + 120,
        )
        if out.returncode != 0:
            raise RuntimeError(f"the client failed ({variant}):\n{out.stderr[-3000:]}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _cost_in_process(
    jobs: int, variant: str, cwd: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.scrapes", "cost", str(jobs), variant],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def report(quick: bool = False, before: str = "e1bb881") -> list[str]:
    """Each (jobs, variant) ``rounds`` times, rounds interleaved; medians."""
    sizes = [200] if quick else [1000, 5000]
    rate, seconds, every, rounds = (50.0, 4.0, 1.0, 1) if quick else (200.0, 30.0, 5.0, 3)
    loads = [os.getloadavg()[0]]
    old = _tree(before)
    try:
        cwd = {v: old if v == "before" else ROOT for v in (*VARIANTS, UNSCRAPED)}
        costs: dict[tuple[int, str], list[dict[str, Any]]] = {}
        runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for _ in range(rounds):
            for n in sizes:
                for variant in VARIANTS:
                    costs.setdefault((n, variant), []).append(
                        _cost_in_process(n, variant, cwd[variant])
                    )
                    runs.setdefault((n, variant), []).append(
                        serve_and_scrape(n, variant, rate, seconds, every, cwd[variant])
                    )
                    print(n, variant, json.dumps(costs[n, variant][-1]), file=sys.stderr)
                runs.setdefault((n, UNSCRAPED), []).append(
                    serve_and_scrape(n, UNSCRAPED, rate, seconds, 0.0, ROOT)
                )
                costs.setdefault((n, MULTIPROCESS), []).append(
                    _cost_in_process(n, MULTIPROCESS, ROOT)
                )
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(old)
    lines = [
        "(Load average at the start and after each round's size, other processes' "
        f"included: {', '.join(f'{load:.1f}' for load in loads)}, on {os.cpu_count()} cores.)",
        "",
        f"Scrape cost in process (N jobs at 1 h, each run once; {rounds} rounds × 5 scrapes, "
        "medians), as Prometheus asks (OpenMetrics, gzip):",
        "",
        "| jobs | variant | series per job | bytes per job (gzip) | scrape CPU µs per job "
        "| scrape ms | longest loop stall ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        for variant in (*VARIANTS, MULTIPROCESS):
            c = costs[n, variant]
            med = {k: statistics.median(r[k] for r in c) for k in c[0] if k not in ("variant",)}
            lines.append(
                f"| {n:,} | {variant} | {med['series_per_job']:.1f} "
                f"| {med['bytes'] / n:,.0f} ({med['gzip_bytes'] / n:,.0f}) "
                f"| {med['cpu_us_per_job']:.0f} | {med['scrape_ms']:.0f} "
                f"| {med['stall_ms']:.1f} |"
            )
    lines += [
        "",
        f"GET /ping at {rate:.0f}/s for {seconds:.0f} s against uvicorn with N jobs at 1 s, "
        f"scraped every {every:.0f} s as Prometheus asks ({rounds} rounds, medians of each "
        "round's figures):",
        "",
        "| jobs | variant | p50 ms | p99 ms | p99 ms, each round | max ms | scrape ms (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        for variant in (UNSCRAPED, *VARIANTS):
            r = runs[n, variant]
            p50 = statistics.median(statistics.median(x["latencies"]) for x in r)
            p99 = statistics.median(_p99(x["latencies"]) for x in r)
            top = statistics.median(max(x["latencies"]) for x in r)
            scraped = [statistics.median(x["scrape_ms"]) for x in r if x["scrape_ms"]]
            scrape = f"{statistics.median(scraped):.0f}" if scraped else "-"
            each = ", ".join(f"{_p99(x['latencies']):.1f}" for x in r)
            lines.append(
                f"| {n:,} | {variant} | {p50:.2f} | {p99:.2f} | {each} | {top:.1f} | {scrape} |"
            )
    return lines


MANY = ("unscraped", "before", "router")


def many(jobs: int = 100_000, rounds: int = 2, before: str = "1fd2da2") -> list[str]:
    """``jobs`` jobs at 1 h: a scrape's cost in process, and GET /ping while
    scraped, for ``MANY``'s variants; rounds interleaved, medians."""
    rate, seconds, every = 200.0, 30.0, 5.0
    quiet = {"BENCH_HOURLY": "quiet"}
    loads = [os.getloadavg()[0]]
    old = _tree(before)
    costs: dict[str, list[dict[str, Any]]] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for _ in range(rounds):
            for variant in MANY:
                cwd = old if variant == "before" else ROOT
                served = "router"  # "before": the router of the code at --before
                if variant != "unscraped":
                    costs.setdefault(variant, []).append(_cost_in_process(jobs, served, cwd, quiet))
                runs.setdefault(variant, []).append(
                    serve_and_scrape(
                        jobs,
                        served,
                        rate,
                        seconds,
                        0.0 if variant == "unscraped" else every,
                        cwd,
                        quiet,
                    )
                )
                print(variant, json.dumps(costs.get(variant, [{}])[-1]), file=sys.stderr)
            loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(old)
    lines = [
        f"{jobs:,} jobs at 1 h (none runs meanwhile), {rounds} rounds, medians; load average "
        f"at the start and after each round: {', '.join(f'{x:.1f}' for x in loads)}, on "
        f"{os.cpu_count()} cores. A scrape as Prometheus asks (OpenMetrics, gzip); GET /ping at "
        f"{rate:.0f}/s for {seconds:.0f} s, scraped every {every:.0f} s.",
        "",
        "| served by | series | bytes (gzip) | scrape CPU ms | longest loop stall ms "
        "| GET p50 ms | GET p99 ms | p99, each round | scrape ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "unscraped": "nothing (not scraped)",
        "before": f"`router()` at {before}: every job's series",
        "router": "`router()`, default `per_job_limit`: summed",
    }
    for variant in MANY:
        r = runs[variant]
        p50 = statistics.median(statistics.median(x["latencies"]) for x in r)
        p99 = statistics.median(_p99(x["latencies"]) for x in r)
        each = ", ".join(f"{_p99(x['latencies']):.1f}" for x in r)
        scraped = [statistics.median(x["scrape_ms"]) for x in r if x["scrape_ms"]]
        scrape = f"{statistics.median(scraped):,.0f}" if scraped else ""
        cost = ""
        if variant in costs:
            c = costs[variant]
            med = {k: statistics.median(x[k] for x in c) for k in c[0] if k != "variant"}
            cost = (
                f"{med['series_per_job'] * jobs:,.0f} | {med['bytes']:,.0f} "
                f"({med['gzip_bytes']:,.0f}) | {med['cpu_us_per_job'] * jobs / 1000:,.0f} "
                f"| {med['stall_ms']:.1f}"
            )
        else:
            cost = " | | |"
        lost = sum(len(x.get("timed_out", ())) for x in r)
        if lost:
            scrape += f" ({lost} requests failed or timed out at 60 s)"
        lines.append(f"| {names[variant]} | {cost} | {p50:.2f} | {p99:.2f} | {each} | {scrape} |")
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        port, rate, seconds, every = (int(sys.argv[2]), *map(float, sys.argv[3:6]))
        print(json.dumps(asyncio.run(client(port, rate, seconds, every, sys.argv[6]))))
    elif sys.argv[1:2] == ["many"]:

        def option(flag: str, default: str) -> str:
            return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default

        print(
            "\n".join(
                many(
                    int(option("--jobs", "100000")),
                    int(option("--rounds", "2")),
                    option("--before", "1fd2da2"),
                )
            )
        )
    elif sys.argv[1:2] == ["cost"]:
        print(json.dumps(asyncio.run(_cost(int(sys.argv[2]), sys.argv[3], 5))))
    else:
        before = sys.argv[sys.argv.index("--before") + 1] if "--before" in sys.argv else "e1bb881"
        print("\n".join(report(quick="quick" in sys.argv, before=before)))
