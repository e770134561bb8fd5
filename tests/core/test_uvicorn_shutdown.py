"""Shutdown in a real uvicorn process: SIGTERM while a job is mid-run."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from ..support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
# uvicorn re-raises the captured SIGTERM once it has shut down gracefully.
GRACEFUL = (0, -signal.SIGTERM)


def events(db: Path) -> list[tuple[str, str, float]]:
    try:
        # closing(): a sqlite3 connection's own `with` commits but does not close
        # it, and Python 3.13 warns of each one left to the collector.
        with closing(sqlite3.connect(db, timeout=10)) as conn:
            return list(conn.execute("SELECT job, event, at FROM events ORDER BY rowid"))
    except sqlite3.OperationalError:  # no table yet
        return []


@contextmanager
def uvicorn_app(db: Path, **env: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.apps.shutdown_app:app", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "JOBS_TEST_DB": str(db), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


def test_sigterm_waits_for_the_run_in_flight_and_starts_nothing_new(tmp_path: Path) -> None:
    """SIGTERM mid-run: the run finishes and writes its row; no run starts after shutdown begins."""
    db = tmp_path / "events.sqlite3"
    with uvicorn_app(db, SLOW_RUN_SECONDS="2") as proc:
        wait_until(lambda: any(e[:2] == ("slow", "start") for e in events(db)))
        time.sleep(0.3)  # let the ticker run a few times alongside
        proc.send_signal(signal.SIGTERM)
        signalled = time.time()
        assert proc.wait(timeout=30) in GRACEFUL
        assert proc.stdout is not None
        output = proc.stdout.read()

    assert "Application shutdown complete" in output
    rows = events(db)
    [shutdown_at] = [at for job, event, at in rows if (job, event) == ("app", "shutdown")]
    slow_rows = [(e, at) for job, e, at in rows if job == "slow"]
    assert [e for e, _ in slow_rows] == ["start", "end"], output
    assert slow_rows[0][1] < signalled < slow_rows[1][1]  # it was mid-run at the signal
    ticker_starts = [at for job, e, at in rows if job == "ticker"]
    assert len(ticker_starts) >= 3  # the ticker ran while the app served
    # Nothing started once the lifespan began shutting down, though the slow
    # run went on for more than a second and the ticker is due every 50 ms.
    assert [at for at in ticker_starts if at > shutdown_at] == []
    assert slow_rows[1][1] - shutdown_at > 0.5
    assert "waiting up to 30s for runs in flight: slow" in output


def test_sigterm_cuts_a_run_past_the_shutdown_timeout_and_names_it(tmp_path: Path) -> None:
    """With a short shutdown_timeout, the long run is cancelled and the log names it."""
    db = tmp_path / "events.sqlite3"
    with uvicorn_app(db, SLOW_RUN_SECONDS="600", SHUTDOWN_TIMEOUT="0.5") as proc:
        wait_until(lambda: any(e[:2] == ("slow", "start") for e in events(db)))
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=30) in GRACEFUL
        took = time.monotonic() - started
        assert proc.stdout is not None
        output = proc.stdout.read()
    assert took < 15  # not the 600 s of the run
    assert [e for job, e, _ in events(db) if job == "slow"] == ["start"]
    assert "job 'slow' was still running at the shutdown deadline (0.5s): cancelling it" in output


# SIGTERM's run is long: a shutdown slowed by a loaded machine still ends before it.
@pytest.mark.parametrize(
    ("stop", "seconds", "finished"), [(signal.SIGINT, "3", True), (signal.SIGTERM, "60", False)]
)
def test_a_sync_run_past_the_shutdown_timeout_ends_as_the_docs_table_says(
    tmp_path: Path, stop: signal.Signals, seconds: str, finished: bool
) -> None:
    """A sync job's thread still running at the deadline is named; on SIGINT the
    process waits for it to return, on SIGTERM uvicorn's re-raised signal ends
    the process and the thread with it (docs/guides/jobs.md, Shutdown)."""
    db = tmp_path / "events.sqlite3"
    env = {"SYNC_RUN_SECONDS": seconds, "SLOW_RUN_SECONDS": "0.1", "SHUTDOWN_TIMEOUT": "0.5"}
    with uvicorn_app(db, **env) as proc:
        wait_until(lambda: any(e[:2] == ("sync", "start") for e in events(db)))
        proc.send_signal(stop)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        output = proc.stdout.read()
    assert "the thread(s) of job(s) 'sync' are still running" in output
    assert [e for job, e, _ in events(db) if job == "sync"] == (
        ["start", "end"] if finished else ["start"]
    )


def test_uvicorn_workers_without_a_store_warn_once_per_worker(tmp_path: Path) -> None:
    """`--workers 2` and no store: each worker logs one warning naming the jobs that will
    run in every process."""
    db = tmp_path / "events.sqlite3"
    command = [sys.executable, "-m", "uvicorn", "tests.apps.shutdown_app:app"]
    proc = subprocess.Popen(
        [*command, "--port", "0", "--workers", "2"],
        cwd=ROOT,
        env={**os.environ, "JOBS_TEST_DB": str(db), "SLOW_RUN_SECONDS": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: sum(1 for e in events(db) if e[0] == "slow") >= 4)
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    warnings = [line for line in output.splitlines() if "several processes" in line]
    assert len(warnings) == 2
    assert all("these jobs on every tick: slow, ticker." in w for w in warnings)
