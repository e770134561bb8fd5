"""Real app processes (uvicorn) sharing one database, for the multi-instance tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent


def sync_url(url: str) -> str:
    """The same database through a sync driver, for the test's own reads."""
    return url.replace("+aiosqlite", "").replace("postgresql+asyncpg", "postgresql+psycopg")


class App:
    """One uvicorn process running tests/apps/cluster_app.py."""

    def __init__(self, url: str, **env: object) -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            mode="w+", prefix="cluster_app_", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.apps.cluster_app:app", "--port", "0"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url, **{k: str(v) for k, v in env.items()}},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def wait_started(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while "Application startup complete" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"app did not start:\n{self.output()}")
            time.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 30) -> None:
        """Graceful stop (SIGTERM), waiting for the process to end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def start(url: str, count: int, **env: object) -> list[App]:
    apps = [App(url, **env) for _ in range(count)]
    try:
        for app in apps:
            app.wait_started()
    except BaseException:
        for app in apps:  # nobody else holds them yet: do not leak processes or logs
            app.stop()
        raise
    return apps


def rows(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(sync_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()
