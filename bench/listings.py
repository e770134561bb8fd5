"""The listings at 100,000 stored schedules (issue 34): how long ``/jobs/ui``,
``GET /jobs``, ``GET /jobs/schedules`` and a job's runs take to answer, a page
at a time, searched and filtered. ``python -m bench.listings`` prints the
Markdown section; ``--quick`` runs a tiny N for the smoke test.

The store is a SQLite file that holds N schedules of one task and a claim row
for each (as once every job has run: the claims are what the page reads of the
store), one job in a hundred's last run failed. One app process serves it, its
scheduler started without ticking (no run competes with the requests); each
request goes through the app over ASGI (httpx's transport: no socket), and the
median of ``--repeat`` answers is reported, after one answer that warms up.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ASKED = [
    ("the page", "/jobs/ui"),
    ("the page, searched", "/jobs/ui?q=s0999"),
    ("the page, failing", "/jobs/ui?state=failing"),
    ("the page, paused", "/jobs/ui?state=paused"),
    ("the page, 2nd page", "NEXT:/jobs/ui"),
    ("GET /jobs (100)", "/jobs"),
    ("GET /jobs?state=failing", "/jobs?state=failing"),
    ("GET /jobs/{name}", "/jobs/s000001"),
    ("GET /jobs/{name}/runs", "/jobs/s000001/runs"),
    ("GET /jobs/instances", "/jobs/instances"),
    ("GET /jobs/schedules (100)", "/jobs/schedules"),
    ("GET /jobs?limit=all", "/jobs?limit=all"),
]


def write(path: Path, n: int) -> None:
    """N schedules of the task ``report``, and a claim row each (every 97th
    one's run failed), straight into the store's tables."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import Every
    from fastapi_jobs._dynamic.stored import encode
    from fastapi_jobs.stores import SQLAlchemyStore

    async def tables() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
        async with engine.begin() as conn:
            await conn.run_sync(SQLAlchemyStore(engine).tables.metadata.create_all)
        await engine.dispose()

    asyncio.run(tables())
    now = time.time()
    spec = encode(Every(hours=24), {}, {})
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO fastapi_jobs_schedules (name, task, spec, version, updated_at, removed) "
        "VALUES (?, 'report', ?, ?, ?, 0)",
        [(f"s{i:06d}", spec, i + 1, now) for i in range(n)],
    )
    db.executemany(
        "INSERT INTO fastapi_jobs_claims (job, last_tick, fence, owner, lease_until, "
        "started_at, finished_at, duration, outcome, error) VALUES (?, ?, 1, 'bench:1:0', "
        "NULL, ?, ?, 0.01, ?, ?)",
        [
            (
                f"s{i:06d}",
                now - 60,
                now - 60,
                now - 59,
                "failed" if i % 97 == 0 else "ok",
                "ValueError: no" if i % 97 == 0 else None,
            )
            for i in range(n)
        ],
    )
    db.commit()
    db.close()


async def measure(path: Path, repeat: int) -> dict[str, Any]:
    import httpx
    from fastapi import FastAPI
    from sqlalchemy.ext.asyncio import create_async_engine

    from fastapi_jobs import Scheduler
    from fastapi_jobs.stores import SQLAlchemyStore

    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")
    scheduler = Scheduler(store=SQLAlchemyStore(engine))

    @scheduler.task()
    async def report() -> None: ...

    app = FastAPI()
    app.include_router(scheduler.router)
    out: dict[str, Any] = {"rows": []}
    started = time.perf_counter()
    async with scheduler.running({"db": engine}, ticking=False):
        out["start_s"] = time.perf_counter() - started
        out["jobs"] = len(scheduler.jobs)
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            for said, url in ASKED:
                if url.startswith("NEXT:"):
                    first = await client.get(url[5:])
                    url = first.text.split('rel="next"')[0].rpartition('<a href="')[2]
                    url = url.split('"')[0].replace("&amp;", "&")
                answer = await client.get(url)  # warms up
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    answer = await client.get(url, headers={"Accept": "text/html"})
                    times.append(time.perf_counter() - t0)
                assert answer.status_code == 200, (url, answer.status_code)
                out["rows"].append(
                    (said, statistics.median(times) * 1000, len(answer.content), answer)
                )
    await engine.dispose()
    return out


def report(n: int, repeat: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "listings.sqlite3"
        t0 = time.perf_counter()
        write(path, n)
        wrote = time.perf_counter() - t0
        got = asyncio.run(measure(path, repeat))
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [
        f"### Listings at {n:,} stored schedules",
        "",
        f"{n:,} schedules and a claim row each in a SQLite file (written in {wrote:.1f} s); "
        f"one process, started in {got['start_s']:.1f} s ({got['jobs']:,} jobs), its "
        f"scheduler not ticking; each request over ASGI, the median of {repeat}.",
        "",
        "| request | answer | body | X-Total-Count |",
        "|---|---|---|---|",
    ]
    for said, ms, size, answer in got["rows"]:
        total = answer.headers.get("x-total-count", "—")
        lines.append(f"| {said} | {ms:.0f} ms | {size / 1024:.0f} KiB | {total} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.listings")
    parser.add_argument("-n", type=int, default=100_000, help="stored schedules")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a tiny N, once: the smoke test")
    args = parser.parse_args()
    n, repeat = (300, 1) if args.quick else (args.n, args.repeat)
    sys.stdout.write(report(n, repeat))


if __name__ == "__main__":
    main()
