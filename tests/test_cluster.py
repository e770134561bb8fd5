"""Several real app processes (uvicorn) sharing one real database.

Real time, with intervals of a fraction of a second: processes cannot share a
virtual clock, and leases are decided by the database's clock anyway.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from .apps.race import race
from .cluster import App, rows, start
from .postgres import PostgresServer, wait_until


@pytest.fixture(params=["postgresql", "sqlite"])
def cluster_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'cluster.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.url(server.create_database())


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    return postgres.url(postgres.create_database())


@pytest.fixture
def apps() -> Iterator[list[App]]:
    """Every process a test starts; all killed at the end, whatever happened."""
    started: list[App] = []
    yield started
    for app in started:
        app.stop()


def runs(url: str) -> list[tuple[str, float, int, str, int, float, float | None]]:
    return rows(url, "SELECT job, tick, fence, instance, pid, started, finished FROM runs")  # type: ignore[return-value]


def assert_one_run_per_tick(url: str) -> list[tuple[str, float, int, str, int, float, float | None]]:
    all_runs = runs(url)
    per_tick = Counter((job, tick) for job, tick, *_ in all_runs)
    twice = {key: n for key, n in per_tick.items() if n > 1}
    assert not twice, f"ticks run more than once: {twice}"
    for job in {r[0] for r in all_runs}:
        fences = sorted(r[2] for r in all_runs if r[0] == job)
        assert fences == list(range(fences[0], fences[0] + len(fences))), "a claim without a run"
    return all_runs


def test_many_jobs_across_three_processes_run_each_tick_once(
    cluster_url: str, apps: list[App]
) -> None:
    """5 jobs at 250 ms in 3 processes started at different moments: one run per (job, tick),
    and no tick between the first and the last is left out."""
    for _ in range(3):
        apps.append(App(cluster_url, JOBS=5, INTERVAL=0.25, TIMEOUT=2))
        time.sleep(0.4)
    for app in apps:
        app.wait_started()
    time.sleep(3)
    for app in apps:
        app.terminate()
    all_runs = assert_one_run_per_tick(cluster_url)
    for job in (f"job{n}" for n in range(5)):
        ticks = sorted(tick for j, tick, *_ in all_runs if j == job)
        assert len(ticks) >= 8
        gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False) if b - a > 0.26]
        assert not gaps, f"{job}: ticks left out: {gaps}"
    assert len({r[3] for r in all_runs}) >= 2  # the work was shared


@pytest.mark.parametrize(
    ("backend", "rounds"), [("asyncpg", 1000), ("psycopg", 300), ("sqlite", 300)]
)
def test_eight_processes_race_for_each_tick_and_one_wins(
    backend: str, rounds: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """8 processes claim the same tick at once, round after round: exactly one winner
    each time, and the fence grows by one per win."""
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'race.sqlite3'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        url = server.url(server.create_database(), driver=backend)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(8)
    outs = [tmp_path / f"won{i}.json" for i in range(8)]
    workers = [ctx.Process(target=race, args=(url, rounds, barrier, str(out))) for out in outs]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=240)
        assert worker.exitcode == 0
    wins = sorted(tuple(w) for out in outs for w in json.loads(out.read_text()))
    assert [tick for tick, _ in wins] == list(range(1, rounds + 1))  # one winner per tick
    assert [fence for _, fence in wins] == list(range(1, rounds + 1))  # fences strictly grow
