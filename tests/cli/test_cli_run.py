"""``fastapi-jobs run`` as an operator and Kubernetes use it: paused jobs are not
run without --force, SIGTERM and SIGINT get the app's own shutdown, and retries
end before the job's next tick. Real processes on a real SQLite store, as the
other multi-process tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import sqlalchemy as sa

from fastapi_jobs._cli.main import main

from ..apps import cli_app
from ..conftest import pause_in_store
from ..support.cluster import ROOT, rows, sync_url
from ..support.postgres import PostgresServer
from ..support.waiting import wait_until

RARE = 864_000  # 10 days: no scheduled tick comes during a test
TARGET = "tests.apps.cluster_app:app"


def environment(url: str, **env: object) -> dict[str, str]:
    # The store's timeout wide: a claim that passes it on a loaded machine is no
    # run at all, and these tests are about what happens to a run.
    base = {"DATABASE_URL": url, "JOBS": "1", "INTERVAL": str(RARE), "TIMEOUT": "5"}
    return {**os.environ, **base, **{k: str(v) for k, v in env.items()}}


def started_runs(url: str) -> list[tuple[object, ...]]:
    """The app's own record of the runs; none before its lifespan made the table."""
    try:
        return rows(url, "SELECT * FROM runs")
    except sa.exc.OperationalError:
        return []


def cli(url: str, *args: str, **env: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastapi_jobs", *args],
        cwd=ROOT,
        env=environment(url, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("paused_by", ["declared", "operator", "operator, every_instance"])
def test_a_paused_job_is_not_run_without_force(tmp_path: Path, paused_by: str) -> None:
    """Declared paused=True, paused by an operator (a row in the store), or the
    pause of an every_instance job: exit 3, said at INFO, and nothing runs;
    --force runs it."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.sqlite3'}"
    env: dict[str, object] = {"PAUSED": int(paused_by == "declared")}
    if "every_instance" in paused_by:
        env["EVERY_INSTANCE"] = 1
    if "operator" in paused_by:
        anyio.run(pause_in_store, url, "job0")
    paused = cli(url, "run", TARGET, "job0", **env)
    assert paused.returncode == 3, paused.stderr
    [said] = [line for line in paused.stderr.splitlines() if "not run" in line]
    assert " INFO " in said and "paused" in said
    assert rows(url, "SELECT * FROM runs") == []
    forced = cli(url, "run", TARGET, "job0", "--force", **env)
    assert forced.returncode == 0, forced.stderr
    assert len(rows(url, "SELECT * FROM runs")) == 1


def test_without_a_store_a_declared_pause_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    """No store: the declared pause is the only one, and it holds."""
    cli_app.ran.clear()
    assert main(["run", "tests.apps.cli_app:scheduler", "waiting"]) == 3
    assert main(["run", "tests.apps.cli_app:scheduler", "ready"]) == 0
    assert main(["run", "tests.apps.cli_app:scheduler", "waiting", "--force"]) == 0
    assert cli_app.ran == ["ready", "waiting"]


@pytest.mark.parametrize(
    ("sig", "run_seconds", "shutdown_timeout", "code", "outcome"),
    [
        (signal.SIGTERM, 30, 1, 143, "cancelled"),  # cut at the deadline
        (signal.SIGINT, 1.5, 20, 0, "ok"),  # ends within it
    ],
)
def test_a_signal_gets_the_apps_shutdown(
    tmp_path: Path,
    sig: signal.Signals,
    run_seconds: float,
    shutdown_timeout: float,
    code: int,
    outcome: str,
) -> None:
    """SIGTERM (Kubernetes stopping a CronJob's pod) or SIGINT mid-run: the run gets
    shutdown_timeout to end, then is cut; it is recorded and released, the
    instance's row is removed, and the exit code says what happened (128 + the
    signal when the run was cut)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.sqlite3'}"
    env = environment(url, RUN_SECONDS=run_seconds, SHUTDOWN_TIMEOUT=shutdown_timeout)
    process = subprocess.Popen(
        [sys.executable, "-m", "fastapi_jobs", "run", TARGET, "job0"],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: bool(started_runs(url)), timeout=30)
        process.send_signal(sig)
        assert process.wait(timeout=30) == code
    finally:
        process.kill()
        stderr = process.communicate()[1]
    assert f"{sig.name}: stopping" in stderr
    history = rows(url, "SELECT outcome, manual FROM fastapi_jobs_runs WHERE job = 'job0'")
    assert history == [(outcome, 1)]
    assert rows(url, "SELECT lease_until FROM fastapi_jobs_claims") == [(None,)]  # released
    assert rows(url, "SELECT * FROM fastapi_jobs_instances") == []


def test_a_signal_while_the_apps_startup_hangs_stops_the_cli(tmp_path: Path) -> None:
    """The app's lifespan is stuck in its startup (a database that never answers):
    SIGTERM stops the CLI there, with the signal's exit code, and nothing runs."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.sqlite3'}"
    stuck = tmp_path / "stuck"
    process = subprocess.Popen(
        [sys.executable, "-m", "fastapi_jobs", "run", TARGET, "job0"],
        cwd=ROOT,
        env=environment(url, STARTUP_SECONDS=600, STARTUP_MARK=stuck),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Signalled once stuck: cut while its engine returns a connection,
        # SQLAlchemy's aiosqlite close can hang the loop's own shutdown.
        wait_until(stuck.exists, timeout=30)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        process.kill()
        stderr = process.communicate()[1]
    assert "SIGTERM: stopping" in stderr
    assert "did not run to its end: stopped by a signal" in stderr
    assert started_runs(url) == []


def test_the_clis_retries_end_before_the_jobs_next_tick(tmp_path: Path) -> None:
    """Nothing ticks in the CLI, and its retries are bounded by the job's next tick
    all the same: 50 retries of a job every 2 s end within its current period."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.sqlite3'}"
    failing = cli(url, "run", TARGET, "job0", INTERVAL=2, FAIL=1, RETRIES=50)
    assert failing.returncode == 1, failing.stderr
    [(tick, attempts, finished)] = rows(
        url, "SELECT tick, attempts, finished_at FROM fastapi_jobs_runs WHERE job = 'job0'"
    )
    assert 1 <= attempts < 50  # one when the first attempt ends too late for a second
    assert finished < tick + 2 + 0.5  # cut before the next tick (late by the loop's lag)
    assert "dropped: it would not end before the job's next tick" in failing.stderr


def test_an_every_instance_job_whose_pauses_cannot_be_read_is_not_run(
    postgres: PostgresServer,
) -> None:
    """The store's pauses table is locked while the CLI starts: it cannot tell
    whether the every_instance job is paused (no claim would), so it does not run
    it (exit 1, saying why) and stops within the store's timeout, not the lock's."""
    url = postgres.url(postgres.create_database())
    anyio.run(pause_in_store, url, "job0")  # the tables, and a pause to be missed
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("LOCK TABLE fastapi_jobs_pauses IN ACCESS EXCLUSIVE MODE"))
            blind = cli(url, "run", TARGET, "job0", EVERY_INSTANCE=1, TIMEOUT=1)
            still_locked = conn.in_transaction()
            conn.rollback()
    finally:
        engine.dispose()
    assert still_locked
    assert blind.returncode == 1, blind.stderr
    assert "pauses of job 'job0' could not be read" in blind.stderr
    assert rows(url, "SELECT * FROM runs") == []
