"""Operating jobs across real app processes (uvicorn) sharing one real database:
pauses that hold for every instance and across restarts, triggers that run
once, and the CLI beside a running app.

Real time with short intervals, as in test_cluster: the claims are decided on
the database's clock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from ..conftest import claim1, open_store, release1
from ..support.cluster import ROOT, App, rows, start
from ..support.waiting import wait_until

# An interval no tick of which comes during a test: with 3600 the tests failed
# when they ran across a full hour (a scheduled tick beside the triggers, and a
# new "current tick" between two CLI runs).
RARE = 864_000  # 10 days


def started_runs(url: str) -> list[tuple[float, float]]:
    """(tick, started) of every run of job0, in order."""
    return [
        (tick, started)
        for tick, started in rows(url, "SELECT tick, started FROM runs WHERE job = 'job0'")
    ]


def post(app: App, path: str, **params: str) -> httpx.Response:
    return httpx.post(app.base_url + path, params=params, timeout=10)


@pytest.mark.slow  # 12-23 s of app processes: .ci/run's slow pass
def test_a_pause_on_one_instance_holds_on_every_instance_and_across_restarts(
    cluster_url: str, apps: list[App]
) -> None:
    env = {"JOBS": 1, "INTERVAL": 0.25, "TIMEOUT": 1}
    apps += start(cluster_url, 2, **env)
    wait_until(lambda: len(started_runs(cluster_url)) >= 3, timeout=20)

    answer = post(apps[0], "/jobs/job0/pause")
    paused_at = time.time()
    assert answer.status_code == 200
    assert answer.json() == {"job": "job0", "paused": True, "until": None, "scope": "cluster"}
    time.sleep(1.5)  # six ticks
    # A tick claimed before the pause committed may still start; none after.
    late = [t for t, _ in started_runs(cluster_url) if t > paused_at + 0.25]
    assert late == []
    status = httpx.get(apps[1].base_url + "/jobs/job0").json()  # the other instance
    assert status["paused"] is True and status["skipped"].get("paused", 0) >= 1

    for app in apps:  # every instance restarts
        app.terminate()
    restarted = start(cluster_url, 2, **env)
    apps += restarted
    time.sleep(1.5)
    assert [t for t, _ in started_runs(cluster_url) if t > paused_at + 0.25] == []

    resumed = post(restarted[1], "/jobs/job0/resume")
    resumed_at = time.time()
    assert resumed.json()["paused"] is False
    wait_until(
        lambda: len([t for t, _ in started_runs(cluster_url) if t > resumed_at]) >= 3,
        timeout=10,
    )
    ticks = [t for t, _ in started_runs(cluster_url)]
    assert len(ticks) == len(set(ticks))  # each tick once, before and after


@pytest.mark.slow  # 7-14 s of app processes: .ci/run's slow pass
def test_a_pause_through_a_shared_port_stops_every_worker(tmp_path: Path, apps: list[App]) -> None:
    """uvicorn --workers 3 on a SQLite file: a pause that reaches one worker stops all."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'workers.sqlite3'}"
    app = App(url, workers=3, JOBS=1, INTERVAL=0.25, TIMEOUT=1)
    apps.append(app)
    app.wait_started()
    base = f"http://127.0.0.1:{app.port}"
    wait_until(lambda: len(started_runs(url)) >= 3, timeout=20)
    assert httpx.post(base + "/jobs/job0/pause", timeout=10).json()["scope"] == "cluster"
    paused_at = time.time()
    time.sleep(1.5)
    assert [t for t, _ in started_runs(url) if t > paused_at + 0.25] == []
    httpx.post(base + "/jobs/job0/resume", timeout=10)
    resumed_at = time.time()
    wait_until(lambda: len([t for t, _ in started_runs(url) if t > resumed_at]) >= 3, timeout=10)
    # The workers take turns, though on a loaded machine one may win several
    # ticks in a row: some other worker runs one within a few seconds.
    wait_until(lambda: len(rows(url, "SELECT DISTINCT pid FROM runs")) >= 2, timeout=20)


@pytest.mark.slow  # 7-14 s of app processes: .ci/run's slow pass
def test_two_triggers_on_two_instances_give_one_run_and_one_409(
    cluster_url: str, apps: list[App]
) -> None:
    # Runs of 3 s: the two triggers and the two after them all come while it runs,
    # even when the machine is slow to answer them.
    apps += start(cluster_url, 2, JOBS=1, INTERVAL=RARE, RUN_SECONDS=3, TIMEOUT=1)
    answers: list[httpx.Response] = []
    go = threading.Barrier(2)

    def trigger(app: App) -> None:
        go.wait()
        answers.append(post(app, "/jobs/job0/run"))

    threads = [threading.Thread(target=trigger, args=(app,)) for app in apps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers) == [202, 409]
    refused = next(a for a in answers if a.status_code == 409).json()
    winner = next(a for a in answers if a.status_code == 202).json()
    assert refused["instance"] == winner["instance"]
    assert refused["started_at"] is not None

    # While it runs, a third trigger (on either instance) is refused too.
    assert post(apps[0], "/jobs/job0/run").status_code == 409
    assert post(apps[1], "/jobs/job0/run").status_code == 409

    def finished() -> bool:
        return [f is not None for (f,) in rows(cluster_url, "SELECT finished FROM runs")] == [True]

    def released() -> bool:
        return rows(cluster_url, "SELECT lease_until FROM fastapi_jobs_claims") == [(None,)]

    wait_until(finished, 10)
    wait_until(released, 10)
    again = post(apps[1], "/jobs/job0/run", wait="true")
    assert again.status_code == 200 and again.json()["outcome"] == "ok"
    assert len(rows(cluster_url, "SELECT * FROM runs")) == 2
    history = httpx.get(apps[0].base_url + "/jobs/job0/runs").json()
    assert [r["manual"] for r in history] == [True, True]  # cluster-wide, newest first
    assert [r["fence"] for r in history] == [2, 1]
    assert {r["instance"] for r in history} <= {winner["instance"], again.json()["instance"]}


def test_a_trigger_during_a_scheduled_run_is_409(cluster_url: str, apps: list[App]) -> None:
    # The scheduled run is the startup tick's, and lasts 30 s: the triggers reach
    # both instances while it goes however slow the machine (a run of 1.5 s every
    # 2 s could end, under load, before the second trigger arrived).
    apps += start(
        cluster_url,
        2,
        JOBS=1,
        INTERVAL=RARE,
        RUN_ON_STARTUP=1,
        RUN_SECONDS=30,
        TIMEOUT=1,
        SHUTDOWN_TIMEOUT=1,
    )

    def running() -> bool:
        return any(f is None for (f,) in rows(cluster_url, "SELECT finished FROM runs"))

    wait_until(running, timeout=20)
    for app in apps:
        answer = post(app, "/jobs/job0/run")
        assert answer.status_code == 409, answer.text
        # The other instance's claim of that tick may still await its answer (on
        # SQLite, behind the file's lock, under load: seen once in CI): its 409
        # then says so. Either way the trigger is refused while the run goes.
        detail = answer.json()["detail"]
        assert "is running" in detail or "its tick is being claimed" in detail, detail


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastapi_jobs", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "JOBS": "1", "INTERVAL": str(RARE), "TIMEOUT": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow  # CLI processes beside instances: 17 s on a quiet machine
def test_the_cli_runs_the_current_tick_once_beside_a_running_app(
    cluster_url: str, apps: list[App]
) -> None:
    target = "tests.apps.cluster_app:app"
    first = cli(cluster_url, "run", target, "job0")
    assert first.returncode == 0, first.stderr
    assert "job 'job0': tick " in first.stderr and " ok in " in first.stderr
    # The app starts and would run the current hour's tick: the CLI has it.
    apps += start(cluster_url, 1, JOBS=1, INTERVAL=RARE, RUN_ON_STARTUP=1, TIMEOUT=1)
    time.sleep(1)
    again = cli(cluster_url, "run", target, "job0")
    assert again.returncode == 3, again.stderr
    assert "was claimed already" in again.stderr
    assert len(rows(cluster_url, "SELECT * FROM runs")) == 1  # one run for the tick
    forced = cli(cluster_url, "run", target, "job0", "--force")
    assert forced.returncode == 0, forced.stderr
    assert len(rows(cluster_url, "SELECT * FROM runs")) == 2


@pytest.mark.slow  # seven CLI processes: 17 s on a quiet machine
def test_the_cli_says_what_went_wrong_with_its_exit_code(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.sqlite3'}"
    target = "tests.apps.cluster_app:scheduler"
    unknown = cli(url, "run", target, "nope")
    assert unknown.returncode == 2
    assert "no job named 'nope'; the jobs are: 'job0'" in unknown.stderr
    bad = cli(url, "run", "tests.apps.cluster_app:nothing", "job0")
    assert bad.returncode == 2 and "has no attribute 'nothing'" in bad.stderr
    not_one = cli(url, "run", "tests.apps.cluster_app:ENV", "job0")
    assert not_one.returncode == 2 and "no Scheduler was found" in not_one.stderr
    no_module = cli(url, "list", "no_such_module:app")
    assert no_module.returncode == 2 and "cannot import" in no_module.stderr
    failing = subprocess.run(
        [sys.executable, "-m", "fastapi_jobs", "run", target, "job0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "JOBS": "1", "INTERVAL": "60", "FAIL": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failing.returncode == 1, failing.stderr
    assert "ConnectionError" in failing.stderr
    listing = cli(url, "list", "tests.apps.cluster_app:app")
    assert listing.returncode == 0, listing.stderr
    assert "job0\n  every 10d\n  claimed in the store (one instance per tick); not paused" in (
        listing.stdout
    )
    assert listing.stdout.count("  next: ") == 3


async def test_the_cli_prunes_the_history_at_its_start(cluster_url: str) -> None:
    """`fastapi-jobs run` lives for one run, far less than the ten minutes between
    two prunes of an app instance, and prunes the history at its start as an
    instance does: the runs past the 30 days kept are gone."""
    engine = create_async_engine(cluster_url)
    try:
        async with open_store(engine) as store:
            for n in range(1, 4):
                assert await claim1(store, "old", float(n)) == n
                await release1(store, "old", n, "ok", None, 0.1)
        async with engine.begin() as conn:  # 60 days ago
            await conn.execute(
                sa.text("UPDATE fastapi_jobs_runs SET finished_at = finished_at - 5184000")
            )
        ran = cli(cluster_url, "run", "tests.apps.cluster_app:app", "job0")
        assert ran.returncode == 0, ran.stderr
        async with engine.connect() as conn:
            kept = (await conn.execute(sa.text("SELECT job FROM fastapi_jobs_runs"))).all()
        assert [job for (job,) in kept] == ["job0"]  # the CLI's own run
    finally:
        await engine.dispose()
