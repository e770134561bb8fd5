"""``fastapi-jobs backfill`` in real processes on a real SQLite store: a line
per tick, the summary, exit codes 0/1/2, a tick that ran already skipped the
second time, SIGTERM after the run in flight; and a backfill against a running
cluster (three uvicorn instances on PostgreSQL): every tick of the range once
in the history, whether the live instances or the two backfills ran it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ..support.cluster import ROOT, App, rows, start
from ..support.postgres import PostgresServer
from ..support.waiting import wait_until

TARGET = "tests.apps.cluster_app:app"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def command(url: str, *args: str, **env: object) -> list[str]:
    return [sys.executable, "-m", "fastapi_jobs", "backfill", TARGET, *args]


def environment(url: str, **env: object) -> dict[str, str]:
    base = {"DATABASE_URL": url, "JOBS": "1", "INTERVAL": "60", "TIMEOUT": "5"}
    return {**os.environ, **base, **{k: str(v) for k, v in env.items()}}


def backfill(url: str, *args: str, **env: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(url, *args),
        cwd=ROOT,
        env=environment(url, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def last_minutes(n: int) -> tuple[str, str, list[float]]:
    """A range of ``n`` whole minutes ending at the last minute passed."""
    end = float(int(time.time() // 60) * 60)
    ticks = [end - 60 * k for k in reversed(range(n))]
    return iso(ticks[0]), iso(end), ticks


def test_the_command_runs_each_tick_once_and_says_how(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    since, until, ticks = last_minutes(3)
    first = backfill(url, "job0", "--since", since, "--until", until)
    assert first.returncode == 0, first.stderr
    lines = [line for line in first.stderr.splitlines() if line.startswith("[")]
    assert [line.split()[:3] for line in lines] == [
        [f"[{k + 1}/3]", iso(tick), "ok"] for k, tick in enumerate(ticks)
    ]
    assert "3 tick(s)" in first.stdout and "3 ran ok, 0 failed, 0 ran already" in first.stdout
    again = backfill(url, "job0", "--since", since, "--until", until)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("ran already") == 3 and "0 ran ok" in again.stdout
    ran = rows(url, "SELECT tick FROM runs ORDER BY tick")
    assert [tick for (tick,) in ran] == ticks
    history = rows(url, "SELECT tick, manual FROM fastapi_jobs_runs ORDER BY tick")
    assert [(tick, bool(manual)) for tick, manual in history] == [(t, True) for t in ticks]


@pytest.mark.slow  # two processes of the app; the README's command keeps the first test
def test_failures_exit_1_and_a_range_in_the_future_exits_2(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    since, until, _ = last_minutes(2)
    failed = backfill(url, "job0", "--since", since, "--until", until, FAIL=1)
    assert failed.returncode == 1, failed.stderr
    assert "failed: ConnectionError: the job's own failure" in failed.stderr
    assert "0 ran ok, 2 failed" in failed.stdout
    future = backfill(url, "job0", "--since", since, "--until", iso(time.time() + 3600))
    assert future.returncode == 2, future.stderr
    assert "the range must be in the past" in future.stderr


@pytest.mark.slow  # a process of the app each, seconds to import on a loaded machine
def test_bad_input_exits_2(tmp_path: Path) -> None:
    """A reversed range and one without a zone are refused by the API itself
    (tests/backfill/test_backfill.py); here, what the command adds."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    since, until, _ = last_minutes(2)
    for args, said in [
        (["job0", "--since", "yesterday", "--until", until], "is not an ISO 8601 instant"),
        (["nope", "--since", since, "--until", until], "no job named 'nope'"),
        (["job0", "--since", since, "--until", until, "--max", "1"], "more than max_ticks=1"),
    ]:
        refused = backfill(url, *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert said in refused.stderr, (args, refused.stderr)


@pytest.mark.slow  # a process of the app and a signal: 10-15 s
def test_sigterm_stops_after_the_run_in_flight(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    since, until, ticks = last_minutes(3)
    proc = subprocess.Popen(
        command(url, "job0", "--since", since, "--until", until),
        cwd=ROOT,
        env=environment(url, RUN_SECONDS=1.5),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _started(url) >= 1, timeout=30)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr
    ran = rows(url, "SELECT tick, finished FROM runs")
    assert len(ran) == 1 and ran[0][0] == ticks[0] and ran[0][1] is not None  # ran to its end
    assert rows(url, "SELECT tick FROM fastapi_jobs_runs") == [(ticks[0],)]


def _started(url: str) -> int:
    try:
        return len(rows(url, "SELECT tick FROM runs"))
    except Exception:  # noqa: BLE001 - before the app made its table
        return 0


@pytest.mark.slow  # three uvicorn instances and two backfills: 18 s
def test_a_backfill_against_a_running_cluster_runs_each_tick_once(
    postgres: PostgresServer, apps: list[App]
) -> None:
    """Three live instances ticking every second, and two backfills of a range
    that began before they started: each tick of it once in the app's own
    record of runs and once in the store's history, with its tick."""
    url = postgres.url(postgres.create_database())
    begun = time.time()
    apps.extend(start(url, 3, INTERVAL=1))
    time.sleep(1.5)
    since, until = float(int(begun) - 5), float(int(time.time()))
    args = ["job0", "--since", iso(since), "--until", iso(until)]
    both = [
        subprocess.Popen(
            command(url, *args),
            cwd=ROOT,
            env=environment(url, INTERVAL=1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=60) for proc in both]
    assert [proc.returncode for proc in both] == [0, 0], outputs
    expected = [since + k for k in range(int(until - since) + 1)]
    ran = Counter(tick for (tick,) in rows(url, "SELECT tick FROM runs"))
    assert {tick: ran[tick] for tick in expected} == dict.fromkeys(expected, 1)
    history = Counter(tick for (tick,) in rows(url, "SELECT tick FROM fastapi_jobs_runs"))
    assert {tick: history[tick] for tick in expected} == dict.fromkeys(expected, 1)
    backfilled = rows(url, "SELECT tick FROM fastapi_jobs_runs WHERE manual")
    assert {since, since + 1} <= {tick for (tick,) in backfilled}  # before the cluster began
