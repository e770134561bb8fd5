"""The example app, on a real SQLite file: its jobs do what they say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from example_app import main

from ..conftest import serve
from ..support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


TOKEN = "t0ken-for-tests"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "example.sqlite3"
    monkeypatch.setattr(main, "DATABASE_URL", f"sqlite+aiosqlite:///{path}")
    monkeypatch.setattr(main, "JOBS_TOKEN", TOKEN)
    return path


async def test_job_status_is_for_admins_only(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/jobs answers 401 without the token or with a wrong one, 200 with it, and 503
    (saying to set JOBS_TOKEN) when the app has none; the app's own routes stay open."""
    async with serve(main.app) as client:
        assert (await client.get("/jobs")).status_code == 401
        wrong = await client.get("/jobs/send_digest", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert (await client.get("/jobs/instances")).status_code == 401
        assert (await client.get("/jobs", headers=ADMIN)).status_code == 200
        assert (await client.get("/sessions")).status_code == 200
        monkeypatch.setattr(main, "JOBS_TOKEN", "")
        unset = await client.get("/jobs", headers={"Authorization": "Bearer "})
    assert unset.status_code == 503 and "JOBS_TOKEN" in unset.json()["detail"]


async def test_expire_sessions_deletes_only_expired_sessions(database: Path) -> None:
    """Sessions made over HTTP and one already expired: the job deletes only that one."""
    async with serve(main.app) as client:
        new = await client.post("/sessions", json={"user": "bea", "ttl_seconds": 3600})
        assert new.status_code == 201
        engine = create_async_engine(main.DATABASE_URL)
        async with engine.begin() as conn:
            past = main.utcnow() - timedelta(minutes=5)
            await conn.execute(
                main.sessions.insert().values(id="x", user="ana", created_at=past, expires_at=past)
            )
        await engine.dispose()
        assert len((await client.get("/sessions")).json()) == 2
        result = await main.scheduler.run_now("expire_sessions")
        assert result.ok, result.error
        users = [s["user"] for s in (await client.get("/sessions")).json()]
    assert users == ["bea"]


async def test_digest_writes_a_row_and_refresh_rates_fails_now_and_then(database: Path) -> None:
    """The digest records the active sessions; the flaky job shows a failure on /jobs."""
    async with serve(main.app) as client:
        await client.post("/sessions", json={"user": "ana"})
        assert (await main.scheduler.run_now("send_digest")).ok
        outcomes = [(await main.scheduler.run_now("refresh_rates")).outcome for _ in range(3)]
        status = (await client.get("/jobs/refresh_rates", headers=ADMIN)).json()
        digest = await main.scheduler.run_now("send_digest")
    assert digest.ok
    assert "failed" in outcomes
    assert status["last_error"]["type"] == "ConnectionError"
    assert status["failures"] >= 1
    engine = create_async_engine(main.DATABASE_URL)
    async with engine.connect() as conn:
        counts = (await conn.execute(select(main.digests.c.active_sessions))).scalars().all()
    await engine.dispose()
    assert counts == [1, 1]


async def test_operators_trigger_and_pause_jobs_with_the_token_only(database: Path) -> None:
    async with serve(main.app) as client:
        refused = await client.post("/jobs/send_digest/run")
        assert refused.status_code == 401
        ran = await client.post("/jobs/send_digest/run?wait=true", headers=ADMIN)
        assert ran.status_code == 200 and ran.json()["outcome"] == "ok"
        history = (await client.get("/jobs/send_digest/runs", headers=ADMIN)).json()
        assert [(r["manual"], r["outcome"]) for r in history] == [(True, "ok")]
        paused = await client.post("/jobs/expire_sessions/pause", headers=ADMIN)
        assert paused.json() == {
            "job": "expire_sessions",
            "paused": True,
            "until": None,
            "scope": "cluster",
        }
        assert (await client.get("/jobs/expire_sessions", headers=ADMIN)).json()["paused"]
        await client.post("/jobs/expire_sessions/resume", headers=ADMIN)
        status = (await client.get("/jobs/expire_sessions", headers=ADMIN)).json()
    assert status["paused"] is False


async def test_operators_make_a_reminder_schedule_that_runs_and_is_back_after_a_restart(
    database: Path,
) -> None:
    """The example's task `remind`: a schedule made through the control router runs as
    a job (a run by hand here), and a second start of the app has it again."""
    body = {
        "name": "remind-ana",
        "task": "remind",
        "schedule": {"every": 3600},
        "kwargs": {"user": "ana", "text": "stand up"},
    }
    async with serve(main.app) as client:
        assert (await client.post("/jobs/schedules", json=body)).status_code == 401
        made = await client.post("/jobs/schedules", json=body, headers=ADMIN)
        assert made.status_code == 201, made.text
        ran = await client.post("/jobs/remind-ana/run?wait=true", headers=ADMIN)
        assert ran.status_code == 200 and ran.json()["outcome"] == "ok"
    async with serve(main.app) as client:
        listed = (await client.get("/jobs/schedules", headers=ADMIN)).json()
        job = (await client.get("/jobs/remind-ana", headers=ADMIN)).json()
    assert [(s["name"], s["kwargs"], s["known"]) for s in listed] == [
        ("remind-ana", {"user": "ana", "text": "stand up"}, True)
    ]
    assert job["task"] == "remind" and job["schedule"] == "every 1h"


async def test_the_status_page_takes_the_token_as_a_password_and_metrics_are_served(
    database: Path,
) -> None:
    """A browser gets a Basic challenge for /jobs/ui (the token is the password); the
    page's buttons post with it; Prometheus reads the jobs' figures at /metrics with
    the same token, and nobody reads them without it."""
    async with serve(main.app) as client:
        challenge = await client.get("/jobs/ui")
        assert challenge.status_code == 401
        assert challenge.headers["www-authenticate"].startswith("Basic")
        login = httpx.BasicAuth("admin", TOKEN)
        page = await client.get("/jobs/ui", auth=login)
        assert page.status_code == 200 and "refresh_rates" in page.text
        assert 'action="/jobs/send_digest/run"' in page.text
        wrong = await client.get("/jobs/ui", auth=httpx.BasicAuth("admin", "nope"))
        assert wrong.status_code == 401
        pressed = await client.post(
            "/jobs/send_digest/pause",
            auth=login,
            headers={"Accept": "text/html", "Sec-Fetch-Site": "same-origin"},
        )
        assert pressed.status_code == 303
        assert (await client.get("/jobs/send_digest", headers=ADMIN)).json()["paused"]
        refused = await client.get("/metrics")
        metrics = await client.get("/metrics", headers=ADMIN)  # Prometheus's authorization:
        by_password = await client.get("/metrics", auth=login)  # or its basic_auth
    # The figures name the jobs and say what fails, as /jobs does: behind its auth.
    assert refused.status_code == 401 and "fastapi_jobs" not in refused.text
    assert by_password.status_code == 200
    assert metrics.status_code == 200  # at /metrics itself, not a redirect to /metrics/
    scraped = metrics.text
    assert 'fastapi_jobs_interval_seconds{job_name="expire_sessions"} 60.0' in scraped
    assert 'fastapi_jobs_paused{job_name="send_digest"} 1.0' in scraped


def test_python_m_example_app_serves_the_jobs_page(tmp_path: Path) -> None:
    """`python -m example_app` serves the app, jobs at /jobs."""
    port = str(free_port())  # a fixed one is another run's, on a shared machine
    proc = subprocess.Popen(
        [sys.executable, "-m", "example_app"],
        cwd=tmp_path,  # the default SQLite file lands in the working directory
        env={**os.environ, "PORT": port, "PYTHONPATH": str(ROOT), "JOBS_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                jobs = get_json(f"http://127.0.0.1:{port}/jobs")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # By name, as GET /jobs lists them.
    assert [j["name"] for j in jobs] == ["expire_sessions", "refresh_rates", "send_digest"]
    assert (tmp_path / "example_app.sqlite3").exists()


def test_example_app_with_four_workers_shares_one_sqlite_store(tmp_path: Path) -> None:
    """`uvicorn example_app.main:app --workers 4`: the workers register in the shared
    SQLite store, claimed jobs say so, and nobody warns of duplicate runs."""
    port = str(free_port())
    log = tmp_path / "uvicorn.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "example_app.main:app",
                "--port",
                port,
                "--workers",
                "4",
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), "JOBS_TOKEN": TOKEN},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            instances: list[dict[str, object]] = []
            while len(instances) < 4:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"workers did not all register:\n{log.read_text()}")
                time.sleep(0.2)
                try:
                    instances = get_json(f"http://127.0.0.1:{port}/jobs/instances")
                except OSError:
                    continue
            jobs = {j["name"]: j for j in get_json(f"http://127.0.0.1:{port}/jobs")}
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert len({i["pid"] for i in instances}) == 4
    assert jobs["expire_sessions"]["claims"] is True
    assert jobs["send_digest"]["claims"] is True
    assert jobs["refresh_rates"]["claims"] is False  # every_instance: a per-process cache
    assert "several processes" not in log.read_text()


def get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers=ADMIN)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)
