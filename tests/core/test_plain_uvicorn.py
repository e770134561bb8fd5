"""What a new user sees under plain `uvicorn app:app`, in a real process: readable
log lines with time, level and pid, and a job's sys.exit that stops nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..support.ports import free_port
from ..support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


def serve_plain(*args: str, **env: str) -> tuple[int, str]:
    """Run tests/apps/plain_app.py under uvicorn, let its jobs go for 1 s, SIGTERM
    it while `slow` runs; the pid and everything it printed."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.apps.plain_app:app", "--port", str(port), *args],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != "WEB_CONCURRENCY"}, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def serving() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1):
                    return True
            except OSError:
                return False

        wait_until(serving, timeout=30)
        time.sleep(1.0)  # `boom` exits five times meanwhile
        assert serving(), "a job's sys.exit() took the server down"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (0, -signal.SIGTERM), output
    return proc.pid, output


def line(level: str, pid: int, logger: str, message: str) -> str:
    return rf"{TIME} {level} +\[{pid}\] {re.escape(logger)}: {message}"


def test_plain_uvicorn_shows_jobs_failures_and_the_shutdown_wait_with_time_and_pid() -> None:
    """One start-up line per job, each failure with its traceback, and the shutdown
    wait, each with time, level and pid; a job's sys.exit() is its failed run."""
    pid, output = serve_plain()
    assert re.search(
        line("INFO", pid, "fastapi_jobs", r"job 'ok': every 0\.2s, next run \S+, in this process"),
        output,
    ), output
    assert re.search(line("INFO", pid, "fastapi_jobs", "job 'slow': every 1h, next run"), output)
    assert re.search(
        line("ERROR", pid, "fastapi_jobs.boom", r"job 'boom' failed after \S+: SystemExit\(2\);"),
        output,
    )
    assert "Traceback (most recent call last)" in output and "sys.exit(2)" in output
    assert re.search(
        line("INFO", pid, "fastapi_jobs", "shutting down: waiting up to 10s for runs in flight"),
        output,
    )
    assert "ran ok" not in output  # each run is a DEBUG line
    assert "Application shutdown complete" in output


def test_uvicorn_log_level_debug_shows_each_run_with_its_duration(tmp_path: Path) -> None:
    """With --log-level debug, each successful run is a line with its duration. With
    the app's own logger (`Scheduler(logger=...)`) and a store, the library's other
    loggers' lines (the store's tables) are shown and formatted too."""
    store = f"sqlite+aiosqlite:///{tmp_path / 'jobs.sqlite3'}"
    pid, output = serve_plain("--log-level", "debug", LOGGER="myapp.jobs", STORE=store)
    assert re.search(
        line("DEBUG", pid, "myapp.jobs.ok", r"job 'ok' ran ok in \d+\.\d{3}s"), output
    ), output
    assert re.search(line("INFO", pid, "fastapi_jobs.stores", "created table"), output), output
